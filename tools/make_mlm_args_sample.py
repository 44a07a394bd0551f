#!/usr/bin/env python
"""Write sample_ckpts/mlm_args/ by running Megatron-LM's own training entry point on CPU.

    python tools/make_mlm_args_sample.py --megatron-lm DIR --verify     # from the repo root
    python tools/make_mlm_args_sample.py --megatron-lm DIR --out DIR --world 2 --verify

Why: Megatron-LM's training code puts its real argparse Namespace into every checkpoint's common
state, with values such as ``args.exit_signal = signal.SIGTERM`` (a ``signal.Signals`` member,
``megatron/training/training_config.py``). The other samples build their args by hand, so they never
showed what a reader has to accept in a real ``common.pt``. Here nothing is built by hand: the
worker runs ``pretrain_gpt.py`` as ``__main__`` (``megatron.training.pretrain``: ``parse_args`` +
``validate_args``, mock data, a few real iterations) and its ``save_checkpoint`` writes the
iteration dir, ``common.pt`` (args, rng state, iteration, checkpoint_version, rerun state machine
state) and ``latest_checkpointed_iteration.txt``.

``--megatron-lm DIR`` is a checkout of Megatron-LM at the tag matching the installed megatron-core
(``core_v0.16.1`` for 0.16.1). Only ``megatron/training``, ``megatron/legacy``, ``megatron/rl``,
``megatron/post_training``, ``pretrain_gpt.py``, ``gpt_builders.py`` and ``model_provider.py`` are
used; ``megatron.core`` comes from the installed wheel (``megatron`` is a namespace package, so the
two halves join). Megatron-LM code is never copied into this repo. One way to get it:

    git clone --depth 1 --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM DIR

Extra pip packages: none beyond this project's dev environment (torch 2.13.0+cpu, megatron-core
0.16.1, numpy, packaging, psutil, PyYAML, regex, six, tqdm, Flask were already installed).
``triton`` is imported at module level by ``megatron/core/transformer/custom_layers/
batch_invariant_kernels.py`` (which ``megatron/training/initialize.py`` imports); it is only used by
``--batch-invariant-mode``, so instead of installing it a stand-in module is put into
``sys.modules`` for that one import and removed afterwards (``pip install triton`` works too).

Redirected on top of ``tools/_mcore_cpu.py``'s CUDA shims (listed there: ``torch.cuda.*`` no-ops,
device="cuda" -> cpu, the CUDA RNG -> a private CPU generator, ``Tensor.type()`` names, ...):
  * ``megatron.training.training.initialize_megatron`` gets ``allow_no_cuda=True`` (it asserts
    ``torch.cuda.is_available()`` otherwise; is_available stays False);
  * ``megatron.legacy.fused_kernels.load`` -> no-op (it builds CUDA kernels with nvcc; nothing is
    loaded from it since the local transformer impl runs unfused);
  * ``megatron.core.datasets.utils.compile_helpers`` -> no-op (it runs ``make`` in the wheel's
    datasets dir, which has no Makefile: the wheel ships the compiled ``helpers_cpp`` already);
  * ``megatron.core.tensor_parallel.random._get/_set_cuda_rng_state`` -> the private generator
    (``_mcore_cpu._patch_megatron_rng``);
  * ``torch.distributed.checkpoint.filesystem._generate_uuid`` -> seeded (reproducible .metadata).
The argv asks for ``--distributed-backend gloo`` and ``--transformer-impl local`` (no Transformer
Engine, no apex); the fusions that need CUDA kernels are turned off with Megatron's own flags.

One process per rank (``--world``, default 1), started like torchrun would (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT in the environment), cwd = the repo root so that ``args.save`` is the
repo-relative ``sample_ckpts/mlm_args``. ``--verify`` then loads the result with Megatron's own
loaders in a fresh process: ``dist_checkpointing.load_common_state_dict`` and
``dist_checkpointing.load_plain_tensors`` (every tensor key, no model needed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TOOLS_DIR)
DEFAULT_OUT = os.path.join("sample_ckpts", "mlm_args")


def megatron_argv(save: str, seed: int, train_iters: int, world: int,
                  with_optim: bool = False, load: str | None = None) -> list[str]:
    """The command line pretrain_gpt.py is run with: a tiny GPT, realistic otherwise.

    bf16 like most real runs; the optimizer state is left out of the save by default
    (``--no-save-optim``, a real Megatron flag) to keep the sample small: with it the save
    is about 1.5 MB instead of about 0.2 MB."""
    return [
        # model
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings", "32",
        "--position-embedding-type", "learned_absolute", "--init-method-std", "0.02",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--transformer-impl", "local", "--bf16",
        "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        # data: Megatron's MockGPTDataset, NullTokenizer
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
        "--make-vocab-size-divisible-by", "64",
        "--micro-batch-size", "2", "--global-batch-size", str(2 * world),
        # optimizer / schedule
        "--optimizer", "adam", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--clip-grad", "1.0", "--use-distributed-optimizer",
        "--train-iters", str(train_iters), "--eval-iters", "0", "--eval-interval", "1000",
        # checkpointing
        "--save", save, "--save-interval", str(train_iters), "--ckpt-format", "torch_dist",
        *(() if with_optim else ("--no-save-optim",)),
        *(() if load is None else ("--load", load, *(() if with_optim else ("--no-load-optim",)))),
        # runtime
        "--distributed-backend", "gloo", "--seed", str(seed), "--log-interval", "1",
    ]


def _stub_triton_import() -> None:
    """Import batch_invariant_kernels with a stand-in ``triton`` (see the module docstring)."""
    import types

    class _Any:
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Any()

        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else _Any()

    def _module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()

    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.jit = lambda fn=None, **k: fn if fn is not None else (lambda g: g)
    triton.__getattr__ = _module_getattr
    language.__getattr__ = _module_getattr
    triton.language = language
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        import megatron.core.transformer.custom_layers.batch_invariant_kernels  # noqa: F401
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


def _worker(ns: argparse.Namespace) -> None:
    import functools

    sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu

    _mcore_cpu._quiet()
    import torch

    torch.set_num_threads(1)
    _mcore_cpu.install_cuda_shims()
    _mcore_cpu._seed_dcp_uuids(ns.seed, int(os.environ["RANK"]))
    sys.path.insert(0, os.path.abspath(ns.megatron_lm))
    import megatron.core  # noqa: F401  (the wheel; megatron.training comes from --megatron-lm)

    _stub_triton_import()
    _mcore_cpu._patch_megatron_rng()
    import megatron.core.datasets.utils as dataset_utils
    import megatron.legacy.fused_kernels as fused_kernels
    import megatron.training.training as training

    dataset_utils.compile_helpers = lambda: None
    fused_kernels.load = lambda args: None
    training.initialize_megatron = functools.partial(training.initialize_megatron,
                                                     allow_no_cuda=True)
    script = os.path.join(os.path.abspath(ns.megatron_lm), "pretrain_gpt.py")
    sys.argv = [script, *megatron_argv(ns.save, ns.seed, ns.train_iters, ns.world,
                                         ns.with_optim, ns.load)]
    # Run it as __main__ without runpy's swap of sys.modules["__main__"]: Megatron's async
    # filesystem writer starts a multiprocessing Manager (spawn), whose child re-imports the
    # main module; that must stay this script (cheap, guarded), not pretrain_gpt.py, whose
    # imports would need the triton stand-in again.
    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), script, "exec")
    exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(ns: argparse.Namespace, save: str, load: str | None = None,
            train_iters: int | None = None, log: str | None = None) -> None:
    port = _free_port()
    procs, logs = [], []
    for rank in range(ns.world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ns.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore",
                   CUDA_DEVICE_MAX_CONNECTIONS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--megatron-lm",
               ns.megatron_lm, "--save", save, "--seed", str(ns.seed), "--world", str(ns.world),
               "--train-iters", str(train_iters or ns.train_iters),
               *(["--with-optim"] if ns.with_optim else []), *(["--load", load] if load else [])]
        out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
        logs += [out] if out else []
        procs.append(subprocess.Popen(cmd, cwd=_REPO_ROOT, env=env, stdout=out, stderr=out))
    deadline = time.monotonic() + ns.timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        raise SystemExit(f"Megatron-LM pretrain failed (exit codes {bad})")


def report_common(out: str) -> None:
    """Print the globals of common.pt's pickle (pickletools, nothing executed), then check
    ``args.exit_signal`` by loading it: our own file, so ``weights_only=False`` is fine here."""
    import pickletools
    import signal
    import zipfile

    import torch

    iteration = open(os.path.join(out, "latest_checkpointed_iteration.txt")).read().strip()
    common = os.path.join(out, f"iter_{int(iteration):07d}", "common.pt")
    with zipfile.ZipFile(common) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    names = [arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data)
             if op.name == "GLOBAL"]
    print(f"{common}: globals {names}")
    state = torch.load(common, map_location="cpu", weights_only=False)
    sig = state["args"].exit_signal
    if not isinstance(sig, signal.Signals):
        raise SystemExit(f"args.exit_signal is {type(sig)}, expected signal.Signals")
    print(f"args.exit_signal = {sig!r}; common state keys {sorted(state)}")


def _load_worker(ns: argparse.Namespace) -> None:
    """Megatron's own dist_checkpointing loaders, default torch.load (weights_only=True plus
    megatron.core.safe_globals), in a fresh process."""
    sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu

    _mcore_cpu._quiet()
    _mcore_cpu.install_cuda_shims()
    _mcore_cpu._init_dist(0, 1, _free_port())
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(ns.load)
    tensors = dist_checkpointing.load_plain_tensors(ns.load)
    print(f"load_common_state_dict: keys {sorted(common)}, iteration {common['iteration']}, "
          f"args.exit_signal {common['args'].exit_signal!r}")
    print(f"load_plain_tensors: {len(tensors)} tensors, e.g. "
          f"embedding.word_embeddings.weight {tuple(tensors['embedding.word_embeddings.weight'].shape)}")


def verify(ns: argparse.Namespace, out: str, save: str) -> None:
    """(1) dist_checkpointing.load_common_state_dict + load_plain_tensors in a fresh process;
    (2) resume: pretrain_gpt.py --load <sample> one more iteration (Megatron-LM's
    load_checkpoint), saving to a scratch dir that is deleted afterwards."""
    import tempfile

    iteration = int(open(os.path.join(out, "latest_checkpointed_iteration.txt")).read())
    ckpt = os.path.join(save, f"iter_{iteration:07d}")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--load-worker", "--megatron-lm",
                    ns.megatron_lm, "--load", ckpt], cwd=_REPO_ROOT, check=True)
    scratch = tempfile.mkdtemp(prefix="mlm_args_resume_")
    log = os.path.join(scratch, "resume.log")
    try:
        _launch(ns, os.path.join(scratch, "save"), load=save, train_iters=iteration + 1, log=log)
        text = open(log, encoding="utf-8", errors="replace").read()
        loaded = [ln.strip() for ln in text.splitlines() if "successfully loaded checkpoint" in ln]
        if not loaded:
            raise SystemExit(f"resume did not report a loaded checkpoint (log: {log})")
        print(f"resume: {loaded[-1]}")
    except BaseException:
        if os.path.exists(log):
            sys.stderr.write(open(log, encoding="utf-8", errors="replace").read()[-4000:])
        raise
    finally:
        if not os.environ.get("KEEP_RESUME"):
            shutil.rmtree(scratch, ignore_errors=True)


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", required=True,
                   help="Megatron-LM source dir at the installed megatron-core's tag")
    p.add_argument("--out", default=DEFAULT_OUT, help="save dir (replaced) [%(default)s]")
    p.add_argument("--world", type=int, default=1, choices=(1, 2), help="ranks (data parallel)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train-iters", type=int, default=2)
    p.add_argument("--with-optim", action="store_true",
                   help="also save the DistributedOptimizer state (about 1.5 MB instead of 0.2 MB)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--verify", action="store_true", help="load it back with Megatron's loaders")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    p.add_argument("--load", help=argparse.SUPPRESS)
    p.add_argument("--load-worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    ns = _parse(argv)
    if ns.worker:
        _worker(ns)
        return 0
    if ns.load_worker:
        _load_worker(ns)
        return 0
    out = os.path.abspath(ns.out)
    save = os.path.relpath(out, _REPO_ROOT)
    if os.path.isdir(out):
        shutil.rmtree(out)
    t0 = time.monotonic()
    _launch(ns, save)
    print(f"wrote {save} in {time.monotonic() - t0:.0f}s")
    report_common(out)
    if ns.verify:
        verify(ns, out, save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
