"""Megatron FSDP (`--use-megatron-fsdp --ckpt-format fsdp_dtensor`) on CPU: a real megatron-core 0.16.1 run.

One process per rank (spawned by ``tools/make_stack_samples.py --only megatron_fsdp``), gloo, world 2 = DP2 (TP1 PP1).
The model is a tiny GPTModel (local layer spec, SwiGLU, no linear biases, bf16 params in Megatron's ``Float16Module``)
wrapped in ``megatron.core.distributed.fsdp.mcore_fsdp_adapter.FullyShardedDataParallel`` with
``data_parallel_sharding_strategy="optim_grads_params"`` (ZeRO-3), the DistributedOptimizer (torch AdamW, fp32 main
params) from ``get_megatron_optimizer``; one real forward/backward/``optimizer.step()`` per iteration.

The save follows Megatron-LM core_v0.16.1 ``megatron/training/checkpointing.py`` step by step (that file is not part of
the megatron-core wheel, so its few lines of glue are re-done here; every function that builds or writes the payload
is megatron-core's or torch's own):

- ``save_checkpoint`` L471-800: ``get_rng_state`` (L336-391: for ``fsdp_dtensor`` the rng list is a dict keyed
  ``f"({pp_rank}, {tp_rank})"``), ``rerun_state_machine.state_dict(ckpt_format="fsdp_dtensor")`` returns None (the
  key is then left out, L945-946), ``generate_state_dict`` L877-952 (``args``, ``checkpoint_version`` 3.0,
  ``iteration``, ``model`` = ``state_dict_for_save_checkpoint()`` of the unwrapped model (``megatron.core.utils.
  unwrap_model`` stops at ``MegatronFSDP``), ``optimizer`` = ``DistributedOptimizer.sharded_state_dict`` with
  ``_build_sharded_state_dict_metadata`` L401-431 (``distrib_optim_sharding_type='fsdp_dtensor'``), which is
  ``{"state": …, "param_to_group_meta": …}`` (megatron/core/optimizer/distrib_optimizer.py L1296-1369),
  ``opt_param_scheduler``, ``rng_state``), then ``num_floating_point_operations_so_far`` (L605);
- L643-655: ``preprocess_fsdp_dtensor_state_dict`` (L955-974: ``handle_fp8_extra_state_case``,
  ``handle_swiglu_in_state_dict`` → ``linear_fc1.weight_w`` / ``_v``, ``preprocess_state_dict_for_uneven_dtensor``;
  all three from megatron-core), then ``torch.distributed.checkpoint.save(state_dict,
  storage_writer=FileSystemWriter(iter_dir))`` — no ``metadata.json``, no ``common.pt``;
- L696-706: barrier, then rank 0 writes the tracker ``latest_checkpointed_iteration.txt``.

CPU shims beyond ``tools/_mcore_cpu.py`` (none changes the bytes written, except the last, see below):
``torch.cuda.current_device()`` → 0 (MegatronFSDP builds ``torch.device(f"cuda:{current_device()}")``),
``DeviceMesh.from_group(device_type="cuda")`` → ``"cpu"``, CUDA events and ``Stream.record_event`` → inert
objects, and ``gradient_reduce_div_fusion=False`` (a DDP config field; the fused ``PREMUL_SUM`` reduce op is
NCCL-only, the unfused path scales then sums).

One deviation in the optimizer state, documented because it is visible on disk: Megatron FSDP shards each bucket
evenly across DP, so a small parameter can lie wholly on one rank; the other rank's shard is empty, its grad is None
(megatron_fsdp/param_and_grad_buffer.py L2669) and torch AdamW creates no state for it. Then the ranks'
``optimizer.state`` dicts differ and ``preprocess_state_dict_for_uneven_dtensor`` (one collective per DTensor) hangs
(observed here at save; the load builds the same uneven dicts). Before saving (and before loading, in
``--verify``), such a param gets the state torch AdamW gives a zero-size grad: ``step`` equal to the other params' and empty ``exp_avg``/``exp_avg_sq``
(Megatron's ``init_state_fn``, megatron/core/optimizer/__init__.py L391-398, adds no ``step``, and torch AdamW's
``load_state_dict`` then raises KeyError 'step'); the state dict is kept in param-group order, so every rank
walks the same DTensors. Empty local shards write nothing (megatron_fsdp/uneven_dtensor.py L108-111); the
replicated 0-d ``step`` tensors are written once (DCP deduplicates them).
"""

