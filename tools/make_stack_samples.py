"""Build the training-stack samples under ``sample_ckpts/`` (Bridge, NeMo 2, NVRx local, torchtitan, Megatron FSDP).

Usage (repo root; each needs the libraries named below, see sample_ckpts/README.md):

    python tools/make_stack_samples.py --only torchtitan      # torchtitan 0.3.0 CheckpointManager (tools/_titan_cpu.py)
    python tools/make_stack_samples.py --only nvrx_local      # megatron-core 0.16.1 + NVRx 0.4.1 LocalCheckpointManager
    python tools/make_stack_samples.py --only bridge nemo2    # megatron-core 0.16.1 payload + the stack's outer layout
    python tools/make_stack_samples.py --only megatron_fsdp   # megatron-core 0.16.1 Megatron FSDP (+ einops)
    python tools/make_stack_samples.py --only torchtitan_dataloader  # torch DCP: torchtitan's dataloader Stateful
    python tools/make_stack_samples.py --only bridge_energon  # only bridge/energon/ (Bridge's dataloader sidecars)

`bridge` and `nemo2` cannot run their stack here (Megatron-Bridge imports transformer_engine at module level, NeMo 2
needs Lightning's MegatronStrategy on GPUs), so the payload is a real megatron-core 0.16.1 torch_dist save written by
``tools/make_sample_ckpts.py`` and the files the stack writes around it follow the stack's source:

- Megatron-Bridge 0.3.1 `megatron/bridge/training/checkpointing.py` `save_checkpoint` (the `train_state_finalize_fn`):
  payload (`dist_checkpointing.save`, metadata.json last) → `iter_N/train_state.pt` = `torch.save(TrainState.state_dict())`
  (`training/state.py`: 0-d tensors step, consumed/skipped samples, flops, do_train/valid/test) → copied to
  `{save}/latest_train_state.pt` → tracker `latest_checkpointed_iteration.txt` → `iter_N/run_config.yaml`
  (`ConfigContainer.to_yaml`: `yaml.safe_dump` of `to_dict()`, `_target_` per section, callables as
  `{_target_, _call_: false}`) → tokenizer assets. Bridge's `generate_state_dict` puts no `args` in the common state,
  so `args` is removed from the payload's common.pt (a torch.load/torch.save round trip of our own file).
- NeMo 2 `nemo/lightning/pytorch/callbacks/model_checkpoint.py` (`-unfinished` marker, `-last` copies) and
  `nemo/lightning/io/pl.py` / `nemo/lightning/ckpt_utils.py` (`<ckpt>/weights/` = the torch_dist payload,
  `<ckpt>/context/` = `TrainerContext.io_dump`: `io.json` (fiddle graph naming classes), `model.yaml`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys

_TOOLS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TOOLS)
PAYLOAD = dict(format="torch_dist", tp=1, pp=1, dp=2, layers=2, hidden=16, heads=4, vocab_size=100,
               make_vocab_size_divisible_by=64, iterations=(1, 2), seed=1234)


def _payload(out: str) -> str:
    """A real megatron-core save dir written AT `out` (relative to the repo root, so the paths recorded in args and
    `.metadata` are repo-relative, as for the other samples)."""
    sys.path.insert(0, _TOOLS)
    import make_sample_ckpts

    shutil.rmtree(out, ignore_errors=True)
    make_sample_ckpts.make_checkpoint(os.path.relpath(out, _ROOT), **PAYLOAD)
    return out


def _load_common(path: str):
    import torch

    return torch.load(path, weights_only=False)  # our own freshly written file


def _fn(target: str) -> dict:
    return {"_call_": False, "_target_": target}


def bridge_run_config(args, save: str) -> dict:
    """A `ConfigContainer.to_dict()` for the run that wrote the payload (Bridge 0.3.1 section and field names)."""
    a = vars(args)
    dtype = _fn("torch.float32")
    return {
        "_target_": "megatron.bridge.training.config.ConfigContainer",
        "checkpoint": {
            "_target_": "megatron.bridge.training.config.CheckpointConfig",
            "async_save": False, "ckpt_format": "torch_dist", "fully_parallel_save": True, "load": save,
            "save": save, "save_interval": 1, "save_optim": True, "save_rng": True,
            "save_tokenizer_assets": True, "most_recent_k": -1, "non_persistent_ckpt_type": None,
        },
        "ddp": {"_target_": "megatron.bridge.training.config.DistributedDataParallelConfig",
                "use_distributed_optimizer": True, "overlap_grad_reduce": False, "grad_reduce_in_fp32": False},
        "dist": {"_target_": "megatron.bridge.training.config.DistributedInitConfig",
                 "distributed_backend": "gloo", "use_gloo_process_groups": True},
        "model": {
            "_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider",
            "activation_func": _fn("torch.nn.functional.gelu"),
            "context_parallel_size": 1, "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
            "ffn_hidden_size": a["ffn_hidden_size"], "hidden_size": a["hidden_size"],
            "init_method": {"_args_": [], "_partial_": True, "_target_": "torch.nn.init.normal_", "mean": 0.0,
                            "std": 0.02},
            "kv_channels": a.get("kv_channels"), "make_vocab_size_divisible_by": a["make_vocab_size_divisible_by"],
            "normalization": "LayerNorm", "num_attention_heads": a["num_attention_heads"],
            "num_layers": a["num_layers"], "num_query_groups": a.get("num_query_groups"),
            "params_dtype": dtype, "pipeline_dtype": dtype,
            "pipeline_model_parallel_size": a["pipeline_model_parallel_size"],
            "position_embedding_type": "learned_absolute", "seq_length": a["seq_length"],
            "sequence_parallel": False, "share_embeddings_and_output_weights": False,
            "tensor_model_parallel_size": a["tensor_model_parallel_size"],
            "timers": {"_call_": True, "_target_": "megatron.core.timers.Timers"},
            "virtual_pipeline_model_parallel_size": None, "vocab_size": a["padded_vocab_size"],
        },
        "optimizer": {"_target_": "megatron.bridge.training.config.OptimizerConfig", "optimizer": "adam",
                      "lr": a.get("lr"), "min_lr": a.get("min_lr"), "weight_decay": 0.1,
                      "use_distributed_optimizer": True, "params_dtype": dtype, "bf16": False},
        "rng": {"_target_": "megatron.bridge.training.config.RNGConfig", "seed": a.get("seed", 1234),
                "data_parallel_random_init": False},
        "scheduler": {"_target_": "megatron.bridge.training.config.SchedulerConfig",
                      "lr_decay_style": "cosine", "lr_warmup_iters": 0},
        "tokenizer": {"_target_": "megatron.bridge.training.tokenizers.config.TokenizerConfig",
                      "tokenizer_type": "NullTokenizer", "vocab_size": a.get("vocab_size", 100)},
        "train": {"_target_": "megatron.bridge.training.config.TrainingConfig",
                  "global_batch_size": a.get("global_batch_size"), "micro_batch_size": a.get("micro_batch_size"),
                  "train_iters": a.get("train_iters")},
    }


def build_bridge(out: str, tmp: str) -> None:
    import torch
    import yaml

    src = _payload(out)
    save = os.path.relpath(out, _ROOT)
    last = None
    for name in sorted(n for n in os.listdir(src) if n.startswith("iter_")):
        it = int(name[5:])
        d = os.path.join(out, name)
        common = _load_common(os.path.join(d, "common.pt"))
        args = common.pop("args")  # Bridge's generate_state_dict writes no args
        torch.save(common, os.path.join(d, "common.pt"))
        gbs = getattr(args, "global_batch_size", 2) or 2
        train_state = {
            "step": torch.tensor(it, dtype=torch.int32),
            "consumed_train_samples": torch.tensor(it * gbs, dtype=torch.int32),
            "skipped_train_samples": torch.tensor(0, dtype=torch.int32),
            "consumed_valid_samples": torch.tensor(0, dtype=torch.int32),
            "floating_point_operations_so_far": torch.tensor(
                float(common.get("num_floating_point_operations_so_far", 0)), dtype=torch.float64),
            "do_train": torch.tensor(True, dtype=torch.bool),
            "do_valid": torch.tensor(False, dtype=torch.bool),
            "do_test": torch.tensor(False, dtype=torch.bool),
        }
        # train_state_finalize_fn: floating_point_operations_so_far re-set as float32 before saving
        train_state["floating_point_operations_so_far"] = torch.tensor(
            float(common.get("num_floating_point_operations_so_far", 0)), dtype=torch.float32)
        torch.save(train_state, os.path.join(d, "train_state.pt"))
        shutil.copy(os.path.join(d, "train_state.pt"), os.path.join(out, "latest_train_state.pt"))
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(it))
        with open(os.path.join(d, "run_config.yaml"), "w") as f:
            yaml.safe_dump(bridge_run_config(args, save), f, default_flow_style=False)
        last = it
    add_bridge_energon(out)
    print(f"[bridge] {out}: iterations up to {last}")


def add_bridge_energon(out: str) -> None:
    """Bridge's per-DP-rank Energon dataloader state beside the iterations of save dir `out`.

    Megatron-Bridge v0.6.0 `training/checkpointing.py`: `save_checkpoint` L1174-1187 defaults `dataloader_save` to
    `{checkpoint.save}/energon` (`DATALOADER_STATE_SUBDIR`, L145); `maybe_save_dataloader_state` L1733-1750 has the
    TP/PP/CP leader of each DP replica write `get_checkpoint_name(path, it)/train_dataloader_dprank{dp:03d}.pt` =
    `torch.save({"dataloader_state_dict": train_iterator.iterable.save_state()})`. The state is megatron-energon's
    own classes (7.4.1: `SavableDataLoader.save_state` returns a `SavableDataLoaderState` whose `worker_states` are
    `SavableDatasetCheckpoint`s of a `SavableDatasetState` with the process RNGs in a `SystemRngState` and the
    dataset's `FlexState`), built here with the real classes rather than by a running loader (that needs a prepared
    webdataset): the pickle's globals and encoding are energon's. One file per DP rank of the payload (DP 2), per
    iteration. Energon installs without its dataset dependencies for this:
    `pip install --no-deps --target DIR megatron-energon==7.4.1 braceexpand rapidyaml deprecation filetype pillow
    webdataset` and `PYTHONPATH=DIR`.
    """
    import random

    import numpy
    import torch
    from megatron.energon.rng import SystemRngState
    from megatron.energon.savable_loader import SavableDataLoaderState, SavableDatasetCheckpoint, SavableDatasetState
    from megatron.energon.state import FlexState

    dp = PAYLOAD["dp"]
    for name in sorted(n for n in os.listdir(out) if n.startswith("iter_")):
        it = int(name[5:])
        d = os.path.join(out, "energon", f"iter_{it:07d}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for rank in range(dp):
            torch.manual_seed(1234 + rank)
            numpy.random.seed(1234 + rank)
            random.seed(1234 + rank)
            rng = SystemRngState(torch=torch.get_rng_state(), numpy=numpy.random.get_state(), random=random.getstate())
            ds = SavableDatasetState(rng=rng, dataset_state=FlexState(sample_index=it * 2 + rank, epoch=0),
                                     sample_index=it * 2 + rank)
            state = SavableDataLoaderState(worker_states=[SavableDatasetCheckpoint(state=ds, offset=0)],
                                           next_worker_id=0, micro_batch_size=1)
            torch.save({"dataloader_state_dict": state}, os.path.join(d, f"train_dataloader_dprank{rank:03d}.pt"))
    print(f"[bridge] {out}/energon: Energon-layout dataloader state for DP {dp}")


def build_nemo2(out: str, tmp: str) -> None:
    import torch
    import yaml

    shutil.rmtree(out, ignore_errors=True)
    ckpts = os.path.join(out, "checkpoints")
    it = 2
    # ModelCheckpoint filename "{model_name}--{reduced_train_loss:.2f}-{epoch}-{consumed_samples}" with step
    name = f"default--reduced_train_loss=0.00-epoch=0-consumed_samples={it * 2}.0-step={it - 1}"
    ckpt = os.path.join(ckpts, name)
    src = _payload(ckpt)  # written in place, then iter_0000002 becomes weights/
    weights = os.path.join(ckpt, "weights")
    os.rename(os.path.join(src, f"iter_{it:07d}"), weights)
    for n in os.listdir(ckpt):
        if n != "weights":
            p = os.path.join(ckpt, n)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    common = _load_common(os.path.join(weights, "common.pt"))
    args = common.pop("args")  # NeMo's MegatronStrategy puts Lightning state in the common dict, no Megatron args
    common.update(epoch=0, global_step=it - 1, pytorch_lightning_version="2.5.1",
                  loops={}, callbacks={}, lr_schedulers=[])
    torch.save(common, os.path.join(weights, "common.pt"))
    ctx = os.path.join(ckpt, "context")
    os.makedirs(ctx)
    a = vars(args)
    model_cfg = {"_target_": "nemo.collections.llm.gpt.model.base.GPTConfig",
                 "num_layers": a["num_layers"], "hidden_size": a["hidden_size"],
                 "ffn_hidden_size": a["ffn_hidden_size"], "num_attention_heads": a["num_attention_heads"],
                 "seq_length": a["seq_length"], "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                 "make_vocab_size_divisible_by": a["make_vocab_size_divisible_by"]}
    with open(os.path.join(ctx, "model.yaml"), "w") as f:
        yaml.safe_dump(model_cfg, f)
    # io.json: fiddle's JSON serialization of TrainerContext (objects by type name, never instantiated here)
    io = {"root": {"type": {"type": "PyReference", "module": "fiddle._src.config", "name": "Config"},
                   "items": [["trainer", {"type": "Ref", "key": "trainer_1"}],
                             ["model", {"type": "Ref", "key": "gptmodel_1"}]]},
          "objects": {"gptmodel_1": {"type": {"type": "PyReference", "module": "nemo.collections.llm.gpt.model.base",
                                              "name": "GPTModel"}, "items": [], "tags": {}},
                      "trainer_1": {"type": {"type": "PyReference", "module": "nemo.lightning.pytorch.trainer",
                                             "name": "Trainer"}, "items": [], "tags": {}}},
          "refcounts": {"gptmodel_1": 1, "trainer_1": 1}, "version": "0.0.1"}
    with open(os.path.join(ctx, "io.json"), "w") as f:
        json.dump(io, f, indent=2)
    print(f"[nemo2] {ckpt}")


def build_torchtitan(out: str, tmp: str) -> None:
    code = (
        "import socket, sys; sys.path.insert(0, %r)\n"
        "import torch.multiprocessing as mp, _titan_cpu\n"
        "if __name__ == '__main__':\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "    cfg = dict(port=port, world=2, seed=1234, vocab=64, dim=16, layers=2, heads=2, steps=[1, 2],\n"
        "               folder='checkpoint', out=%r)\n"
        "    mp.start_processes(_titan_cpu.worker, args=(cfg,), nprocs=2, start_method='spawn')\n"
    ) % (_TOOLS, os.path.join(tmp, "titan"))
    script = os.path.join(tmp, "run_titan.py")
    with open(script, "w") as f:
        f.write(code)
    subprocess.run([sys.executable, script], check=True, cwd=tmp)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(os.path.join(tmp, "titan", "checkpoint"), out)


def build_nvrx_local(out: str, tmp: str) -> None:
    sys.path.insert(0, _TOOLS)
    import make_sample_ckpts

    shutil.rmtree(out, ignore_errors=True)
    make_sample_ckpts.make_checkpoint(os.path.relpath(out, _ROOT), **{**PAYLOAD, "format": "nvrx_local"})
    for n in os.listdir(os.path.join(out, "local")):  # {out}/local/{rank} -> {out}/{rank}
        os.rename(os.path.join(out, "local", n), os.path.join(out, n))
    os.rmdir(os.path.join(out, "local"))


def build_megatron_fsdp(out: str, tmp: str) -> None:
    """A real Megatron FSDP run writing ``--ckpt-format fsdp_dtensor`` (tools/_fsdp_cpu.py), DP2 on gloo."""
    sys.path.insert(0, _TOOLS)
    import make_sample_ckpts
    import torch.multiprocessing as tmp_mp

    import _fsdp_cpu

    shutil.rmtree(out, ignore_errors=True)
    rel = os.path.relpath(out, _ROOT)
    cfg = dict(make_sample_ckpts.DEFAULTS)
    cfg.update(tp=1, pp=1, dp=2, world=2, layers=2, hidden=16, heads=4, vocab_size=100, iterations=[1],
               micro_batch_size=2, num_microbatches=1, seed=1234, train_iters=10,
               padded_vocab_size=make_sample_ckpts.padded_vocab_size(100, 64, 1), out_dir=rel, save_arg=rel,
               port=make_sample_ckpts._free_port(), verify=VERIFY)
    os.makedirs(out, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp_mp.start_processes(_fsdp_cpu.worker_entry, args=(cfg,), nprocs=2, start_method="spawn")
    print(f"[megatron_fsdp] {out}")


def build_torchtitan_dataloader(out: str, tmp: str) -> None:
    """torchtitan's dataloader Stateful per DP rank inside a DCP save (tools/_titan_dataloader.py; torch only)."""
    code = (
        "import socket, sys; sys.path.insert(0, %r)\n"
        "import torch.multiprocessing as mp, _titan_dataloader\n"
        "if __name__ == '__main__':\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "    cfg = dict(port=port, world=2, seed=1234, steps=[1, 2], out=%r)\n"
        "    mp.start_processes(_titan_dataloader.worker, args=(cfg,), nprocs=2, start_method='spawn')\n"
    ) % (_TOOLS, os.path.relpath(out, _ROOT))
    shutil.rmtree(out, ignore_errors=True)
    script = os.path.join(tmp, "run_titan_dataloader.py")
    with open(script, "w") as f:
        f.write(code)
    subprocess.run([sys.executable, script], check=True, cwd=_ROOT)
    print(f"[torchtitan_dataloader] {out}")


VERIFY = False  # --verify: megatron_fsdp also loads its save back the Megatron way (tools/_fsdp_cpu._verify_load)
BUILDERS = {"torchtitan": build_torchtitan, "torchtitan_dataloader": build_torchtitan_dataloader, "megatron_fsdp": build_megatron_fsdp, "nvrx_local": build_nvrx_local,
            "bridge": build_bridge, "nemo2": build_nemo2,
            # only the energon/ dir of an existing sample_ckpts/bridge (no megatron-core needed)
            "bridge_energon": lambda out, tmp: add_bridge_energon(os.path.join(os.path.dirname(out), "bridge"))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=sorted(BUILDERS), default=sorted(BUILDERS))
    p.add_argument("--tmp", default="/tmp/ckptinspect-stacks")
    p.add_argument("--verify", action="store_true", help="megatron_fsdp: load the save back with Megatron's path")
    ns = p.parse_args(argv)
    global VERIFY
    VERIFY = ns.verify
    os.makedirs(ns.tmp, exist_ok=True)
    os.chdir(_ROOT)  # recorded paths (args.save, .metadata checkpoint_id) are repo-relative
    for name in ns.only:
        BUILDERS[name](os.path.join(_ROOT, "sample_ckpts", name), ns.tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
