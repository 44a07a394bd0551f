#!/usr/bin/env python
"""Ground truth for `resume`: load checkpoints with megatron-core's own loader at a NEW topology.

    python tools/mcore_load.py --tp 1 --pp 1 --dp 2 --layers 2 --hidden 16 --heads 4 \
        --padded-vocab-size 128 --seq-length 16 \
        --case a=sample_ckpts/torch_dist_fully/iter_0000001:optim \
        --case b=sample_ckpts/mcore_0_13_1/iter_0000001:model --out result.json

Python API:  load_cases(cases, tp, pp, dp, model=dict(...), timeout=600) -> {case_id: Outcome}
with cases = [(case_id, ckpt_dir, load_optim)]; Outcome = {"ok": bool, "error": str | None}.

One gloo process group (world = tp*pp*dp, spawn, CPU; the same CUDA->CPU shims as
tools/_mcore_cpu.py) builds the same dense GPTModel + DistributedDataParallel +
DistributedOptimizer (Adam, fp32) the samples were written with, at the requested topology, and
then, for every case in turn, does what Megatron-LM's training/checkpointing.py
_load_base_checkpoint / load_checkpoint do for a torch_dist checkpoint with the installed
megatron-core (the test extra pins 0.16.1):

  metadata = dist_checkpointing.load_content_metadata(ckpt)  (or, when the save has none, the
             common state's optimizer.param_state_sharding_type, as checkpointing.py falls back)
  model_sd = model.sharded_state_dict(metadata=metadata)
  optim_sd = optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=metadata) (":optim")
  state    = dist_checkpointing.load({"model": model_sd[, "optimizer": optim_sd]}, ckpt)
  model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])

A case is ok when that raised on no rank (all ranks' outcomes are gathered).  Model-only cases
(":model") are the `--no-load-optim` resume.  rng / rerun state are not loaded (Megatron loads
rng only at the saved TP/PP, which `resume` predicts separately).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))


def load_cases(cases, tp: int, pp: int, dp: int, model: dict, timeout: float = 600.0) -> dict:
    """Run every (case_id, ckpt_dir, load_optim) at topology tp x pp x dp; {case_id: outcome}."""
    import tempfile

    if _TOOLS_DIR not in sys.path:
        sys.path.insert(0, _TOOLS_DIR)
    import make_sample_ckpts  # the same spawn/timeout handling as the sample writer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"tp": tp, "pp": pp, "dp": dp, "world": tp * pp * dp, "model": dict(model),
               "cases": [[c, os.path.abspath(d), bool(o)] for c, d, o in cases], "out": tmp,
               "port": make_sample_ckpts._free_port(), "format": "load", "out_dir": tmp}
        harness_error = _spawn_load(cfg, timeout)
        per_rank = []
        for r in range(cfg["world"]):
            path = os.path.join(tmp, f"rank{r}.jsonl")
            lines = open(path).read().splitlines() if os.path.exists(path) else []
            per_rank.append(dict(json.loads(x) for x in lines if x.strip()))
    out = {}
    for case_id, _, _ in cases:
        seen = [rank.get(case_id, "<no result>") for rank in per_rank]
        errors = [e for e in seen if e is not None and e != "<no result>"]
        if errors:  # raised on at least one rank: the load failed (the others may then hang)
            out[case_id] = {"ok": False, "error": errors[0]}
        elif "<no result>" in seen:
            out[case_id] = {"ok": None, "error": f"not run ({harness_error or 'no result'})"}
        else:
            out[case_id] = {"ok": True, "error": None}
    return out


def _spawn_load(cfg: dict, timeout: float, grace: float = 20.0) -> str | None:
    """Run the ranks; None when all finished cleanly, else why they were stopped.  After a case
    failed on some rank, the others may wait in a collective that never completes: once no rank
    has written a result for `grace` seconds after a failure (or one rank exited), all are
    killed."""
    import torch.multiprocessing as tmp

    env = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    backup = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ctx = tmp.start_processes(_entry, args=(cfg,), nprocs=cfg["world"], join=False,
                                  start_method="spawn")
        deadline = time.monotonic() + timeout
        logs = [os.path.join(cfg["out"], f"rank{r}.jsonl") for r in range(cfg["world"])]
        last_size, last_change, why = -1, time.monotonic(), None
        while any(p.is_alive() for p in ctx.processes):
            time.sleep(0.5)
            now = time.monotonic()
            text = "".join(open(x).read() for x in logs if os.path.exists(x))
            if len(text) != last_size:
                last_size, last_change = len(text), now
            # a result line is ["case", null] (ok) or ["case", "Error: ..."] (raised)
            failed = '", "' in text or any(not p.is_alive() for p in ctx.processes)
            if now > deadline:
                why = f"loads exceeded {timeout:.0f}s"
            elif failed and now - last_change > grace:
                why = "ranks stalled after a failed load (desynchronised collectives)"
            if why:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                break
        for p in ctx.processes:
            p.join(5)
        return why
    finally:
        for k, v in backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _entry(rank: int, cfg: dict) -> None:
    sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu

    _mcore_cpu._quiet()
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _mcore_cpu.install_cuda_shims()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), RANK=str(rank),
                      WORLD_SIZE=str(cfg["world"]), LOCAL_RANK=str(rank))
    # a bounded timeout: a load that raises on some ranks only must not hang the others forever
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=cfg["world"], timeout=datetime.timedelta(seconds=120))
    model, optimizer = _build(cfg)
    # Each rank records its own outcome per case (no collective of ours: a load that raises on
    # some ranks only leaves the others inside Megatron's collectives, and the parent stops the
    # run once no rank has made progress for a while after a failure; the cases not reached
    # then have no result).
    with open(os.path.join(cfg["out"], f"rank{rank}.jsonl"), "a") as log:
        for case_id, ckpt, load_optim in cfg["cases"]:
            error = _load_one(model, optimizer, ckpt, load_optim)
            log.write(json.dumps([case_id, error]) + "\n")
            log.flush()
    dist.barrier()
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _load_one(model, optimizer, ckpt: str, load_optim: bool) -> str | None:
    import torch
    from megatron.core import dist_checkpointing

    try:
        metadata = dist_checkpointing.load_content_metadata(ckpt)
        if metadata is None:  # pre-0.13 save: checkpointing.py reads the common state instead
            common = dist_checkpointing.load_common_state_dict(ckpt)
            sharding = (common.get("optimizer") or {}).get("param_state_sharding_type")
            metadata = {"distrib_optim_sharding_type": sharding} if sharding else {}
        model_sd = model.module.sharded_state_dict(metadata=metadata)
        sd = {"model": model_sd}
        if load_optim:
            sd["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True,
                                                           metadata=metadata)
        state = dist_checkpointing.load(sd, ckpt)
        with torch.no_grad():
            model.module.load_state_dict(state["model"])
            if load_optim:
                optimizer.load_state_dict(state["optimizer"])
        return None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the outcome IS the exception (torch's CheckpointException
        # derives from BaseException); recorded per case, compared by the caller
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        return (f"{type(e).__name__}: {str(e)[:400]} "
                f"(at {os.path.basename(where.filename)}:{where.lineno} {where.name})")


def _build(cfg: dict):
    """The samples' model (tools/_mcore_cpu.py _run_megatron) at cfg's topology, no training."""
    import torch
    from megatron.core import parallel_state, tensor_parallel

    import _mcore_cpu

    _mcore_cpu._patch_megatron_rng()
    _mcore_cpu._patch_distopt_step_for_torch_adam()
    if _mcore_cpu.mcore_release() < (0, 16, 0):  # the same CPU care as the writer (torch AdamW's 0-dim `step`)
        _mcore_cpu._patch_distopt_state_without_step()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    m = cfg["model"]
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=cfg["tp"],
                                             pipeline_model_parallel_size=cfg["pp"])
    torch.manual_seed(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(
        num_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
        ffn_hidden_size=4 * m["hidden"], use_cpu_initialization=True,
        tensor_model_parallel_size=cfg["tp"], pipeline_model_parallel_size=cfg["pp"],
        pipeline_dtype=torch.float32, params_dtype=torch.float32, hidden_dropout=0.0,
        attention_dropout=0.0, bias_dropout_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        apply_rope_fusion=False, init_method_std=0.02, sequence_parallel=False,
    )
    gpt = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=m["padded_vocab_size"], max_sequence_length=m["seq_length"],
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False, position_embedding_type="learned_absolute",
    )
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=True,
        check_for_nan_in_grad=False, bucket_size=None,
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=gpt)
    optimizer = get_megatron_optimizer(
        # lr / min_lr are part of Megatron's param-group key (DistributedOptimizer.load_state_dict matches groups by
        # it): they must be the saving run's (--lr / --min-lr; the samples' generator used 1e-3 / 1e-4)
        OptimizerConfig(optimizer="adam", lr=m.get("lr", 1e-3), min_lr=m.get("min_lr", 1e-4), weight_decay=0.1,
                        adam_beta1=0.9,
                        adam_beta2=0.95, clip_grad=1.0, use_distributed_optimizer=True,
                        params_dtype=torch.float32),
        [model],
    )
    # CPU care: without apex/TE (torch AdamW), DistributedOptimizer.state_dict() - which
    # sharded_state_dict(is_loading=True) calls - asserts one shared per-param 'step', i.e. Adam
    # state must exist.  One step on zero gradients creates it (a GPU run's FusedAdam keeps the
    # step in param_groups and needs none of this); the load overwrites every value anyway.
    model.zero_grad_buffer()
    optimizer.zero_grad()
    optimizer.step()
    return model, optimizer


def _record(path: str, res: dict, cases: list, a: argparse.Namespace) -> None:
    """Merge `res` into the record at `path`: which release loaded which sample, and how it went."""
    import platform

    import megatron.core
    import torch

    rec = json.load(open(path)) if os.path.exists(path) else {}
    for cid, ckpt, optim in cases:
        rec[cid] = {"checkpoint": os.path.relpath(os.path.abspath(ckpt)), "load_optim": optim,
                    "megatron_core": megatron.core.__version__, "torch": torch.__version__,
                    "python": platform.python_version(), "topology": {"tp": a.tp, "pp": a.pp, "dp": a.dp},
                    **res[cid]}
    with open(path, "w") as f:
        f.write(json.dumps(dict(sorted(rec.items())), indent=1) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k in ("tp", "pp", "dp"):
        p.add_argument(f"--{k}", type=int, required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--padded-vocab-size", type=int, default=128)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3, help="the saving run's --lr (part of the param-group key)")
    p.add_argument("--min-lr", type=lambda v: None if v.lower() == "none" else float(v), default=1e-4,
                   help="the saving run's --min-lr ('none' when its OptimizerConfig had none, as the 0.19.2 sample's)")
    p.add_argument("--case", action="append", required=True,
                   help="ID=CKPT_DIR:optim|model (repeatable)")
    p.add_argument("--out", help="write the JSON result here (default: stdout)")
    p.add_argument("--record", help="merge the outcomes into this JSON record (e.g. sample_ckpts/own_release_loads.json),"
                   " one entry per case id, with the megatron-core / torch / Python that loaded it")
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args(argv)
    cases = []
    for spec in a.case:
        cid, rest = spec.split("=", 1)
        path, what = rest.rsplit(":", 1)
        cases.append((cid, path, what == "optim"))
    model = {"layers": a.layers, "hidden": a.hidden, "heads": a.heads,
             "padded_vocab_size": a.padded_vocab_size, "seq_length": a.seq_length, "lr": a.lr, "min_lr": a.min_lr}
    res = load_cases(cases, a.tp, a.pp, a.dp, model, a.timeout)
    if a.record:
        _record(a.record, res, cases, a)
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
