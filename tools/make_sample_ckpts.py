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
                    lr=1e-3, train_iters=10, dcp_step=10, dcp_mesh="1d",
                    timeout=600) -> str
    verify_checkpoint(out_dir, timeout=600, **same_kwargs)   # Megatron load round trip
    build_samples(root="sample_ckpts", only=None, verify=False) -> {name: seconds}
    padded_vocab_size(vocab_size, make_vocab_size_divisible_by, tp) -> int
    SAMPLES  # {name: make_checkpoint kwargs} of the committed samples

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

FORMATS = ("torch_dist", "legacy", "dcp")
# dp_reshardable / fully_reshardable: megatron-core >= 0.15 (fully_reshardable also 0.16+);
# fully_sharded_model_space (flattened, mcore_data) and dp_zero_gather_scatter: <= 0.15 (the
# only two DistOpt formats 0.13.x / 0.14.0 offer besides the deprecated bucket space one).
OPTIM_SHARDINGS = ("dp_reshardable", "fully_reshardable", "fully_sharded_model_space",
                   "dp_zero_gather_scatter")
BACKENDS = ("torch_dist", "zarr")  # zarr: megatron-core <= 0.15 only (needs `zarr<3`)
HALF_WRITTEN = ("none", "before_metadata", "before_metadata_json")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int, tp: int) -> int:
    """Megatron training's _vocab_size_with_padding (multiple of divisible_by * TP)."""
    multiple = make_vocab_size_divisible_by * tp
    return ((vocab_size + multiple - 1) // multiple) * multiple


DEFAULTS = dict(
    format="torch_dist", tp=2, pp=2, dp=2, layers=2, hidden=16, heads=4, vocab_size=100,
    make_vocab_size_divisible_by=64, optim_sharding="dp_reshardable", iterations=(1,),
    half_written="none", seed=1234, seq_length=16, micro_batch_size=2, num_microbatches=1,
    lr=1e-3, train_iters=10, dcp_step=10, dcp_mesh="1d", backend="torch_dist",
    fully_parallel=True,
)


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
    c["world"] = dp if c["format"] == "dcp" else tp * pp * dp
    c["padded_vocab_size"] = padded_vocab_size(
        c["vocab_size"], c["make_vocab_size_divisible_by"], tp)
    c["train_iters"] = max(c["train_iters"], c["iterations"][-1])
    c["out_dir"] = c["save_arg"] = out_dir  # args.save / args.load record it as given
    c["port"] = _free_port()
    c["mode"] = "save"
    return c


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
    seed: int = 1234,
    seq_length: int = 16,
    micro_batch_size: int = 2,
    num_microbatches: int = 1,
    lr: float = 1e-3,
    train_iters: int = 10,
    dcp_step: int = 10,
    dcp_mesh: str = "1d",
    backend: str = "torch_dist",
    fully_parallel: bool = True,
    timeout: float = 600.0,
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
    ``fully_parallel``: wrap the save strategy in FullyParallelSaveStrategyWrapper over the DP
    group (Megatron's ``--ckpt-fully-parallel-save``; <= 0.15 pairs ``dp_zero_gather_scatter``
    with False).
    """
    out_dir = os.fspath(out_dir)
    cfg = _config(out_dir, format=format, tp=tp, pp=pp, dp=dp, layers=layers, hidden=hidden,
                  heads=heads, vocab_size=vocab_size,
                  make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                  optim_sharding=optim_sharding, iterations=iterations,
                  half_written=half_written, seed=seed, seq_length=seq_length,
                  micro_batch_size=micro_batch_size, num_microbatches=num_microbatches, lr=lr,
                  train_iters=train_iters, dcp_step=dcp_step, dcp_mesh=dcp_mesh,
                  backend=backend, fully_parallel=fully_parallel)
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
    cfg["mode"] = "verify"
    _spawn(cfg, cfg["world"], timeout)


def _spawn(cfg: dict, nprocs: int, timeout: float) -> None:
    # The spawn children unpickle the entry point by module name: make `_mcore_cpu`
    # importable as a top-level module (sys.path is forwarded to spawn children).
    if _TOOLS_DIR not in sys.path:
        sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu  # noqa: E402  (cheap: no torch import at module level)
    import torch.multiprocessing as tmp

    env_backup = {k: os.environ.get(k) for k in ("PYTHONWARNINGS", "OMP_NUM_THREADS",
                                                  "GLOO_SOCKET_IFNAME")}
    os.environ["PYTHONWARNINGS"] = "ignore"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        ctx = tmp.start_processes(
            _mcore_cpu.worker_entry, args=(cfg,), nprocs=nprocs, join=False,
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
    "legacy": dict(format="legacy", tp=2, pp=2, dp=2, layers=2, hidden=16, heads=4,
                   vocab_size=100, make_vocab_size_divisible_by=64,
                   optim_sharding="dp_reshardable", iterations=(1,), seed=1234),
    "dcp": dict(format="dcp", dp=4, layers=2, hidden=16, heads=4, vocab_size=128, seed=1234,
                dcp_step=10, dcp_mesh="2d"),
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
            if verify and kw["format"] != "dcp":
                verify_checkpoint(d, timeout=timeout, **kw)
    finally:
        os.chdir(prev_cwd)
    return timings


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="save dir to write (omit to rebuild sample_ckpts/)")
    p.add_argument("--only", nargs="*", choices=sorted({*SAMPLES, *RELEASE_SAMPLES}),
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
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--dcp-step", type=int, default=10)
    p.add_argument("--dcp-mesh", default="1d", choices=("1d", "2d"))
    p.add_argument("--backend", default="torch_dist", choices=BACKENDS)
    p.add_argument("--no-fully-parallel", dest="fully_parallel", action="store_false",
                   help="save without FullyParallelSaveStrategyWrapper")
    p.add_argument("--timeout", type=float, default=600.0)
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
                micro_batch_size=a.micro_batch_size, dcp_step=a.dcp_step, dcp_mesh=a.dcp_mesh,
                backend=a.backend, fully_parallel=a.fully_parallel,
            )
            t0 = time.monotonic()
            make_checkpoint(a.out, timeout=a.timeout, **kw)
            print(f"[make_sample_ckpts] {a.out}: {time.monotonic() - t0:.1f}s", flush=True)
            if a.verify and a.format != "dcp":
                verify_checkpoint(a.out, timeout=a.timeout, **kw)
    except (RuntimeError, ValueError) as e:
        print(f"make_sample_ckpts: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
