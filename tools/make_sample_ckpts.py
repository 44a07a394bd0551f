#!/usr/bin/env python
"""Write real Megatron-Core 0.16.1 / PyTorch-DCP checkpoints on CPU, and rebuild sample_ckpts/.

    python tools/make_sample_ckpts.py                      # rebuild sample_ckpts/ (seeded)
    python tools/make_sample_ckpts.py --out DIR --format torch_dist --tp 2 --pp 2 --dp 2 \
        --layers 4 --hidden 32 --heads 4 --vocab-size 200 --make-vocab-size-divisible-by 128 \
        --optim-sharding dp_reshardable --iterations 1 2 --half-written before_metadata \
        --seed 1234

Python API (importable by path; importing is cheap, torch/megatron load only in workers):

    make_checkpoint(out_dir, format="torch_dist", tp=2, pp=2, dp=2, layers=2, hidden=16,
                    heads=4, vocab_size=100, make_vocab_size_divisible_by=64,
                    optim_sharding="dp_reshardable", iterations=(1,), half_written="none",
                    seed=1234, seq_length=16, micro_batch_size=2, num_microbatches=1,
                    lr=1e-3, train_iters=10, dcp_step=10, dcp_mesh="1d", msc=True,
                    timeout=600) -> str
        # msc=False: Megatron-LM's --disable-msc (plain open() writes, not multistorageclient's
        # atomic .<name>.tmp + rename); CKPTINSPECT_WRITE_GATE in the environment slows or stops
        # the writes (tools/_write_gate.py, used by tests/unit/formats/test_inflight.py)
    verify_checkpoint(out_dir, timeout=600, **same_kwargs)   # Megatron load round trip
    build_samples(root="sample_ckpts", only=None, verify=False) -> {name: seconds}
    padded_vocab_size(vocab_size, make_vocab_size_divisible_by, tp) -> int
    SAMPLES  # {name: make_checkpoint kwargs} of the committed samples
    make_dcp_zstd(out_dir)  # sample_ckpts/dcp_zstd: a zstd-compressed DCP save (DIRECT_SAMPLES)

One process per rank (torch.multiprocessing spawn, gloo, 127.0.0.1, a free port).  The
world size is tp*pp*dp for torch_dist/legacy and dp for dcp.  The actual checkpoint writing
is done by the real libraries; see tools/_mcore_cpu.py for the CUDA->CPU shims.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time

_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TOOLS_DIR)

FORMATS = ("torch_dist", "legacy", "dcp", "nvrx_local")  # nvrx_local: tools/_stacks_cpu.py
# dp_reshardable / fully_reshardable: megatron-core >= 0.15 (fully_reshardable also 0.16+);
# fully_sharded_model_space (flattened, mcore_data) and dp_zero_gather_scatter: <= 0.15 (the
# only two DistOpt formats 0.13.x / 0.14.0 offer besides the deprecated bucket space one).
OPTIM_SHARDINGS = ("dp_reshardable", "fully_reshardable", "fully_sharded_model_space",
                   "dp_zero_gather_scatter")
BACKENDS = ("torch_dist", "zarr")  # zarr: megatron-core <= 0.15 only (needs `zarr<3`)
HALF_WRITTEN = ("none", "before_metadata", "before_metadata_json")
VALUE_FAULTS = ("none", "weights", "moments", "desync")  # tools/_value_faults.py


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int, tp: int) -> int:
    """Megatron training's _vocab_size_with_padding (multiple of divisible_by * TP)."""
    multiple = make_vocab_size_divisible_by * tp
    return ((vocab_size + multiple - 1) // multiple) * multiple


DEFAULTS = dict(
    fully_parallel=True,  # False: Megatron's --no-ckpt-fully-parallel-save (DP rank 0 writes the weights)
    # False: Megatron-LM's --disable-msc (plain open() writes); True writes through multistorageclient when it is
    # installed (megatron-core's default: atomic .<name>.tmp + rename per file)
    msc=True,
    format="torch_dist", tp=2, pp=2, dp=2, layers=2, hidden=16, heads=4, vocab_size=100,
    make_vocab_size_divisible_by=64, optim_sharding="dp_reshardable", iterations=(1,),
    half_written="none", seed=1234, seq_length=16, micro_batch_size=2, num_microbatches=1,
    lr=1e-3, train_iters=10, dcp_step=10, dcp_mesh="1d", backend="torch_dist",
    # parallel layouts (tools/_mcore_layouts.py); the defaults keep the dense EP=1 samples above
    cp=1, ep=1, etp=None, vpp=None, experts=0, topk=2, swiglu=False, bf16=False,
    # tools/_value_faults.py: a named fault put into the model / optimizer in memory before the real save
    value_faults="none",
)
LAYOUT_DEFAULTS = dict(cp=1, ep=1, etp=None, vpp=None, experts=0, topk=2, swiglu=False, bf16=False)


def _config(out_dir: str, **config) -> dict:
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown checkpoint option(s): {sorted(unknown)}")
    c = {**DEFAULTS, **config}
    if c["format"] not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {c['format']!r}")
    if c["optim_sharding"] not in OPTIM_SHARDINGS:
        raise ValueError(f"optim_sharding must be one of {OPTIM_SHARDINGS}")
    if c["backend"] not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if c["backend"] != "torch_dist" and c["format"] != "torch_dist":
        raise ValueError("backend is only meaningful for format='torch_dist'")
    if c["half_written"] not in HALF_WRITTEN:
        raise ValueError(f"half_written must be one of {HALF_WRITTEN}")
    if c["half_written"] != "none" and c["format"] != "torch_dist":
        raise ValueError("half_written is only supported for format='torch_dist'")
    if c["value_faults"] not in VALUE_FAULTS:
        raise ValueError(f"value_faults must be one of {VALUE_FAULTS}")
    if c["value_faults"] != "none" and c["format"] != "torch_dist":
        raise ValueError("value_faults needs format='torch_dist'")
    if c["dcp_mesh"] not in ("1d", "2d"):
        raise ValueError("dcp_mesh must be '1d' or '2d'")
    c["iterations"] = sorted({int(i) for i in c["iterations"]})
    if not c["iterations"] or c["iterations"][0] < 1:
        raise ValueError("iterations must be positive integers")
    tp, pp, dp = c["tp"], c["pp"], c["dp"]
    if min(tp, pp, dp) < 1:
        raise ValueError("tp, pp and dp must be >= 1")
    if c["hidden"] % c["heads"] or c["heads"] % tp or (4 * c["hidden"]) % tp:
        raise ValueError("hidden must be divisible by heads, heads and 4*hidden by tp")
    if c["format"] != "dcp" and c["layers"] % pp:
        raise ValueError("layers must be divisible by pp")
    if c["format"] == "dcp" and c["dcp_mesh"] == "2d" and (dp < 4 or dp % 2):
        raise ValueError("dcp_mesh='2d' needs an even dp >= 4")
    c["layouts"] = any(c[k] != v for k, v in LAYOUT_DEFAULTS.items())
    if c["layouts"]:
        _check_layouts(c)
    c["world"] = dp if c["format"] == "dcp" else tp * pp * c["cp"] * dp
    c["padded_vocab_size"] = padded_vocab_size(
        c["vocab_size"], c["make_vocab_size_divisible_by"], tp)
    c["train_iters"] = max(c["train_iters"], c["iterations"][-1])
    c["out_dir"] = c["save_arg"] = out_dir  # args.save / args.load record it as given
    c["port"] = _free_port()
    c["mode"] = "save"
    return c


def _check_layouts(c: dict) -> None:
    """Options of the parallel-layout samples (MoE/EP/ETP, VPP, CP, SwiGLU, bf16)."""
    if c["format"] not in ("torch_dist", "legacy"):
        raise ValueError("cp/ep/etp/vpp/experts/swiglu/bf16 need format torch_dist or legacy")
    if c["half_written"] != "none":
        raise ValueError("half_written is not supported with the layout options")
    c["etp"] = c["etp"] or c["tp"]  # Megatron-LM validate_args: ETP defaults to TP
    if min(c["cp"], c["ep"], c["etp"]) < 1 or (c["vpp"] is not None and c["vpp"] < 2):
        raise ValueError("cp, ep, etp must be >= 1 and vpp >= 2 (or None)")
    if c["ep"] > 1 and not c["experts"]:
        raise ValueError("ep > 1 needs experts")
    if c["experts"] and (c["experts"] % c["ep"] or c["topk"] > c["experts"]):
        raise ValueError("experts must be divisible by ep, and topk <= experts")
    if c["vpp"] and (c["pp"] < 2 or c["layers"] % (c["pp"] * c["vpp"])):
        raise ValueError("vpp needs pp >= 2 and layers divisible by pp * vpp")
    if c["vpp"] and c["num_microbatches"] % c["pp"]:
        raise ValueError("vpp needs num_microbatches divisible by pp (interleaved schedule)")
    if c["seq_length"] % c["cp"]:
        raise ValueError("seq_length must be divisible by cp")
    world = c["tp"] * c["pp"] * c["cp"] * c["dp"]
    if (world // c["pp"]) % (c["etp"] * c["ep"]):
        raise ValueError("tp*cp*dp must be divisible by etp*ep (parallel_state expert groups)")


def make_checkpoint(
    out_dir,
    format: str = "torch_dist",  # noqa: A002 - mirrors the CLI flag
    tp: int = 2,
    pp: int = 2,
    dp: int = 2,
    layers: int = 2,
    hidden: int = 16,
    heads: int = 4,
    vocab_size: int = 100,
    make_vocab_size_divisible_by: int = 64,
    optim_sharding: str = "dp_reshardable",
    iterations=(1,),
    half_written: str = "none",
    fully_parallel: bool = True,
    seed: int = 1234,
    seq_length: int = 16,
    micro_batch_size: int = 2,
    num_microbatches: int = 1,
    lr: float = 1e-3,
    train_iters: int = 10,
    dcp_step: int = 10,
    dcp_mesh: str = "1d",
    backend: str = "torch_dist",
    timeout: float = 600.0,
    value_faults: str = "none",
    **layouts,
) -> str:
    """Write one save dir at ``out_dir`` and return its path.

    torch_dist/legacy: ``out_dir/iter_%07d/...`` for every iteration in ``iterations`` (one
    optimizer step per iteration number, saves at the listed ones) and the tracker
    ``latest_checkpointed_iteration.txt`` naming the last *complete* one.  ``half_written``
    applies to the last listed iteration only (torch_dist only).  World size = tp*pp*dp.
    dcp: ``out_dir/step-<dcp_step>/`` (no tracker, no metadata.json); world size = dp,
    DTensors on a 1-D ("dp_shard") or 2-D ("dp_shard", "tp") CPU mesh (``dcp_mesh``).
    Raises ValueError for a bad config, RuntimeError if any rank fails or the run exceeds
    ``timeout`` seconds (all workers are terminated).
    ``backend``: the dist_checkpointing save backend (``zarr`` needs megatron-core <= 0.15).
    ``value_faults``: none / weights / moments / desync (tools/_value_faults.py), applied on every rank to its
    local shard after the optimizer step of each saved iteration and before dist_checkpointing.save.
    ``layouts``: cp, ep, etp, vpp, experts, topk, swiglu, bf16 (see LAYOUT_DEFAULTS); any
    non-default value routes the run through tools/_mcore_layouts.py; world = tp*pp*cp*dp.
    """
    out_dir = os.fspath(out_dir)
    cfg = _config(out_dir, format=format, tp=tp, pp=pp, dp=dp, layers=layers, hidden=hidden,
                  heads=heads, vocab_size=vocab_size,
                  make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                  optim_sharding=optim_sharding, iterations=iterations,
                  half_written=half_written, fully_parallel=fully_parallel, seed=seed,
                  seq_length=seq_length,
                  micro_batch_size=micro_batch_size, num_microbatches=num_microbatches, lr=lr,
                  train_iters=train_iters, dcp_step=dcp_step, dcp_mesh=dcp_mesh,
                  backend=backend, value_faults=value_faults, **layouts)
    os.makedirs(out_dir, exist_ok=True)
    _spawn(cfg, cfg["world"], timeout)
    return out_dir


def verify_checkpoint(out_dir, timeout: float = 600.0, **config) -> None:
    """Re-run the same seeded training in fresh workers and load every complete iteration of
    ``out_dir`` (written by make_checkpoint with the same ``config``) with Megatron's own
    loaders (dist_checkpointing.load / torch.load + load_parameter_state); raise
    RuntimeError unless params and Adam moments come back bit-identical.  torch_dist/legacy.
    """
    cfg = _config(os.fspath(out_dir), **config)
    if cfg["format"] == "dcp":
        raise ValueError("verify_checkpoint supports torch_dist and legacy only")
    if cfg["layouts"]:
        raise ValueError("the layout samples are checked by run_ground_truth (Megatron loads at "
                         "the saved and at changed topologies), not by verify_checkpoint")
    cfg["mode"] = "verify"
    _spawn(cfg, cfg["world"], timeout)


def run_ground_truth(cases, world: int, root: str = "sample_ckpts", seed: int = 1234,
                     timeout: float = 600.0) -> dict:
    """Megatron's own loads of the layout samples, batched in ONE spawn of ``world`` ranks.

    ``cases``: dicts ``{id, sample, topology: {tp, pp, cp, ep, etp, vpp}, optim: bool,
    rng: bool (default True)}``; ``sample`` names a SAMPLES entry (its model), ``topology`` the
    run that loads it (missing keys: as saved; dp = world / (tp*pp*cp)).  Each case builds
    that run's model and optimizer and loads the sample's tracked iteration the way
    Megatron-LM's load_checkpoint does (see tools/_mcore_layouts.py).  Returns
    ``{id: {"ok": bool, "errors": [one line per distinct rank error]}}``.
    """
    import json
    import tempfile

    built = []
    for case in cases:
        kw = dict(SAMPLES[case["sample"]])
        kw.pop("iterations", None)
        topo = {**{k: kw.get(k, DEFAULTS[k]) for k in ("tp", "pp", "cp", "ep", "etp", "vpp")},
                **case.get("topology", {})}
        if (topo["tp"] * topo["pp"] * topo["cp"]) == 0 or world % (
                topo["tp"] * topo["pp"] * topo["cp"]):
            raise ValueError(f"{case['id']}: world {world} is not divisible by tp*pp*cp")
        kw.update(topo, dp=world // (topo["tp"] * topo["pp"] * topo["cp"]))
        save_dir = os.path.join(_REPO_ROOT, root, case["sample"])
        with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt")) as f:
            it = int(f.read().strip())
        c = _config(save_dir, **kw)
        c["layouts"] = True
        built.append({"id": case["id"], "ckpt": os.path.join(save_dir, f"iter_{it:07d}"),
                      "optim": bool(case.get("optim", True)), "rng": case.get("rng", True),
                      "cfg": c})
    with tempfile.TemporaryDirectory(prefix="ckpt_truth_") as tmp:
        results = os.path.join(tmp, "results.json")
        cfg = {"mode": "truth", "world": world, "seed": seed, "port": _free_port(),
               "cases": built, "results": results, "format": "truth", "out_dir": tmp}
        _spawn(cfg, world, timeout)
        with open(results) as f:
            return {r["id"]: {"ok": r["ok"], "errors": r["errors"]} for r in json.load(f)}


def _spawn(cfg: dict, nprocs: int, timeout: float) -> None:
    # The spawn children unpickle the entry point by module name: make `_mcore_cpu`
    # importable as a top-level module (sys.path is forwarded to spawn children).
    if _TOOLS_DIR not in sys.path:
        sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu  # noqa: E402  (cheap: no torch import at module level)
    import torch.multiprocessing as tmp

    entry = _mcore_cpu.worker_entry
    if cfg.get("layouts") or cfg.get("mode") == "truth":
        import _mcore_layouts  # noqa: E402

        entry = _mcore_layouts.worker_entry

    env_backup = {k: os.environ.get(k) for k in ("PYTHONWARNINGS", "OMP_NUM_THREADS",
                                                  "GLOO_SOCKET_IFNAME")}
    os.environ["PYTHONWARNINGS"] = "ignore"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        ctx = tmp.start_processes(
            entry, args=(cfg,), nprocs=nprocs, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"checkpoint generation exceeded {timeout:.0f}s")
        except BaseException as e:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(10)
                if p.is_alive():
                    p.kill()
            raise RuntimeError(
                f"checkpoint generation failed ({cfg['format']} -> {cfg['out_dir']}): {e}"
            ) from e
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------------------
# sample_ckpts/
# --------------------------------------------------------------------------------------

SAMPLES = {
    # name: make_checkpoint kwargs (paths relative to the repo root)
    "torch_dist": dict(format="torch_dist", tp=2, pp=2, dp=2, layers=2, hidden=16, heads=4,
                       vocab_size=100, make_vocab_size_divisible_by=64,
                       optim_sharding="dp_reshardable", iterations=(1, 2, 3),
                       half_written="before_metadata_json", seed=1234),
    "torch_dist_fully": dict(format="torch_dist", tp=2, pp=1, dp=2, layers=2, hidden=16,
                             heads=4, vocab_size=100, make_vocab_size_divisible_by=64,
                             optim_sharding="fully_reshardable", iterations=(1,), seed=1234),
    "torch_dist_not_fully": dict(format="torch_dist", tp=2, pp=2, dp=2, layers=2, hidden=16,
                                 heads=4, vocab_size=100, make_vocab_size_divisible_by=64,
                                 optim_sharding="dp_reshardable", iterations=(1,), seed=1234,
                                 fully_parallel=False),
    "legacy": dict(format="legacy", tp=2, pp=2, dp=2, layers=2, hidden=16, heads=4,
                   vocab_size=100, make_vocab_size_divisible_by=64,
                   optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "dcp": dict(format="dcp", dp=4, layers=2, hidden=16, heads=4, vocab_size=128, seed=1234,
                dcp_step=10, dcp_mesh="2d"),
    # parallel layouts (tools/_mcore_layouts.py): one tiny GPT (hidden 16, 4 heads, vocab 100 ->
    # padded 64*TP multiple) shared by every variant; MoE variants replace the MLP by 4
    # SequentialMLP experts (top-2 router).
    "moe_ep2": dict(format="torch_dist", tp=1, pp=1, dp=2, ep=2, experts=4, layers=2,
                    optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "moe_tp2_ep2": dict(format="torch_dist", tp=2, pp=1, dp=2, ep=2, etp=1, experts=4, layers=2,
                        optim_sharding="fully_reshardable", iterations=(1,), seed=1234),
    "vpp": dict(format="torch_dist", tp=1, pp=2, vpp=2, dp=1, layers=4, num_microbatches=2,
                optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "vpp_fully": dict(format="torch_dist", tp=1, pp=2, vpp=2, dp=1, layers=4, num_microbatches=2,
                      optim_sharding="fully_reshardable", iterations=(1,), seed=1234),
    "cp2": dict(format="torch_dist", tp=1, pp=1, cp=2, dp=2, layers=2,
                optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "swiglu_bf16": dict(format="torch_dist", tp=2, pp=1, dp=2, layers=2, swiglu=True, bf16=True,
                        optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "legacy_ep2": dict(format="legacy", tp=1, pp=1, dp=2, ep=2, experts=4, layers=2,
                       iterations=(1,), seed=1234),
    "legacy_pp2_ep2": dict(format="legacy", tp=1, pp=2, dp=2, ep=2, experts=4, layers=2,
                           iterations=(1,), seed=1234),
    "legacy_vpp": dict(format="legacy", tp=1, pp=2, vpp=2, dp=1, layers=4, num_microbatches=2,
                       iterations=(1,), seed=1234),
}


# Older on-disk generations: one tiny model (the torch_dist_fully model: TP2 x PP1 x DP2), each
# written by the release named here, which must be the installed megatron-core (run this script
# with that release's interpreter; build_samples skips the others).  Python 3.11, torch
# 2.13.0+cpu.  Release-specific CPU care is in tools/_mcore_cpu.py (_content_metadata,
# _patch_distopt_state_without_step, rerun state without `force` on 0.13).
_OLD = dict(format="torch_dist", tp=2, pp=1, dp=2, layers=2, hidden=16, heads=4, vocab_size=100,
            make_vocab_size_divisible_by=64, iterations=(1,), seed=1234)
RELEASE_SAMPLES = {
    # 0.13: flattened DistOpt state (ShardedTensor.flattened_range), N-D reformulated on disk,
    # original shapes in .metadata mcore_data; the default with --ckpt-fully-parallel-save
    "mcore_0_13_1": ("0.13.1", dict(_OLD, optim_sharding="fully_sharded_model_space")),
    # 0.13 without fully parallel save: one param_state ShardedObject per DP group (DP rank 0)
    "mcore_0_13_1_dpzero": ("0.13.1", dict(_OLD, optim_sharding="dp_zero_gather_scatter",
                                           fully_parallel=False)),
    # 0.14.0: still flattened (dp_reshardable arrives in 0.15), new content_metadata keys
    "mcore_0_14_0": ("0.14.0", dict(_OLD, optim_sharding="fully_sharded_model_space")),
    # 0.15: MCoreMetadata root / MCoreSavePlan plans, dp_reshardable default
    "mcore_0_15_3": ("0.15.3", dict(_OLD, optim_sharding="dp_reshardable")),
    # 0.15: the last release with the zarr backend (one zarr v2 array dir per tensor key).
    # zarr needs a regular chunk grid (ShardedTensor.max_allowed_chunks): the irregular 1-D
    # dp_reshardable buckets raise there, and so do flattened tensors -> dp_zero_gather_scatter
    # (one param_state ShardedObject per DP group), which is what a zarr-era run used.
    "mcore_0_15_3_zarr": ("0.15.3", dict(_OLD, optim_sharding="dp_zero_gather_scatter",
                                         fully_parallel=False, backend="zarr")),
}


def make_dcp_zstd(out_dir: str) -> str:
    """``sample_ckpts/dcp_zstd/``: one plain torch DCP checkpoint dir (no step dir, one process, no process group)
    written by ``dcp.save(state, storage_writer=FileSystemWriter(out_dir, _extensions=[ZStandard()]))`` (torch
    2.13.0, ``zstandard`` 0.25.0): every stored item, byte items and tensor archives alike, zstd-compressed, its
    ``_StorageInfo.transform_descriptors == ["stream.zstd/1"]``. Seeded tensors, a few KB."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard

    g = torch.Generator().manual_seed(1234)
    state = {
        "model": {"embedding.weight": torch.randn(16, 8, generator=g), "head.bias": torch.zeros(16),
                  "norm.weight": torch.ones(8, dtype=torch.bfloat16)},
        "optimizer": {"step": 10, "lr": 1e-3, "betas": (0.9, 0.95)},
        "rng": torch.Generator().manual_seed(1234).get_state(),
        "extra": {"iteration": 10, "consumed_samples": 640},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": a single-process save
        dcp.save(state, storage_writer=FileSystemWriter(out_dir, _extensions=[ZStandard()]))
    return out_dir


def make_dcp_writers(out_dir: str) -> str:
    """``sample_ckpts/dcp_writers/<case>/``: one dir per torch DCP writer mode that Megatron never uses
    (`tools/_dcp_writers.py`: per-rank metadata, unflattened state dicts, the Hugging Face storage writer in its
    three modes), torch 2.13.0 + safetensors 0.8.0, 2 gloo ranks where the case has them. A few KB each. Only the
    cases torch loads back: ``safetensors_distcp`` (which torch 2.13's reader cannot load) is written by the tests."""
    if _TOOLS_DIR not in sys.path:
        sys.path.insert(0, _TOOLS_DIR)
    import _dcp_writers  # noqa: E402

    _dcp_writers.write(out_dir, [c for c in _dcp_writers.CASES if c != "safetensors_distcp"])
    return out_dir


# Samples written directly by torch (no Megatron): name -> writer(out_dir).
DIRECT_SAMPLES = {"dcp_zstd": make_dcp_zstd, "dcp_writers": make_dcp_writers}


def _installed_release() -> str:
    from importlib.metadata import version

    return version("megatron-core")


def build_samples(root: str = "sample_ckpts", only=None, verbose: bool = True,
                  verify: bool = False, timeout: float = 600.0) -> dict:
    """Rebuild the sample save dirs under ``root`` (relative to the repo root) from nothing.

    Returns {name: seconds}.  README.md in ``root`` is left untouched.  ``verify``: also
    round-trip the torch_dist/legacy samples through Megatron's loaders (verify_checkpoint).
    """
    prev_cwd = os.getcwd()
    os.chdir(_REPO_ROOT)  # recorded paths (args.save, .metadata checkpoint_id) stay relative
    timings = {}
    try:
        installed = _installed_release()
        todo = [(n, "0.16.1", kw) for n, kw in SAMPLES.items()]
        todo += [(n, rel, kw) for n, (rel, kw) in RELEASE_SAMPLES.items()]
        for name, release, kw in todo:
            if only and name not in only:
                continue
            if release != installed:
                if verbose:
                    print(f"[make_sample_ckpts] skip {name}: written by megatron-core {release}, "
                          f"installed {installed} (run with that release's interpreter)")
                continue
            d = os.path.join(root, name)
            if os.path.isdir(d):
                shutil.rmtree(d)
            t0 = time.monotonic()
            make_checkpoint(d, timeout=timeout, **kw)
            timings[name] = time.monotonic() - t0
            if verbose:
                print(f"[make_sample_ckpts] {d}: {timings[name]:.1f}s", flush=True)
            if verify and kw["format"] != "dcp" and not set(kw) & set(LAYOUT_DEFAULTS):
                verify_checkpoint(d, timeout=timeout, **kw)
        for name, writer in DIRECT_SAMPLES.items():
            if only and name not in only:
                continue
            d = os.path.join(root, name)
            if os.path.isdir(d):
                shutil.rmtree(d)
            t0 = time.monotonic()
            writer(d)
            timings[name] = time.monotonic() - t0
            if verbose:
                print(f"[make_sample_ckpts] {d}: {timings[name]:.1f}s", flush=True)
    finally:
        os.chdir(prev_cwd)
    return timings


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="save dir to write (omit to rebuild sample_ckpts/)")
    p.add_argument("--only", nargs="*", choices=sorted({*SAMPLES, *RELEASE_SAMPLES, *DIRECT_SAMPLES}),
                   help="with no --out: rebuild only these samples")
    p.add_argument("--format", default="torch_dist", choices=FORMATS)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=100)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=64)
    p.add_argument("--optim-sharding", default="dp_reshardable", choices=OPTIM_SHARDINGS)
    p.add_argument("--iterations", type=int, nargs="+", default=[1])
    p.add_argument("--half-written", default="none", choices=HALF_WRITTEN)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-fully-parallel", dest="fully_parallel", action="store_false",
                   help="save without FullyParallelSaveStrategyWrapper (--no-ckpt-fully-parallel-save)")
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--dcp-step", type=int, default=10)
    p.add_argument("--dcp-mesh", default="1d", choices=("1d", "2d"))
    p.add_argument("--cp", type=int, default=1, help="context parallel size")
    p.add_argument("--ep", type=int, default=1, help="expert model parallel size (needs --experts)")
    p.add_argument("--etp", type=int, default=None, help="expert tensor parallel size (default: TP)")
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline stages per PP rank")
    p.add_argument("--experts", type=int, default=0, help="MoE: SequentialMLP experts (0 = dense)")
    p.add_argument("--topk", type=int, default=2, help="MoE router top-k")
    p.add_argument("--num-microbatches", type=int, default=1)
    p.add_argument("--swiglu", action="store_true", help="gated_linear_unit with silu")
    p.add_argument("--bf16", action="store_true", help="bf16 params, fp32 main params")
    p.add_argument("--backend", default="torch_dist", choices=BACKENDS)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--lr", type=float, default=1e-3, help="0 keeps the initial weights bit-exact through the step")
    p.add_argument("--value-faults", default="none", choices=VALUE_FAULTS,
                   help="put a NaN/Inf/denormal/zero (weights), zero/negative Adam moment (moments) or a bf16 weight "
                        "off its fp32 main param (desync) into the live state before the save")
    p.add_argument("--verify", action="store_true",
                   help="afterwards, load the written torch_dist/legacy iterations back with "
                        "Megatron's loaders in fresh workers and require an exact round trip")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = _parse(argv)
    try:
        if a.out is None:
            build_samples(only=a.only, verify=a.verify, timeout=a.timeout)
        else:
            kw = dict(
                format=a.format, tp=a.tp, pp=a.pp, dp=a.dp, layers=a.layers,
                hidden=a.hidden, heads=a.heads, vocab_size=a.vocab_size,
                make_vocab_size_divisible_by=a.make_vocab_size_divisible_by,
                optim_sharding=a.optim_sharding, iterations=a.iterations,
                half_written=a.half_written, seed=a.seed, seq_length=a.seq_length,
                fully_parallel=a.fully_parallel,
                micro_batch_size=a.micro_batch_size, dcp_step=a.dcp_step, dcp_mesh=a.dcp_mesh,
                backend=a.backend, lr=a.lr, value_faults=a.value_faults,
            )
            layouts = dict(cp=a.cp, ep=a.ep, etp=a.etp, vpp=a.vpp, experts=a.experts,
                           topk=a.topk, swiglu=a.swiglu, bf16=a.bf16)
            kw.update({k: v for k, v in layouts.items() if v != LAYOUT_DEFAULTS[k]})
            if a.num_microbatches != 1:
                kw["num_microbatches"] = a.num_microbatches
            t0 = time.monotonic()
            make_checkpoint(a.out, timeout=a.timeout, **kw)
            print(f"[make_sample_ckpts] {a.out}: {time.monotonic() - t0:.1f}s", flush=True)
            if a.verify and a.format != "dcp" and not set(kw) & set(LAYOUT_DEFAULTS):
                verify_checkpoint(a.out, timeout=a.timeout, **kw)
    except (RuntimeError, ValueError) as e:
        print(f"make_sample_ckpts: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
