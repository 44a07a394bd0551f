"""Worker side of the parallel-layout samples and ground-truth loads (``tools/make_sample_ckpts.py``).

The same CPU/gloo set-up as ``tools/_mcore_cpu.py`` (whose CUDA->CPU shims, rng patch, seeded DCP
uuids and tracker writer it reuses), for the layouts large runs use, on megatron-core 0.16.1:

  * MoE with expert parallelism: SequentialMLP experts (``get_gpt_layer_local_spec(num_experts,
    moe_grouped_gemm=False)``), EP and expert-TP (ETP) process groups from
    ``parallel_state.initialize_model_parallel``; the dense and the expert DistributedOptimizer
    are chained by ``get_megatron_optimizer``;
  * virtual pipeline (VPP): one GPTModel per virtual stage (``vp_stage=i``), one DDP per chunk
    (bucketing only for chunk 0), Megatron's interleaved 1F1B schedule, ``model0``/``model1``;
  * context parallelism (CP): the CP process groups; DDP and the DistributedOptimizer use the
    DP x CP group (``with_context_parallel=True``), as Megatron does;
  * SwiGLU (``gated_linear_unit=True``, silu); bf16 params (``Float16Module``) with fp32 main
    params and fp32 grad reduction in the DistributedOptimizer;
  * the torch_dist save of Megatron-LM's ``save_checkpoint`` (training/checkpointing.py,
    core_v0.16.1): fully parallel save over the DP x CP group, ``rng_state`` a (PP, TP) grid
    with replica = DP x CP rank, or a (PP, TP, DP) grid with replica 0 when EP > 1
    (``get_rng_state``); legacy ``torch``: ``mp_rank_TT[_PPP][_EEE]`` dirs, written by expert-DP
    rank 0, ``model`` or ``model0..N``, ``distrib_optim.pt`` from ``save_parameter_state`` (a list,
    one entry per chained optimizer, ``None`` where this rank is not DP rank 0 of that optimizer).

One CPU shim beyond ``_mcore_cpu``: Megatron's local ``DotProductAttention`` asserts
``context_parallel_size == 1`` (CP attention exists only in Transformer Engine, CUDA-only).  So
with CP the TransformerConfig says ``context_parallel_size=1`` while the process groups have
CP > 1, and each CP rank attends within its own sequence chunk.  Nothing on disk depends on that
config field: sharding, replica ids and DistributedOptimizer ranges all come from the CP/DP
process groups (``args.context_parallel_size`` in the checkpoint is the real CP).  And one
missing-TE fix: ``moe_utils.te_general_gemm`` is defined as None (see _patch_moe_without_te);
MoE with TP > 1 trains with ``module.training`` False (see _train_mode).

Ground truth (mode ``truth``): one spawn of ``world`` ranks runs a list of load cases; each case
re-initialises the process groups for its target topology, builds the model and optimizer there
(no training), and runs what Megatron-LM's ``load_checkpoint`` runs for torch_dist:
``load_content_metadata``, ``sharded_state_dict`` (``is_loading=True`` for the optimizer; the rng
object only when (TP, PP) are unchanged), ``dist_checkpointing.load``, then
``load_state_dict`` of every model chunk and of the optimizer.  Legacy: ``torch.load`` of this
rank's ``mp_rank_*`` file, ``load_state_dict`` and ``load_parameter_state``.  It records per case
``ok`` or the exception; the (TP, PP) guard of ``load_checkpoint`` (training code, not in
megatron-core) is not re-implemented here.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import _mcore_cpu as base


def worker_entry(rank: int, cfg: dict) -> None:
    """torch.multiprocessing entry point (must be importable by spawn children)."""
    base._quiet()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        base.install_cuda_shims()
        base._seed_dcp_uuids(cfg["seed"], rank)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), RANK=str(rank),
                          WORLD_SIZE=str(cfg["world"]), LOCAL_RANK=str(rank))
        dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                                rank=rank, world_size=cfg["world"],
                                timeout=datetime.timedelta(seconds=cfg.get("pg_timeout", 300)))
        base._patch_megatron_rng()
        _patch_moe_without_te()
        if cfg["mode"] == "truth":
            _run_truth(rank, cfg)
        else:
            _run(rank, cfg)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stderr.write(f"[make_sample_ckpts rank {rank}] FAILED\n{traceback.format_exc()}\n")
        sys.stderr.flush()
        raise


def _patch_moe_without_te() -> None:
    """megatron-core 0.16.1 moe_utils.py imports ``te_general_gemm`` from Transformer Engine inside
    a try block and leaves the name undefined without TE, so ``RouterGatingLinearFunction`` raises
    NameError (line 1192).  Define it as None: the function's own non-TE branch (torch matmul)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


