"""Worker side of ``tools/make_sample_ckpts.py``: real Megatron-Core / torch DCP saves on CPU.

Each rank is one process started with ``torch.multiprocessing.start_processes`` (spawn) over
gloo.  Megatron-Core 0.16.1 calls CUDA-only APIs on its training and save paths; they are
redirected to the CPU by :func:`install_cuda_shims`, which each worker calls BEFORE importing
Megatron.  The shims only change *where* tensors live and *what name* ``Tensor.type()``
reports; the bytes written are produced by the real ``megatron.core.dist_checkpointing.save``
(torch_dist), ``torch.save`` (legacy) and ``torch.distributed.checkpoint.save`` (dcp).

Patched (see install_cuda_shims / _patch_megatron_rng):
  * torch.cuda.synchronize / empty_cache / set_device / ...   -> no-ops
  * torch.cuda.current_device()                                -> "cpu"
  * torch.cuda.device_count()                                  -> 1
  * torch.cuda.get_rng_state/set_rng_state/manual_seed(_all),
    torch.cuda.random.*                                        -> a private CPU torch.Generator
    (so the saved ``cuda_rng_state`` is that generator's state)
  * torch.cuda.Stream/stream/current_stream/default_stream     -> dummy stream objects
  * device="cuda"/"cuda:N"/int arguments of tensor factories
    (tensor, zeros, ones, empty, full, arange, rand*, *_like)  -> device="cpu"
  * torch.empty / empty_like / empty_strided                   -> zero-filled (determinism of
    the DistributedOptimizer padding chunks, which are torch.empty)
  * Tensor.cuda()                                              -> identity
  * Tensor.to("cuda"...)                                       -> Tensor.to("cpu"...)
  * Tensor.type() with no argument                             -> "torch.cuda.FloatTensor" etc.
    (DistributedOptimizer / MixedPrecisionOptimizer dispatch on these names)
  * megatron.core.tensor_parallel.random._get_cuda_rng_state /
    _set_cuda_rng_state (they index torch.cuda.default_generators,
    which is empty without CUDA)                               -> the private CPU generator
Outside CUDA, one determinism tweak (format unchanged):
  * torch.distributed.checkpoint.filesystem._generate_uuid     -> seeded uuid4 values, so the
    save_id/load_id recorded in ``.metadata`` (StorageMeta) are reproducible (data files are
    byte-identical across rebuilds; Megatron's .metadata may still differ in storage_data
    order, which its writer gathers from 2 writer processes in completion order).
Nothing else in megatron.core.dist_checkpointing or torch.distributed.checkpoint is patched;
torch.cuda.is_available() stays False.  Only when CKPTINSPECT_WRITE_GATE is set (tests/unit/formats/test_inflight.py),
tools/_write_gate.py wraps the file opens to sleep or SIGSTOP between writes: timing, not content.

Verify mode only (loading back, never on the save path):
  * DistributedOptimizer._set_main_param_and_optimizer_states skips torch AdamW's 'step'
    (0.16.1 KeyError with fully_reshardable on the non-apex/TE path), and the shared 'step'
    tensor Megatron's load_state_dict puts into every param state is un-shared afterwards.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings

# --------------------------------------------------------------------------------------
# CUDA -> CPU shims
# --------------------------------------------------------------------------------------

_SHIMS_INSTALLED = False
_FAKE_CUDA_GEN = None


def _is_cuda_device(dev) -> bool:
    import torch

    if dev is None:
        return False
    if isinstance(dev, bool):
        return False
    if isinstance(dev, int):  # a bare int means "cuda:<int>"
        return True
    if isinstance(dev, str):
        return dev.startswith("cuda")
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    return False


def _fix_device_kw(kwargs):
    if "device" in kwargs and _is_cuda_device(kwargs["device"]):
        kwargs["device"] = "cpu"
    return kwargs


def install_cuda_shims() -> None:
    """Redirect the CUDA calls Megatron-Core makes to the CPU. Idempotent."""
    global _SHIMS_INSTALLED, _FAKE_CUDA_GEN
    if _SHIMS_INSTALLED:
        return
    import contextlib
    import functools

    import torch

    _FAKE_CUDA_GEN = torch.Generator(device="cpu")
    _FAKE_CUDA_GEN.manual_seed(0)
    cuda = torch.cuda

    # NB: every replacement must be a distinct function object, torch._dynamo's trace
    # rules reject one object registered under several torch.cuda names.
    def _noop():
        return lambda *_a, **_k: None

    cuda.synchronize = _noop()
    cuda.empty_cache = _noop()
    cuda.set_device = _noop()
    cuda.reset_peak_memory_stats = _noop()
    cuda.current_device = lambda: "cpu"
    cuda.device_count = lambda: 1
    cuda.memory_allocated = lambda *a, **k: 0
    cuda.max_memory_allocated = lambda *a, **k: 0
    cuda.memory_reserved = lambda *a, **k: 0
    cuda.is_current_stream_capturing = lambda: False

    # RNG: a private CPU generator stands in for the (single) CUDA generator.
    def _get_rng_state(device="cuda"):
        return _FAKE_CUDA_GEN.get_state()

    def _set_rng_state(new_state, device="cuda"):
        _FAKE_CUDA_GEN.set_state(new_state)

    def _manual_seed(seed):
        _FAKE_CUDA_GEN.manual_seed(int(seed))

    cuda.get_rng_state = _get_rng_state
    cuda.set_rng_state = _set_rng_state
    cuda.manual_seed = _manual_seed
    cuda.manual_seed_all = lambda seed: _manual_seed(seed)
    cuda.random.get_rng_state = lambda device="cuda": _get_rng_state(device)
    cuda.random.set_rng_state = lambda s, device="cuda": _set_rng_state(s, device)
    cuda.random.manual_seed = lambda seed: _manual_seed(seed)
    cuda.random.manual_seed_all = lambda seed: _manual_seed(seed)

    class _DummyStream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def wait_event(self, *a, **k):
            pass

        def record_event(self, *a, **k):
            return None

        def synchronize(self):
            pass

        def query(self):
            return True

    _DEFAULT_STREAM = _DummyStream()
    cuda.Stream = _DummyStream
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.current_stream = lambda *a, **k: _DEFAULT_STREAM
    cuda.default_stream = lambda *a, **k: _DEFAULT_STREAM

    # Tensor factories: device="cuda" -> cpu.
    def _wrap_factory(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **_fix_device_kw(kwargs))

        return wrapper

    for name in (
        "tensor", "as_tensor", "zeros", "ones", "full", "arange", "rand", "randn",
        "randint", "randperm", "zeros_like", "ones_like", "full_like",
        "rand_like", "randn_like", "eye", "linspace",
    ):
        setattr(torch, name, _wrap_factory(getattr(torch, name)))

    # torch.empty*: also zero-filled, so that bytes Megatron writes from uninitialised
    # memory (DistributedOptimizer's dp_reshardable padding chunks are torch.empty) are
    # deterministic for a given seed instead of heap garbage.
    def _wrap_empty(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t = fn(*args, **_fix_device_kw(kwargs))
            with torch.no_grad():
                t.zero_()
            return t

        return wrapper

    for name in ("empty", "empty_like", "empty_strided"):
        setattr(torch, name, _wrap_empty(getattr(torch, name)))

    T = torch.Tensor
    T.cuda = lambda self, *a, **k: self

    _orig_to = T.to

    def _to(self, *args, **kwargs):
        args = tuple("cpu" if _is_cuda_device(a) and not isinstance(a, int) else a for a in args)
        return _orig_to(self, *args, **_fix_device_kw(kwargs))

    T.to = _to

    _orig_type = T.type

    def _type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            name = _orig_type(self)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                name = "torch.cuda." + name[len("torch."):]
            return name
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            dtype = "torch." + dtype[len("torch.cuda."):]
        return _orig_type(self, dtype, non_blocking, **kwargs)

    T.type = _type
    _SHIMS_INSTALLED = True


def _patch_megatron_rng() -> None:
    """megatron.core.tensor_parallel.random indexes torch.cuda.default_generators (empty on a
    CPU build); point its two helpers at the private generator instead."""
    from megatron.core.tensor_parallel import random as mrandom

    def _get(device="cuda", clone=False, graph_safe=False):
        return _FAKE_CUDA_GEN.get_state()

    def _set(new_state, device=-1, graph_safe=False):
        _FAKE_CUDA_GEN.set_state(new_state)

    mrandom._get_cuda_rng_state = _get
    mrandom._set_cuda_rng_state = _set


def _seed_dcp_uuids(seed: int, rank: int) -> None:
    import random
    import uuid

    from torch.distributed.checkpoint import filesystem

    rng = random.Random(seed * 1_000_003 + rank)
    filesystem._generate_uuid = lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _quiet() -> None:
    import logging

    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    logging.disable(logging.WARNING)  # megatron logs INFO/WARNING on every rank
    logging.getLogger().setLevel(logging.ERROR)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _init_dist(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group(
        backend="gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _write_tracker(save_dir: str, iteration: int) -> None:
    # training/checkpointing.py: str(iteration), no newline, rank 0, after everything else
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))


def worker_entry(rank: int, cfg: dict) -> None:
    """torch.multiprocessing entry point (must be importable by spawn children)."""
    _quiet()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
        install_cuda_shims()
        if os.environ.get("CKPTINSPECT_WRITE_GATE"):
            import _write_gate  # tests/unit/formats/test_inflight.py: slow the save down or stop it at chosen points

            _write_gate.install()
        _seed_dcp_uuids(cfg["seed"], rank)
        _init_dist(rank, cfg["world"], cfg["port"])
        if cfg["format"] == "dcp":
            _run_dcp(rank, cfg)
        else:
            _run_megatron(rank, cfg)
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stderr.write(f"[make_sample_ckpts rank {rank}] FAILED\n{traceback.format_exc()}\n")
        sys.stderr.flush()
        raise


# --------------------------------------------------------------------------------------
# Megatron-Core (torch_dist / legacy)
# --------------------------------------------------------------------------------------


def _build_args(cfg: dict, iteration: int):
    import argparse

    c = cfg
    gbs = c["micro_batch_size"] * c["dp"] * c["num_microbatches"]
    ckpt_format = {"torch_dist": c.get("backend", "torch_dist"), "legacy": "torch",
                   "nvrx_local": "torch_dist"}[c["format"]]
    a = argparse.Namespace(
        adam_beta1=0.9,
        adam_beta2=0.95,
        add_position_embedding=True,
        async_save=c["half_written"] != "none",
        bf16=False,
        ckpt_format=ckpt_format,
        ckpt_fully_parallel_save=c.get("fully_parallel", True),
        clip_grad=1.0,
        consumed_train_samples=iteration * gbs,
        context_parallel_size=1,
        data_parallel_size=c["dp"],
        dist_ckpt_optim_fully_reshardable=c["optim_sharding"] == "fully_reshardable",
        expert_model_parallel_size=1,
        ffn_hidden_size=4 * c["hidden"],
        fp16=False,
        global_batch_size=gbs,
        group_query_attention=False,
        hidden_size=c["hidden"],
        iteration=iteration,
        kv_channels=c["hidden"] // c["heads"],
        load=c["save_arg"],
        lr=c["lr"],
        lr_decay_style="cosine",
        make_vocab_size_divisible_by=c["make_vocab_size_divisible_by"],
        max_position_embeddings=c["seq_length"],
        micro_batch_size=c["micro_batch_size"],
        min_lr=c["lr"] / 10,
        num_attention_heads=c["heads"],
        num_layers=c["layers"],
        num_query_groups=c["heads"],
        padded_vocab_size=c["padded_vocab_size"],
        pipeline_model_parallel_size=c["pp"],
        position_embedding_type="learned_absolute",
        save=c["save_arg"],
        save_interval=1,
        seed=c["seed"],
        seq_length=c["seq_length"],
        tensor_model_parallel_size=c["tp"],
        tokenizer_type="GPT2BPETokenizer",
        train_iters=c["train_iters"],
        untie_embeddings_and_output_weights=True,
        use_distributed_optimizer=True,
        vocab_file="gpt2-vocab.json",
        vocab_size=c["vocab_size"],
        weight_decay=0.1,
        world_size=c["world"],
    )
    return a


def _get_rng_state_dict():
    """training/checkpointing.py get_rng_state(): one rng dict (no data_parallel_random_init)."""
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state(),  # shim: private CPU generator state
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def _uses_msc(cfg: dict) -> bool:
    """Whether the save goes through multistorageclient (make_sample_ckpts DEFAULTS `msc`)."""
    return bool(cfg.get("msc", True))


def _run_megatron(rank: int, cfg: dict) -> None:
    import random

    import numpy as np
    import torch
    import torch.distributed as dist

    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

    _patch_megatron_rng()
    if not _uses_msc(cfg):
        # Megatron-LM --disable-msc (training/initialize.py): megatron-core then writes with plain open()
        from megatron.core.msc_utils import MultiStorageClientFeature

        MultiStorageClientFeature.disable()
    if mcore_release() < (0, 16, 0):
        _patch_distopt_state_without_step()
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import (
        RerunMode,
        get_rerun_state_machine,
        initialize_rerun_state_machine,
    )
    from megatron.core.transformer import TransformerConfig

    c = cfg
    tp, pp, dp = c["tp"], c["pp"], c["dp"]
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)

    # training/initialize.py _set_random_seed
    seed = c["seed"] + 100 * pp_rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)

    gbs = c["micro_batch_size"] * dp * c["num_microbatches"]
    init_num_microbatches_calculator(rank, None, gbs, c["micro_batch_size"], dp)
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)

    config = TransformerConfig(
        num_layers=c["layers"],
        hidden_size=c["hidden"],
        num_attention_heads=c["heads"],
        ffn_hidden_size=4 * c["hidden"],
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        init_method_std=0.02,
        sequence_parallel=False,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=c["padded_vocab_size"],
        max_sequence_length=c["seq_length"],
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="learned_absolute",
    )
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=False,
        overlap_grad_reduce=False,
        use_distributed_optimizer=True,
        check_for_nan_in_grad=False,
        bucket_size=None,
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=c["lr"],
            min_lr=c["lr"] / 10,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            clip_grad=1.0,
            use_distributed_optimizer=True,
            params_dtype=torch.float32,
        ),
        [model],
    )
    sched = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=c["lr"],
        min_lr=c["lr"] / 10,
        lr_warmup_steps=0,
        lr_decay_steps=c["train_iters"] * gbs,
        lr_decay_style="cosine",
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=c["train_iters"] * gbs,
        wd_incr_style="constant",
    )

    # Data: random tokens, identical on every TP/PP rank of a DP replica.
    seq = c["seq_length"]
    mbs = c["micro_batch_size"]
    attn_mask = torch.tril(torch.ones((1, 1, seq, seq))) < 0.5
    position_ids = torch.arange(seq).unsqueeze(0).expand(mbs, seq)
    forward_step = gpt_forward_step(position_ids, attn_mask)

    fwd_bwd = get_forward_backward_func()
    it = token_batches(c["seed"] * 1000 + dp_rank, c["vocab_size"], mbs, seq)
    save_root = c["out_dir"]
    rsm = get_rerun_state_machine()
    flops_per_iter = 6.0 * gbs * seq * (12 * c["layers"] * c["hidden"] ** 2)

    for iteration in range(1, max(c["iterations"]) + 1):
        # One training step (training.py train_step).
        while rsm.should_run_forward_backward(None):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            fwd_bwd(
                forward_step_func=forward_step,
                data_iterator=it,
                model=[model],
                num_microbatches=c["num_microbatches"],
                seq_length=seq,
                micro_batch_size=mbs,
                forward_only=False,
            )
        optimizer_step(optimizer, sched, gbs, iteration)
        if iteration not in c["iterations"]:
            continue
        if c.get("value_faults", "none") != "none":
            import _value_faults  # in memory, before the real save below

            _value_faults.apply(c["value_faults"], [model], optimizer,
                                lambda m: print(f"[value_faults rank {rank}] {m}", flush=True))
        half = c["half_written"] if iteration == max(c["iterations"]) else "none"
        ckpt_dir = os.path.join(save_root, f"iter_{iteration:07d}")
        if c.get("mode") == "verify":
            if half == "none":
                _verify_load(c, model, optimizer, ckpt_dir, dist_checkpointing, parallel_state)
            continue
        args = _build_args(c, iteration)
        if rank == 0 and c["format"] != "nvrx_local":
            os.makedirs(ckpt_dir, exist_ok=True)
        dist.barrier()
        common = {
            "args": args,
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "opt_param_scheduler": sched.state_dict(),
            "num_floating_point_operations_so_far": flops_per_iter * iteration,
        }
        rng = _get_rng_state_dict()
        if c["format"] == "torch_dist":
            _save_torch_dist(
                c, model, optimizer, common, rng, ckpt_dir, half, rsm,
                dist_checkpointing, ShardedObject, FullyParallelSaveStrategyWrapper,
                TorchDistSaveShardedStrategy, parallel_state,
            )
        elif c["format"] == "nvrx_local":
            import _stacks_cpu  # NVRx local checkpoints (needs nvidia-resiliency-ext)

            _stacks_cpu.save_nvrx_local(c, model, optimizer, common, rng, rsm, parallel_state, iteration)
        else:
            _save_legacy(c, model, optimizer, common, rng, ckpt_dir, parallel_state)
        dist.barrier()
        if half == "none" and rank == 0 and c["format"] != "nvrx_local":  # NVRx writes no tracker
            _write_tracker(save_root, iteration)  # last, after every rank is done
        dist.barrier()
    parallel_state.destroy_model_parallel()


def _save_torch_dist(c, model, optimizer, common, rng, ckpt_dir, half, rsm, dist_checkpointing,
                     ShardedObject, FullyParallelSaveStrategyWrapper,
                     TorchDistSaveShardedStrategy, parallel_state):
    import torch.distributed as dist

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)

    metadata = _content_metadata(c)

    state_dict = dict(common)
    model_sd = model.module.sharded_state_dict(metadata=metadata)
    state_dict["model"] = model_sd
    state_dict["optimizer"] = optimizer.sharded_state_dict(model_sd, metadata=metadata)
    # get_rng_state(ckpt_format='torch_dist'): ShardedObject over (PP, TP), replica = DP rank
    state_dict["rng_state"] = ShardedObject(
        "rng_state",
        [rng],
        (parallel_state.get_pipeline_model_parallel_world_size(),
         parallel_state.get_tensor_model_parallel_world_size()),
        (pp_rank, tp_rank),
        replica_id=dp_rank,
    )
    # force=True: in 0.16.1 state_dict() returns None outside of a rerun (state
    # NOT_RUNNING_YET); newer Megatron always saves it, and it is the world-size witness.
    # (0.13.x has no `force` and always returns the state.)
    import inspect

    rsm_kw = {"force": True} if "force" in inspect.signature(rsm.state_dict).parameters else {}
    state_dict["rerun_state_machine"] = rsm.state_dict(
        data_iterator=None, ckpt_format="torch_dist", **rsm_kw
    )

    if c.get("backend", "torch_dist") == "zarr":
        # <= 0.15: strategies/zarr.py (needs the `zarr<3` package), version 1 like Megatron's
        # get_default_save_sharded_strategy('zarr').
        from megatron.core.dist_checkpointing.strategies.zarr import ZarrSaveShardedStrategy

        strategy = ZarrSaveShardedStrategy("zarr", 1)
    else:
        strategy = TorchDistSaveShardedStrategy("torch_dist", 1)
    if c.get("fully_parallel", True):  # --no-ckpt-fully-parallel-save leaves DP rank 0 writing the weights
        strategy = FullyParallelSaveStrategyWrapper(
            strategy, parallel_state.get_data_parallel_group(with_context_parallel=True),
        )
    if half == "none":
        dist_checkpointing.save(
            state_dict,
            ckpt_dir,
            sharded_strategy=strategy,
            validate_access_integrity=True,
            content_metadata=metadata,
        )
        return
    # Real async path, stopped before the finalize fns (a crash between them).
    req = dist_checkpointing.save(
        state_dict,
        ckpt_dir,
        sharded_strategy=strategy,
        validate_access_integrity=True,
        async_sharded_save=True,
        content_metadata=metadata,
    )
    fn_args = list(req.async_fn_args)
    if req.preload_fn is not None:
        fn_args[1] = req.preload_fn()
    if req.async_fn is not None:
        req.async_fn(*fn_args, **(req.async_fn_kwargs or {}))
    dist.barrier()
    if half == "before_metadata_json":
        # finalize_fns = [DCP finalize (.metadata), metadata.json]; run only the first
        req.finalize_fns[0]()
    dist.barrier()


def mcore_release() -> tuple[int, int, int]:
    """The installed megatron-core release as (major, minor, patch)."""
    from megatron.core import package_info

    return tuple(int(x) for x in package_info.__shortversion__.split(".")[:3])


def _content_metadata(c: dict) -> dict:
    """training/checkpointing.py _build_sharded_state_dict_metadata of the installed release.

    0.13.x: only ``distrib_optim_sharding_type`` (content_metadata itself is new in 0.13);
    0.14.0 adds ``singleton_local_shards`` and ``chained_optim_avoid_prefix``; 0.15+ adds
    ``distrib_optim_fully_reshardable_mem_efficient`` for fully_reshardable.  The DistOpt
    sharding types each release knows differ too (0.13/0.14: fully_sharded_model_space,
    dp_zero_gather_scatter, fully_sharded_bucket_space; 0.15: + dp_reshardable,
    fully_reshardable; 0.16: flattened fully_sharded_model_space can no longer be written).
    """
    rel = mcore_release()
    metadata = {"distrib_optim_sharding_type": c["optim_sharding"]}
    if rel >= (0, 14, 0):
        metadata["singleton_local_shards"] = False
        metadata["chained_optim_avoid_prefix"] = True
    if c["optim_sharding"] == "fully_reshardable":
        metadata["distrib_optim_fully_reshardable_mem_efficient"] = False
    return metadata


def token_batches(seed, vocab_size, mbs, seq, window=slice(None)):
    """Random (tokens, labels) micro-batches for every sample writer: (mbs, seq + 1) tokens drawn from a generator
    seeded with `seed` (one per DP replica), shifted by one; `window` cuts each sequence (a CP rank's part)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    while True:
        toks = torch.randint(0, vocab_size, (mbs, seq + 1), generator=gen)
        yield toks[:, :-1][:, window].contiguous(), toks[:, 1:][:, window].contiguous()


def optimizer_step(optimizer, sched, gbs, iteration):
    """The end of training.py's train_step: the optimizer step (a skipped one is an error here: every sample must
    hold trained state) and the scheduler's increment by the global batch."""
    ok, _grad_norm, _zeros = optimizer.step()
    if not ok:
        raise RuntimeError(f"optimizer.step() was skipped at iteration {iteration}")
    sched.step(increment=gbs)


def gpt_forward_step(position_ids, attn_mask):
    """The forward step every sample writer hands Megatron's pipeline schedule: the GPT on one batch of random
    tokens, loss = the mean LM loss (a real backward / optimizer step follows in the schedule)."""

    def forward_step(data_iterator, model_):
        tokens, labels = next(data_iterator)
        out = model_(tokens, position_ids, attn_mask, labels=labels)

        def loss_func(output_tensor):
            loss = output_tensor.float().mean()
            return loss, {"lm loss": loss.detach()}

        return out, loss_func

    return forward_step


def _patch_distopt_state_without_step() -> None:
    """Save-path CPU care for megatron-core 0.14/0.15: DistributedOptimizer.
    _get_main_param_and_optimizer_states returns every key of the inner optimizer's param
    state.  On GPU that is apex/TE FusedAdam, whose per-param state is exp_avg/exp_avg_sq only;
    on CPU it is torch AdamW, which adds a 0-dim 'step' -> the dp_reshardable writer asserts
    (shape () vs the bucket slice).  Drop 'step' from the returned dict so the state written is
    the GPU one (the step lives in param_groups, as with FusedAdam).  0.16+ filters it itself."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    fn = getattr(DistributedOptimizer, "_get_main_param_and_optimizer_states", None)
    if fn is None or getattr(DistributedOptimizer, "_ckptinspect_nostep", False):
        return

    def patched(self, model_param):
        tensors = fn(self, model_param)
        tensors.pop("step", None)
        return tensors

    DistributedOptimizer._get_main_param_and_optimizer_states = patched
    DistributedOptimizer._ckptinspect_nostep = True


def _patch_distopt_step_for_torch_adam() -> None:
    """Verify-only workaround: megatron-core 0.16.1 DistributedOptimizer.
    _set_main_param_and_optimizer_states copies every key of the inner optimizer state,
    but with torch's AdamW (no apex/TE, i.e. CPU) that state also has 'step', which the
    fully_reshardable loader never provides -> KeyError('step').  Skip 'step' there (the
    loaders set it from param_groups).  Saving never goes through this function."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if getattr(DistributedOptimizer, "_ckptinspect_step_patch", False) or not hasattr(
        DistributedOptimizer, "_set_main_param_and_optimizer_states"
    ):
        return
    orig = DistributedOptimizer._set_main_param_and_optimizer_states

    def patched(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state[main_param]
        step = state.pop("step") if ("step" in state and "step" not in tensors) else None
        try:
            orig(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    DistributedOptimizer._set_main_param_and_optimizer_states = patched
    DistributedOptimizer._ckptinspect_step_patch = True


def _verify_load(c, model, optimizer, ckpt_dir, dist_checkpointing, parallel_state):
    """Load ``ckpt_dir`` back with Megatron's own loaders into a model/optimizer that has
    been re-trained to the same iteration (training is deterministic), after scrambling the
    live state, and require bit-identical params and Adam moments."""
    import torch

    inner = optimizer.optimizer

    def snapshot():
        m = {k: v.detach().clone() for k, v in model.module.state_dict().items()
             if isinstance(v, torch.Tensor)}
        o = [{k: t.detach().clone() for k, t in inner.state[p].items()
              if isinstance(t, torch.Tensor) and t.dim() > 0}
             for g in inner.param_groups for p in g["params"]]
        mp = [p.detach().clone() for g in inner.param_groups for p in g["params"]]
        return m, o, mp

    _patch_distopt_step_for_torch_adam()
    before = snapshot()
    with torch.no_grad():  # scramble: the load must restore everything
        for p in model.parameters():
            p.add_(1.0)
        for st in inner.state.values():
            for t in st.values():
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    t.mul_(0.5).add_(3.0)
    if c["format"] == "torch_dist":
        metadata = dist_checkpointing.load_content_metadata(ckpt_dir)
        model_sd = model.module.sharded_state_dict(metadata=metadata)
        sd = {
            "model": model_sd,
            "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True,
                                                      metadata=metadata),
        }
        loaded = dist_checkpointing.load(sd, ckpt_dir)
        # no_grad: with fp32 params DistOpt's main params are views of the (requires_grad)
        # model params, and its in-place copy_ would be rejected by autograd otherwise.
        with torch.no_grad():
            model.module.load_state_dict(loaded["model"])
            optimizer.load_state_dict(loaded["optimizer"])
    else:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        sub = f"mp_rank_{tp_rank:02d}" if c["pp"] == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
        d = os.path.join(ckpt_dir, sub)
        sd = torch.load(os.path.join(d, "model_optim_rng.pt"), weights_only=False)
        with torch.no_grad():
            model.module.load_state_dict(sd["model"])
            optimizer.load_state_dict(sd["optimizer"])
            optimizer.load_parameter_state(os.path.join(d, "distrib_optim.pt"))
    # Megatron 0.16.1 without apex/TE (torch AdamW) puts ONE shared 'step' tensor into every
    # param's state on load (distrib_optimizer.py load_state_dict), which torch's AdamW then
    # increments once per param -> wrong bias correction on the next step.  Un-share it so
    # training can continue from the loaded state (does not affect what is compared here).
    for st in inner.state.values():
        if isinstance(st.get("step"), torch.Tensor):
            st["step"] = st["step"].clone()
    after = snapshot()
    bad = [k for k in before[0] if not torch.equal(before[0][k], after[0][k])]
    bad += [f"optim state {i}.{k}" for i, (a, b) in enumerate(zip(before[1], after[1]))
            for k in a if not torch.equal(a[k], b[k])]
    bad += [f"main param {i}" for i, (a, b) in enumerate(zip(before[2], after[2]))
            if not torch.equal(a, b)]
    if not any(t.abs().sum() > 0 for st in before[1] for t in st.values()):
        bad.append("Adam moments are all zero")
    if bad:
        raise AssertionError(f"verify {ckpt_dir}: mismatch after load: {bad[:10]}")
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        print(f"[verify] {ckpt_dir}: Megatron load restored params and Adam state exactly",
              flush=True)


def _save_legacy(c, model, optimizer, common, rng, ckpt_dir, parallel_state):
    import torch

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    sub = f"mp_rank_{tp_rank:02d}" if c["pp"] == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    d = os.path.join(ckpt_dir, sub)
    if dp_rank == 0:
        os.makedirs(d, exist_ok=True)
    torch.distributed.barrier()
    # distrib_optim.pt first (gathers over the DP group; DP rank 0 writes)
    optimizer.save_parameter_state(os.path.join(d, "distrib_optim.pt"))
    if dp_rank == 0:
        state_dict = dict(common)
        state_dict["model"] = model.module.state_dict_for_save_checkpoint()
        state_dict["optimizer"] = optimizer.state_dict()
        state_dict["rng_state"] = [rng]
        torch.save(state_dict, os.path.join(d, "model_optim_rng.pt"))


# --------------------------------------------------------------------------------------
# Plain PyTorch DCP (torchtitan-style)
# --------------------------------------------------------------------------------------


def _run_dcp(rank: int, cfg: dict) -> None:
    """torchtitan-style save: FSDP2-like DTensor params on a CPU device mesh, real
    ``torch.distributed.checkpoint.save`` with the default FileSystemWriter."""
    import io

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    world = cfg["world"]
    torch.manual_seed(cfg["seed"])
    if cfg["dcp_mesh"] == "2d":
        assert world % 2 == 0 and world >= 4, "2-D mesh needs an even world size >= 4"
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_shard", "tp"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))

    def placements(t):
        if mesh.ndim == 1:
            return [Shard(0)]
        # 2-D: matrices sharded on both mesh dims, vectors replicated over "tp"
        return [Shard(0), Shard(1)] if t.dim() == 2 else [Shard(0), Replicate()]

    h, v = cfg["hidden"], cfg["vocab_size"]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = torch.nn.LayerNorm(h)
            self.wqkv = torch.nn.Linear(h, 3 * h, bias=False)
            self.wo = torch.nn.Linear(h, h, bias=False)
            self.ffn_norm = torch.nn.LayerNorm(h)
            self.w1 = torch.nn.Linear(h, 4 * h, bias=False)
            self.w2 = torch.nn.Linear(4 * h, h, bias=False)

        def forward(self, x):
            q, k, vv = self.wqkv(self.attention_norm(x)).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / h**0.5, dim=-1) @ vv
            x = x + self.wo(a)
            return x + self.w2(torch.nn.functional.gelu(self.w1(self.ffn_norm(x))))

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = torch.nn.Embedding(v, h)
            self.layers = torch.nn.ModuleDict({str(i): Block() for i in range(cfg["layers"])})
            self.norm = torch.nn.LayerNorm(h)
            self.output = torch.nn.Linear(h, v, bias=False)

        def forward(self, x):
            x = self.tok_embeddings(x)
            for blk in self.layers.values():
                x = blk(x)
            return self.output(self.norm(x))

    model = Tiny()
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            dt = distribute_tensor(p.data, mesh, placements(p.data))
            mod.register_parameter(name, torch.nn.Parameter(dt))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    step = cfg["dcp_step"]

    # One step: forward on the gathered params, average grads, shard them like the params.
    names = [n for n, _ in model.named_parameters()]
    full = {n: p.full_tensor().requires_grad_(True) for n, p in model.named_parameters()}
    toks = torch.randint(0, v, (2, cfg["seq_length"] + 1), generator=gen)
    logits = torch.func.functional_call(model, full, (toks[:, :-1],))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, v), toks[:, 1:].reshape(-1))
    grads = torch.autograd.grad(loss, [full[n] for n in names])
    for (n, p), g in zip(model.named_parameters(), grads):
        g = g.contiguous()
        dist.all_reduce(g)
        p.grad = distribute_tensor(g / world, mesh, list(p.placements))
    opt.step()
    opt.zero_grad()

    model_sd, optim_sd = get_state_dict(model, opt)
    assert all(isinstance(t, DTensor) for t in model_sd.values())
    log_steps = io.BytesIO()
    torch.save([1, step], log_steps)
    tokens = step * 2 * cfg["seq_length"] * world
    state = {
        "model": model_sd,
        "optimizer": optim_sd,
        "lr_scheduler": {"last_epoch": step, "base_lrs": [cfg["lr"]], "_step_count": step + 1},
        # torchtitan TrainState.state_dict(): tensors + a BytesIO blob
        "train_state": {
            "step": torch.tensor(step, dtype=torch.int32),
            "ntokens_seen": torch.tensor(tokens, dtype=torch.int64),
            "log_steps": log_steps,
        },
    }
    ckpt_dir = os.path.join(cfg["out_dir"], f"step-{step}")
    dcp.save(state, checkpoint_id=ckpt_dir)
    dist.barrier()