from __future__ import annotations

import os
import sys
import traceback

_TOOLS = os.path.dirname(os.path.abspath(__file__))


def _fsdp_cpu_shims() -> None:
    import torch
    from torch.distributed import device_mesh as dm

    torch.cuda.current_device = lambda: 0

    class _Event:
        def __init__(self, *a, **k):
            pass

        def wait(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

        def record(self, *a, **k):
            pass

    torch.cuda.Stream.record_event = lambda self, *a, **k: _Event()
    torch.cuda.Event = _Event
    from_group = dm.DeviceMesh.from_group

    def _from_group(*a, **k):
        if k.get("device_type") == "cuda":
            k["device_type"] = "cpu"
        return from_group(*a, **k)

    dm.DeviceMesh.from_group = staticmethod(_from_group)


def worker_entry(rank: int, cfg: dict) -> None:
    if _TOOLS not in sys.path:
        sys.path.insert(0, _TOOLS)
    import _mcore_cpu as M

    M._quiet()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        import torch

        torch.set_num_threads(1)
        M.install_cuda_shims()
        _fsdp_cpu_shims()
        M._seed_dcp_uuids(cfg["seed"], rank)
        M._init_dist(rank, cfg["world"], cfg["port"])
        _run(rank, cfg, M)
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stderr.write(f"[_fsdp_cpu rank {rank}] FAILED\n{traceback.format_exc()}\n")
        sys.stderr.flush()
        raise


def _args(cfg: dict, iteration: int, M):
    a = M._build_args({**cfg, "format": "torch_dist", "half_written": "none", "optim_sharding": "dp_reshardable"},
                      iteration)
    a.ckpt_format = "fsdp_dtensor"
    a.use_megatron_fsdp = True
    a.use_torch_fsdp2 = False
    a.data_parallel_sharding_strategy = "optim_grads_params"
    a.gradient_reduce_div_fusion = False
    a.ckpt_fully_parallel_save = False
    a.dist_ckpt_optim_fully_reshardable = False
    a.swiglu = True
    a.add_bias_linear = False
    a.bf16 = True
    a.params_dtype = "torch.bfloat16"
    a.accumulate_allreduce_grads_in_fp32 = True
    a.num_experts = None
    a.no_save_optim = False
    a.no_save_rng = False
    a.data_parallel_random_init = False
    return a


def _run(rank: int, cfg: dict, M) -> None:
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F

    from megatron.core import parallel_state, tensor_parallel

    M._patch_megatron_rng()
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import RerunMode, get_rerun_state_machine, initialize_rerun_state_machine
    from megatron.core.transformer import TransformerConfig

    c = cfg
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    seed = c["seed"]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    dp = c["dp"]
    mbs = c["micro_batch_size"]
    gbs = mbs * dp * c["num_microbatches"]
    init_num_microbatches_calculator(rank, None, gbs, mbs, dp)
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)
    config = TransformerConfig(
        num_layers=c["layers"], hidden_size=c["hidden"], num_attention_heads=c["heads"],
        ffn_hidden_size=4 * c["hidden"], use_cpu_initialization=True, bf16=True,
        pipeline_dtype=torch.bfloat16, params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
        bias_dropout_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False,
        init_method_std=0.02, sequence_parallel=False,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
    )
    model, optimizer, sched = _build(c, config, gbs)
    seq = c["seq_length"]
    attn_mask = torch.tril(torch.ones((1, 1, seq, seq))) < 0.5
    position_ids = torch.arange(seq).unsqueeze(0).expand(mbs, seq)
    forward_step = M.gpt_forward_step(position_ids, attn_mask)

    fwd_bwd = get_forward_backward_func()
    it = M.token_batches(seed * 1000 + rank, c["vocab_size"], mbs, seq)
    rsm = get_rerun_state_machine()
    flops_per_iter = 6.0 * gbs * seq * (12 * c["layers"] * c["hidden"] ** 2)
    for iteration in range(1, max(c["iterations"]) + 1):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        fwd_bwd(forward_step_func=forward_step, data_iterator=it, model=[model],
                num_microbatches=c["num_microbatches"], seq_length=seq, micro_batch_size=mbs, forward_only=False)
        M.optimizer_step(optimizer, sched, gbs, iteration)
        if iteration not in c["iterations"]:
            continue
        ckpt_dir = os.path.join(c["out_dir"], f"iter_{iteration:07d}")
        if rank == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
        dist.barrier()
        args = _args(c, iteration, M)
        _same_state_keys_on_every_rank(optimizer)
        rerun_state = rsm.state_dict(data_iterator=None, ckpt_format="fsdp_dtensor")
        state_dict, _raw = _fsdp_state_dict(args, model, optimizer, sched, M, loading=False)
        if rerun_state:  # generate_state_dict L945-946 (None for fsdp_dtensor in 0.16.1)
            state_dict["rerun_state_machine"] = rerun_state
        state_dict["num_floating_point_operations_so_far"] = flops_per_iter * iteration
        dcp.save(state_dict=state_dict, storage_writer=dcp.FileSystemWriter(ckpt_dir))
        dist.barrier()
        if rank == 0:
            M._write_tracker(c["out_dir"], iteration)
        dist.barrier()
        if c.get("verify"):
            _verify_load(c, config, gbs, args, model, optimizer, ckpt_dir, M)
    parallel_state.destroy_model_parallel()