# --------------------------------------------------------------------------------------
# building a model at a topology
# --------------------------------------------------------------------------------------


def _init_groups(c: dict) -> None:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=c["tp"],
        pipeline_model_parallel_size=c["pp"],
        virtual_pipeline_model_parallel_size=c["vpp"],
        context_parallel_size=c["cp"],
        expert_model_parallel_size=c["ep"],
        expert_tensor_parallel_size=c["etp"],
    )


def _seed(c: dict) -> None:
    import random

    import numpy as np
    import torch
    from megatron.core import parallel_state, tensor_parallel

    # training/initialize.py _set_random_seed
    seed = c["seed"] + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _transformer_config(c: dict):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    dtype = torch.bfloat16 if c["bf16"] else torch.float32
    kw = {}
    if c["experts"]:
        kw.update(
            num_moe_experts=c["experts"],
            moe_router_topk=c["topk"],
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
            moe_token_dispatcher_type="allgather",
            moe_grouped_gemm=False,
            expert_model_parallel_size=c["ep"],
            expert_tensor_parallel_size=c["etp"],
            add_bias_linear=False,
        )
    if c["swiglu"]:
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    return TransformerConfig(
        num_layers=c["layers"],
        hidden_size=c["hidden"],
        num_attention_heads=c["heads"],
        ffn_hidden_size=4 * c["hidden"],
        use_cpu_initialization=True,
        tensor_model_parallel_size=c["tp"],
        pipeline_model_parallel_size=c["pp"],
        virtual_pipeline_model_parallel_size=c["vpp"],
        # see the module docstring: CP attention is TE-only; the CP process groups are real.
        context_parallel_size=1,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=c["bf16"],
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        init_method_std=0.02,
        sequence_parallel=False,  # see _train_mode (MoE with TP > 1)
        bias_activation_fusion=False,
        **kw,
    )


def _build(c: dict):
    """Model chunks (DDP-wrapped), optimizer and scheduler at the topology of ``c`` (groups set)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.module import Float16Module

    config = _transformer_config(c)
    spec = get_gpt_layer_local_spec(num_experts=c["experts"] or None, moe_grouped_gemm=False)
    vpp = c["vpp"] or 1
    first = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    chunks = []
    for i in range(vpp):
        m = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=c["padded_vocab_size"],
            max_sequence_length=c["seq_length"],
            pre_process=first and i == 0,
            post_process=last and i == vpp - 1,
            share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute",
            vp_stage=i if c["vpp"] else None,
        )
        if c["bf16"]:
            m = Float16Module(config, m)
        chunks.append(m)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=c["bf16"],  # Megatron-LM: --accumulate-allreduce-grads-in-fp32 with bf16
        overlap_grad_reduce=False,
        use_distributed_optimizer=True,
        check_for_nan_in_grad=False,
        bucket_size=None,
    )
    model = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=m,
                                     disable_bucketing=i > 0) for i, m in enumerate(chunks)]
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
    if len(model) > 1:
        config.grad_sync_func = [m.start_grad_sync for m in model]
    gbs = c["micro_batch_size"] * c["dp"] * c["num_microbatches"]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=c["lr"],
            min_lr=c["lr"] / 10,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            clip_grad=1.0,
            bf16=c["bf16"],
            params_dtype=torch.bfloat16 if c["bf16"] else torch.float32,
            use_distributed_optimizer=True,
        ),
        model,
    )
    sched = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=c["lr"], min_lr=c["lr"] / 10, lr_warmup_steps=0,
        lr_decay_steps=c["train_iters"] * gbs, lr_decay_style="cosine", start_wd=0.1, end_wd=0.1,
        wd_incr_steps=c["train_iters"] * gbs, wd_incr_style="constant",
    )
    return model, optimizer, sched, config


def _train_mode(c: dict, model) -> None:
    """MoE with TP > 1: MoELayer.forward raises in training mode without sequence parallelism
    (moe_layer.py:379), and the local (non-TE) LayerNorm asserts no sequence parallelism
    (torch_norm.py:32), so on CPU that combination cannot train in training mode.  Run the step
    with ``module.training`` False instead (this model has no dropout, so the math is the same);
    sequence parallelism changes nothing on disk (norm weights are replicated either way)."""
    if c["experts"] and c["tp"] > 1:
        for m in model:
            m.eval()


def _unwrap(m):
    from megatron.core.transformer.module import Float16Module

    m = m.module  # DDP
    return m.module if isinstance(m, Float16Module) else m


def _build_args(c: dict, iteration: int):
    a = base._build_args(c, iteration)
    a.ckpt_format = {"torch_dist": "torch_dist", "legacy": "torch"}[c["format"]]
    a.async_save = False
    a.context_parallel_size = c["cp"]
    a.data_parallel_size = c["dp"]
    a.world_size = c["world"]
    a.global_batch_size = c["micro_batch_size"] * c["dp"] * c["num_microbatches"]
    a.consumed_train_samples = iteration * a.global_batch_size
    a.expert_model_parallel_size = c["ep"]
    a.expert_tensor_parallel_size = c["etp"]
    a.virtual_pipeline_model_parallel_size = c["vpp"]
    a.num_layers_per_virtual_pipeline_stage = (c["layers"] // (c["pp"] * c["vpp"])
                                               if c["vpp"] else None)
    a.num_experts = c["experts"] or None
    a.moe_router_topk = c["topk"]
    a.moe_grouped_gemm = False
    a.moe_token_dispatcher_type = "allgather"
    a.add_bias_linear = not c["experts"]
    a.swiglu = c["swiglu"]
    a.bf16 = c["bf16"]
    a.params_dtype = "torch.bfloat16" if c["bf16"] else "torch.float32"
    a.accumulate_allreduce_grads_in_fp32 = c["bf16"]
    a.ckpt_fully_parallel_save = True
    a.sequence_parallel = False
    return a


# --------------------------------------------------------------------------------------
# training + saving
# --------------------------------------------------------------------------------------


def _run(rank: int, c: dict) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import (
        RerunMode,
        get_rerun_state_machine,
        initialize_rerun_state_machine,
    )

    _init_groups(c)
    _seed(c)
    dp = c["dp"]
    gbs = c["micro_batch_size"] * dp * c["num_microbatches"]
    init_num_microbatches_calculator(rank, None, gbs, c["micro_batch_size"], dp)
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)
    model, optimizer, sched, _config = _build(c)

    # Data: random tokens per DP replica; each CP rank feeds its own chunk of the sequence.
    dp_rank = parallel_state.get_data_parallel_rank()
    cp, cp_rank = c["cp"], parallel_state.get_context_parallel_rank()
    seq, mbs = c["seq_length"], c["micro_batch_size"]
    local = seq // cp
    lo = cp_rank * local
    attn_mask = torch.tril(torch.ones((1, 1, local, local))) < 0.5
    position_ids = torch.arange(lo, lo + local).unsqueeze(0).expand(mbs, local)

    forward_step = base.gpt_forward_step(position_ids, attn_mask)

    fwd_bwd = get_forward_backward_func()
    _train_mode(c, model)
    iters = [base.token_batches(c["seed"] * 1000 + dp_rank, c["vocab_size"], mbs, seq, slice(lo, lo + local))
             for _ in model]
    rsm = get_rerun_state_machine()
    flops_per_iter = 6.0 * gbs * seq * (12 * c["layers"] * c["hidden"] ** 2)
    for iteration in range(1, max(c["iterations"]) + 1):
        while rsm.should_run_forward_backward(None):
            for m in model:
                m.zero_grad_buffer()
            optimizer.zero_grad()
            fwd_bwd(forward_step_func=forward_step,
                    data_iterator=iters if len(model) > 1 else iters[0],
                    model=model if len(model) > 1 else model[0],
                    num_microbatches=c["num_microbatches"], seq_length=local,
                    micro_batch_size=mbs, forward_only=False)
        base.optimizer_step(optimizer, sched, gbs, iteration)
        if iteration not in c["iterations"]:
            continue
        if c.get("value_faults", "none") != "none":
            import _value_faults  # in memory, before the real save below

            _value_faults.apply(c["value_faults"], model, optimizer,
                                lambda m: print(f"[value_faults rank {rank}] {m}", flush=True))
        ckpt_dir = os.path.join(c["out_dir"], f"iter_{iteration:07d}")
        if rank == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
        dist.barrier()
        common = {
            "args": _build_args(c, iteration),
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "opt_param_scheduler": sched.state_dict(),
            "num_floating_point_operations_so_far": flops_per_iter * iteration,
        }
        rng = base._get_rng_state_dict()
        if c["format"] == "torch_dist":
            _save_torch_dist(c, model, optimizer, common, rng, ckpt_dir, rsm)
        else:
            _save_legacy(c, model, optimizer, common, rng, ckpt_dir)
        dist.barrier()
        if rank == 0:
            base._write_tracker(c["out_dir"], iteration)
        dist.barrier()
    del tensor_parallel, dist_checkpointing
    parallel_state.destroy_model_parallel()


def _content_metadata(c: dict) -> dict:
    """training/checkpointing.py _build_sharded_state_dict_metadata (dp_cp_group: the default)."""
    md = {"distrib_optim_sharding_type": c["optim_sharding"], "singleton_local_shards": False,
          "chained_optim_avoid_prefix": True}
    if c["optim_sharding"] == "fully_reshardable":
        md["distrib_optim_fully_reshardable_mem_efficient"] = False
    return md


def _rng_object(rng: dict):
    """training/checkpointing.py get_rng_state(ckpt_format='torch_dist')."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    pp, tp = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    pps, tps = ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
    dp = ps.get_data_parallel_rank(with_context_parallel=True)
    if ps.get_expert_model_parallel_world_size() > 1:
        dps = ps.get_data_parallel_world_size(with_context_parallel=True)
        return ShardedObject("rng_state", [rng], (pps, tps, dps), (pp, tp, dp), replica_id=0)
    return ShardedObject("rng_state", [rng], (pps, tps), (pp, tp), replica_id=dp)