def _same_state_keys_on_every_rank(optimizer) -> None:
    """The documented deviation (module docstring): a param whose local shard is empty gets the state torch AdamW
    gives an empty grad (`step` as the other params', empty `exp_avg` / `exp_avg_sq`), and the state is kept in
    param-group order, so every rank holds the same keys in the same order."""
    import torch

    inner = optimizer.optimizer
    steps = [st["step"] for st in inner.state.values() if "step" in st]
    for g in inner.param_groups:
        for p in g["params"]:
            if len(inner.state[p]) == 0:
                step = steps[0].clone() if steps else torch.tensor(0.0)
                inner.state[p] = {"step": step, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    ordered = {p: inner.state[p] for g in inner.param_groups for p in g["params"]}
    inner.state.clear()
    inner.state.update(ordered)


def _fsdp_state_dict(args, model, optimizer, sched, M, loading: bool):
    """checkpointing.py generate_state_dict (L877-952) + preprocess_fsdp_dtensor_state_dict (L955-974) for
    fsdp_dtensor; with `loading`, as load_checkpoint builds it (L1675-1705, `is_loading=True`). Returns the state dict
    to hand to DCP and the raw (unsplit) model / optimizer dicts `_load_base_checkpoint` restores after a load."""
    from megatron.core import parallel_state
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_fp8_extra_state_case,
        handle_swiglu_in_state_dict,
    )
    from megatron.core.utils import unwrap_model

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    metadata = {"distrib_optim_sharding_type": "fsdp_dtensor", "singleton_local_shards": False,
                "chained_optim_avoid_prefix": True,
                "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    unwrapped = unwrap_model([model])
    state_dict = {"args": args, "checkpoint_version": 3.0, "iteration": args.iteration}
    state_dict["model"] = unwrapped[0].state_dict_for_save_checkpoint()
    kw = {"is_loading": True} if loading else {}
    state_dict["optimizer"] = optimizer.sharded_state_dict(state_dict, metadata=metadata, **kw)
    state_dict["opt_param_scheduler"] = sched.state_dict()
    state_dict["rng_state"] = {f"({pp_rank}, {tp_rank})": [M._get_rng_state_dict()]}  # get_rng_state L384-389
    raw = (state_dict["model"].copy(), state_dict["optimizer"].copy())
    state_dict = state_dict.copy()
    handle_fp8_extra_state_case(state_dict["model"])
    state_dict["model"], state_dict["optimizer"] = handle_swiglu_in_state_dict(
        unwrapped[0], state_dict["model"], state_dict["optimizer"])
    preprocess_state_dict_for_uneven_dtensor(state_dict)
    return state_dict, raw


def _verify_load(c, config, gbs, args, model, optimizer, ckpt_dir, M) -> None:
    """Megatron's fsdp_dtensor load into a differently seeded fresh model: `_load_base_checkpoint` L1292-1325
    (DefaultLoadPlanner with allow_partial_load, as without --strict-fsdp-dtensor-load), then load_checkpoint's
    model (L1759-1772, `strict=False` for gated linear units, mcore_fsdp_adapter.py load_state_dict) and optimizer
    load. The main weights and Adam moments must come back bit-identical."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader, default_planner
    from torch.distributed.tensor import DTensor

    torch.manual_seed(c["seed"] + 99)
    fresh, fresh_opt, fresh_sched = _build(c, config, gbs)
    fresh_opt._init_optimizer_states_with_dummy_values()
    _same_state_keys_on_every_rank(fresh_opt)
    state_dict, (raw_model, raw_opt) = _fsdp_state_dict(args, fresh, fresh_opt, fresh_sched, M, loading=True)

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    want = dict(model.module.state_dict())
    before = dict(fresh.module.state_dict())
    assert any(isinstance(v, torch.Tensor) and local(v).numel() and not torch.equal(local(v), local(before[k]))
               for k, v in want.items()), "the fresh model already equals the saved one: the check would prove nothing"
    torch.distributed.checkpoint.load_state_dict(
        state_dict=state_dict, storage_reader=FileSystemReader(ckpt_dir),
        planner=default_planner.DefaultLoadPlanner(allow_partial_load=True))
    fresh.load_state_dict(raw_model, strict=False)
    fresh_opt.load_state_dict(raw_opt)
    got = dict(fresh.module.state_dict())
    n = 0
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(local(v), local(got[k])), f"model {k} differs after load"
            n += 1
    sw, sg = optimizer.optimizer.state, fresh_opt.optimizer.state
    pw = [p for g in optimizer.optimizer.param_groups for p in g["params"]]
    pg = [p for g in fresh_opt.optimizer.param_groups for p in g["params"]]
    for a, b in zip(pw, pg):
        for name in ("exp_avg", "exp_avg_sq"):
            if name in sw.get(a, {}):
                assert torch.equal(local(sw[a][name]), local(sg[b][name])), f"optimizer {name} differs after load"
                n += 1
    print(f"[_fsdp_cpu rank {torch.distributed.get_rank()}] verify: {n} tensors bit-identical after Megatron's "
          f"fsdp_dtensor load", flush=True)


def _build(c: dict, config, gbs: int):
    """GPTModel → Float16Module → Megatron FSDP, its DistributedOptimizer and scheduler (training.py get_model /
    setup_model_and_optimizer order)."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.module import Float16Module

    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=c["padded_vocab_size"], max_sequence_length=c["seq_length"],
                     share_embeddings_and_output_weights=False, position_embedding_type="learned_absolute")
    model = Float16Module(config, model)  # training.py get_model: --bf16
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True,
        check_for_nan_in_grad=False, bucket_size=None, use_megatron_fsdp=True,
        data_parallel_sharding_strategy="optim_grads_params", gradient_reduce_div_fusion=False,
    )
    model = FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=model,
                                     device=torch.device("cpu"))
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=c["lr"], min_lr=c["lr"] / 10, weight_decay=0.1, adam_beta1=0.9,
                        adam_beta2=0.95, clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True),
        [model],
    )
    sched = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=c["lr"], min_lr=c["lr"] / 10, lr_warmup_steps=0,
        lr_decay_steps=c["train_iters"] * gbs, lr_decay_style="cosine", start_wd=0.1, end_wd=0.1,
        wd_incr_steps=c["train_iters"] * gbs, wd_incr_style="constant",
    )
    return model, optimizer, sched