def _model_sd(model, metadata: dict, state_dict: dict) -> None:
    """generate_state_dict: 'model' or 'model0'..'modelN' (VPP)."""
    for i, m in enumerate(model):
        key = "model" if len(model) == 1 else f"model{i}"
        state_dict[key] = _unwrap(m).sharded_state_dict(metadata=metadata)


def _save_torch_dist(c, model, optimizer, common, rng, ckpt_dir, rsm):
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    metadata = _content_metadata(c)
    state_dict = dict(common)
    _model_sd(model, metadata, state_dict)
    state_dict["optimizer"] = optimizer.sharded_state_dict(state_dict, metadata=metadata)
    state_dict["rng_state"] = _rng_object(rng)
    # force=True: see _mcore_cpu._save_torch_dist (0.16.1 returns None while NOT_RUNNING_YET)
    state_dict["rerun_state_machine"] = rsm.state_dict(data_iterator=None,
                                                       ckpt_format="torch_dist", force=True)
    strategy = FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy("torch_dist", 1),
        ps.get_data_parallel_group(with_context_parallel=True),
    )
    dist_checkpointing.save(state_dict, ckpt_dir, sharded_strategy=strategy,
                            validate_access_integrity=True, content_metadata=metadata)


def _legacy_dir(c: dict, ckpt_dir: str, tp: int, pp: int, ep: int) -> str:
    """training/checkpointing.py get_checkpoint_name: mp_rank_TT[_PPP][_EEE]."""
    name = f"mp_rank_{tp:02d}" if c["pp"] == 1 else f"mp_rank_{tp:02d}_{pp:03d}"
    if c["ep"] > 1:
        name += f"_{ep:03d}"
    return os.path.join(ckpt_dir, name)


def _save_legacy(c, model, optimizer, common, rng, ckpt_dir):
    import torch
    from megatron.core import parallel_state as ps

    d = _legacy_dir(c, ckpt_dir, ps.get_tensor_model_parallel_rank(),
                    ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank())
    os.makedirs(d, exist_ok=True)  # ensure_directory_exists, every rank
    torch.distributed.barrier()
    optimizer.save_parameter_state(os.path.join(d, "distrib_optim.pt"))
    if ps.get_expert_data_parallel_rank() == 0:
        state_dict = dict(common)
        for i, m in enumerate(model):
            key = "model" if len(model) == 1 else f"model{i}"
            state_dict[key] = _unwrap(m).state_dict_for_save_checkpoint()
        state_dict["optimizer"] = optimizer.state_dict()
        state_dict["rng_state"] = [rng]
        torch.save(state_dict, os.path.join(d, "model_optim_rng.pt"))


# --------------------------------------------------------------------------------------
# ground truth: Megatron's own loads at a (possibly changed) topology
# --------------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    failures = getattr(e, "failures", None)  # torch DCP CheckpointException: {rank: (exc, tb)}
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, BaseException):
            return f"{type(e).__name__} <- {_first_line(inner)}"
    text = str(e).strip().splitlines()
    frames = traceback.extract_tb(e.__traceback__)
    where = f" [{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}]" if frames else ""
    return f"{type(e).__name__}: {text[0][:3000] if text else ''}{where}"


def _fresh_adam_steps(optimizer) -> None:
    """Load-only workaround for the torch-Adam fallback (no TE/Apex, i.e. CPU) of megatron-core
    0.16.1: ``DistributedOptimizer.sharded_state_dict`` calls ``state_dict()``, which asserts
    exactly one distinct Adam 'step' across the param states (distrib_optimizer.py:642); a fresh
    optimizer has no state, so a fresh run could never load on that path.  With TE/Apex the step
    lives in param_groups and this does not arise.  Create every param state as Megatron's
    ``init_state_fn`` does (zero moments) plus step 0; the load overwrites all of it."""
    import torch

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if opt.init_state_fn is not None:
            opt.init_state_fn(inner, opt.config)
        for group in inner.param_groups:
            for p in group["params"]:
                inner.state[p].setdefault("step", torch.tensor(0.0))


def _load_case(case: dict, c: dict) -> str:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    model, optimizer, _sched, _config = _build(c)
    base._patch_distopt_step_for_torch_adam()
    _fresh_adam_steps(optimizer)
    ckpt = case["ckpt"]
    if c["format"] == "legacy":
        d = _legacy_dir(c, ckpt, ps.get_tensor_model_parallel_rank(),
                        ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank())
        sd = torch.load(os.path.join(d, "model_optim_rng.pt"), weights_only=False)
        with torch.no_grad():
            for i, m in enumerate(model):
                _unwrap(m).load_state_dict(sd["model" if len(model) == 1 else f"model{i}"])
            if case["optim"]:
                optimizer.load_state_dict(sd["optimizer"])
                optimizer.load_parameter_state(os.path.join(d, "distrib_optim.pt"))
        return "ok"
    metadata = dist_checkpointing.load_content_metadata(ckpt)
    common = dist_checkpointing.load_common_state_dict(ckpt)
    saved = common["args"]
    same_split = (saved.tensor_model_parallel_size, saved.pipeline_model_parallel_size) == (
        c["tp"], c["pp"])
    sd: dict = {}
    _model_sd(model, metadata, sd)
    if case["optim"]:
        sd["optimizer"] = optimizer.sharded_state_dict(sd, is_loading=True, metadata=metadata)
    if same_split and case.get("rng", True):
        sd["rng_state"] = _rng_object(base._get_rng_state_dict())
    loaded = dist_checkpointing.load(sd, ckpt)
    with torch.no_grad():
        for i, m in enumerate(model):
            _unwrap(m).load_state_dict(loaded["model" if len(model) == 1 else f"model{i}"])
        if case["optim"]:
            optimizer.load_state_dict(loaded["optimizer"])
    return "ok"


def _run_truth(rank: int, cfg: dict) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import (
        destroy_num_microbatches_calculator,
        init_num_microbatches_calculator,
    )

    results = []
    for case in cfg["cases"]:
        c = case["cfg"]  # make_sample_ckpts._config of the sample, at the target topology
        try:
            _init_groups(c)
            _seed(c)
            gbs = c["micro_batch_size"] * c["dp"] * c["num_microbatches"]
            init_num_microbatches_calculator(rank, None, gbs, c["micro_batch_size"], c["dp"])
            outcome = _load_case(case, c)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - the outcome IS the exception
            # (torch DCP's CheckpointException derives from BaseException)
            try:
                outcome = "raise " + _first_line(e)
            except Exception:  # noqa: BLE001 - never let the report itself desync the ranks
                outcome = f"raise {type(e).__name__}"
        finally:
            destroy_num_microbatches_calculator()
        everyone = [None] * cfg["world"]
        dist.all_gather_object(everyone, outcome)
        parallel_state.destroy_model_parallel()
        failed = sorted({o for o in everyone if o != "ok"})
        results.append({"id": case["id"], "ok": not failed, "errors": failed})
        if rank == 0:
            print(f"[truth] {case['id']}: {'ok' if not failed else failed[0]}", flush=True)
    if rank == 0:
        with open(cfg["results"], "w") as f:
            json.dump(results, f, indent=1)
