"""Pickle-safety scanners side by side (issue 24): ckptinspect vs picklescan, modelscan and fickling.

Usage: python benchmarks/compare_scanners.py --peers-python .peers-venv/bin/python [--json OUT] [--timeout S]

Two sets of samples are built into a temp dir:
- HOSTILE: every payload creates a marker file when the real loader (pickle.loads / torch.load(weights_only=False) /
  DCP) loads it. Each sample is loaded for real in a subprocess first; one whose marker does not appear is reported
  "not live" and left out of the score.
- BENIGN: objects real checkpoints carry, written by the real libraries (torch.save), plus every sample dir of
  `sample_ckpts/`. Each built one is loaded for real too, under an audit hook: it must load and spawn nothing.

The peers run in their own venv (`--peers-python`), one subprocess per peer per sample, calling the peer's own
entry point on each file (picklescan `scan_file_path`, modelscan `ModelScan().scan`, fickling's CLI dispatch:
`scan_zip_archive` / `scan_file`), with a timeout; a peer that times out, crashes or prints garbage is "error" on
that sample, never a traceback here. For a directory sample a peer judges the files it would pick in directory mode
and the sample is flagged when any file is. ckptinspect runs as its CLI (`scan PATH -o json`, and `audit PATH --all
-o json` on a directory): flagged when a status is `unsafe`.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_ckpts"
sys.path.insert(0, str(ROOT / "tests" / "support"))
from hostile_samples import payload, two_directories, write_zip, zip_entries  # noqa: E402

PEERS = ("picklescan", "modelscan", "fickling")
TOOLS = ("ckptinspect",) + PEERS

# --- hand-assembled pickle pieces --------------------------------------------------------------------------------------


def _u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _g(module: str, name: str) -> bytes:
    return _u(module) + _u(name) + b"\x93"  # STACK_GLOBAL


def _call1(fn: bytes, arg: str) -> bytes:
    return fn + _u(arg) + b"\x85R"  # TUPLE1 REDUCE


P4 = b"\x80\x04"


def _touch(marker: Path) -> str:
    return f"touch {marker}"


def _exec_once(marker: Path) -> str:
    # timeit.timeit(stmt) runs stmt 1,000,000 times: the statement raises after its first run
    return f"open({str(marker)!r}, 'w').close(); 1/0"


def _hook(carrier: tuple[str, str], attr: str, fn: tuple[str, str], trigger: bytes) -> bytes:
    """A first BUILD gives an inert carrier (its instance `__dict__`) `attr` = fn; `trigger` then makes the
    unpickler call it: BUILD looks `__setstate__` up on the instance, APPEND(S) `extend`/`append`, ADDITEMS `add`."""
    return (P4 + _g(*carrier) + b")R" + b"}" + _u(attr) + _g(*fn) + b"s" + b"b" + trigger + b".")


def hook_samples(marker: Path) -> dict[str, bytes]:
    t, x = _touch(marker), _exec_once(marker)
    od, ns = ("collections", "OrderedDict"), ("argparse", "Namespace")
    return {
        "hook-setstate-OrderedDict-timeit": _hook(od, "__setstate__", ("timeit", "timeit"), _u(x) + b"b"),
        "hook-setstate-Namespace-os.system": _hook(ns, "__setstate__", ("os", "system"), _u(t) + b"b"),
        "hook-append-Namespace-os.system": _hook(ns, "append", ("os", "system"), _u(t) + b"a"),
        "hook-appends-OrderedDict-os.system": _hook(od, "append", ("os", "system"), b"(" + _u(t) + b"e"),
        "hook-additems-Namespace-os.system": _hook(ns, "add", ("os", "system"), b"(" + _u(t) + b"\x90"),
        # __setstate__(state) takes one argument: partial(pipepager, "x")(state) is pipepager("x", cmd=state)
        "hook-setstate-Namespace-pydoc.pipepager": (
            P4 + _g(*ns) + b")R" + b"}" + _u("__setstate__") + _g("functools", "partial") + _g("pydoc", "pipepager")
            + _u("x") + b"\x86R" + b"s" + b"b" + _u(t) + b"b."),
    }


def dotted_samples(marker: Path) -> dict[str, bytes]:
    t = _touch(marker)
    getattr_ = _g("builtins", "getattr")
    os_mod = getattr_ + _g("torch", "serialization") + _u("os") + b"\x86R"
    return {
        "dotted-torch-serialization.os.system": P4 + _call1(_g("torch", "serialization.os.system"), t) + b".",
        "dotted-builtins.getattr-chain": P4 + _call1(getattr_ + os_mod + _u("system") + b"\x86R", t) + b".",
    }


def nesting_samples(marker: Path) -> dict[str, bytes]:
    call = _call1(_g("os", "system"), _touch(marker))
    return {
        "nest-300-payload-inside": P4 + b"(" * 300 + call + b"t" * 300 + b".",
        "nest-300-then-payload": P4 + b"(" * 300 + b"t" * 300 + call + b"\x86.",
        "nest-300-lists-then-payload": P4 + _nested_lists(300) + call + b"\x86.",
    }


def _nested_lists(depth: int) -> bytes:
    # [[[...]]]: EMPTY_LIST depth times, then APPEND depth-1 times folds each into the one below it
    return b"]" * depth + b"a" * (depth - 1)


def protocol0_samples(marker: Path) -> dict[str, bytes]:
    t = _touch(marker)
    return {
        "proto0-GLOBAL-REDUCE-posix.system": f"cposix\nsystem\n(V{t}\ntR.".encode(),
        "proto0-INST-os.system": f"(V{t}\nios\nsystem\n.".encode(),
        "proto1-OBJ-os.system": b"(cos\nsystem\nX" + len(t).to_bytes(4, "little") + t.encode() + b"o.",
    }


# --- containers --------------------------------------------------------------------------------------------------------


def torch_zip(data_pkl: bytes, extra: list[tuple[str, bytes]] | None = None) -> bytes:
    """A torch.save archive (torch's own layout) whose `data.pkl` is `data_pkl`."""
    import torch

    buf = io.BytesIO()
    torch.save({"iteration": 1}, buf)
    entries = [(n, data_pkl if n.endswith("/data.pkl") else d) for n, d in zip_entries(buf.getvalue())]
    return write_zip(entries + (extra or []))


def legacy_tar(member_pickle: bytes) -> bytes:
    """torch's legacy tar format (torch < 0.4's `torch.save`): `storages`, `tensors`, `pickle` members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("sys_info", pickle.dumps({"protocol_version": 1001, "little_endian": True,
                                                      "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)),
                           ("storages", pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2)),
                           ("tensors", pickle.dumps(0, protocol=2)),
                           ("pickle", member_pickle)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def torchscript_archives(marker: Path, d: Path) -> dict[str, tuple[Path, list[Any]]]:
    """TorchScript: `__setstate__` of a scripted module runs TorchScript on load (no file I/O there), and an archive
    with `constants.pkl` sends torch.load to torch.jit.load's C++ unpickler. Built and checked for liveness like the
    rest: expected NOT live (reported, excluded from the score)."""
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.zeros(1)

        @torch.jit.export
        def __getstate__(self) -> tuple[torch.Tensor, bool]:
            return (self.w, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[torch.Tensor, bool]) -> None:
            self.w = state[0]
            self.training = state[1]
            print("__setstate__ ran")  # TorchScript has no open(): the marker cannot be created from here

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.w

    out: dict[str, tuple[Path, list[Any]]] = {}
    p = d / "torchscript-setstate.pt"
    torch.jit.save(torch.jit.script(M()), str(p))
    out["torchscript-setstate"] = (p, ["torch.load", str(p)])
    entries = zip_entries(p.read_bytes())
    q = d / "torchscript-hostile-data.pkl.pt"
    q.write_bytes(write_zip([(n, payload(marker) if n.endswith("/data.pkl") else b) for n, b in entries]))
    out["torchscript-hostile-data.pkl"] = (q, ["torch.load", str(q)])
    r = d / "archive-hostile-constants.pkl.pt"
    r.write_bytes(torch_zip(payload(marker), [("archive/constants.pkl", payload(marker))]))
    out["archive-with-hostile-constants.pkl"] = (r, ["torch.load", str(r)])
    return out


# --- the sets ----------------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    name: str
    kind: str  # hostile | benign
    path: Path
    load: list[Any] | None  # [loader, path, ...] for the real-loader check; None: not loaded (trusted repo sample)
    marker: Path | None = None
    note: str = ""
    live: bool | None = None
    load_detail: str = ""
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)


def build_hostile(d: Path) -> list[Sample]:
    """Every hostile sample, each with its own marker under `d/markers/`."""
    import torch  # noqa: F401 - torch_zip needs it

    (d / "markers").mkdir(parents=True, exist_ok=True)
    out: list[Sample] = []
    n = 0

    def marker() -> Path:
        nonlocal n
        n += 1
        return d / "markers" / f"m{n:03d}"

    def raw(name: str, make: Callable[[Path], bytes], note: str) -> None:
        m = marker()
        p = d / f"{name}.pkl"
        p.write_bytes(make(m))
        out.append(Sample(name, "hostile", p, ["pickle", str(p)], m, note))

    def pt(name: str, make: Callable[[Path], bytes], note: str, filename: str = "common.pt") -> None:
        m = marker()
        sub = d / name
        sub.mkdir()
        p = sub / filename
        p.write_bytes(make(m))
        out.append(Sample(name, "hostile", p, ["torch.load", str(p)], m, note))

    # tests/support/hostile_samples.py's payloads, as raw pickles and as common.pt in a torch zip (class 7)
    for kind in ("os.system", "timeit", "pipepager", "import_module", "then-garbage"):
        raw(f"raw-{kind}", lambda m, k=kind: payload(m, k), "tests/support/hostile_samples.payload")
        pt(f"common.pt-{kind}", lambda m, k=kind: torch_zip(payload(m, k)), "payload as common.pt data.pkl")
    pt("common.pt-two-central-directories", lambda m: _two_dirs(m), "torch (miniz) and zipfile read different data.pkl")
    # class 1: implicit-call hooks; 2: dotted names; 3: nesting; 4: protocol 0/1
    for group in (hook_samples, dotted_samples, nesting_samples, protocol0_samples):
        for name in group(Path("/nonexistent")):
            m = marker()
            p = d / f"{name}.pkl"
            p.write_bytes(group(m)[name])
            out.append(Sample(name, "hostile", p, ["pickle", str(p)], m, group.__name__))
    # class 5: TorchScript
    m = marker()
    for name, (p, load) in torchscript_archives(m, d).items():
        out.append(Sample(name, "hostile", p, load, m, "TorchScript"))
        m = marker()
    # class 6: legacy tar checkpoint
    pt("legacy-tar-pickle-member", lambda m: legacy_tar(payload(m)), "torch legacy tar format",
       "model_optim_rng.pt")
    pt("legacy-tar-timeit", lambda m: legacy_tar(payload(m, "timeit")), "torch legacy tar format",
       "model_optim_rng.pt")
    # checkpoint dirs: a Megatron torch_dist iteration with a hostile common.pt, a plain DCP dir with a hostile .metadata
    m = marker()
    it = d / "torch_dist-hostile-common.pt"
    shutil.copytree(SAMPLES / "torch_dist" / "iter_0000001", it)
    (it / "common.pt").write_bytes(torch_zip(payload(m, "timeit")))
    out.append(Sample(it.name, "hostile", it, ["torch.load", str(it / "common.pt")], m, "checkpoint dir"))
    m = marker()
    dc = d / "dcp-hostile-.metadata"
    shutil.copytree(SAMPLES / "dcp" / "step-10", dc)
    (dc / ".metadata").write_bytes(payload(m))
    out.append(Sample(dc.name, "hostile", dc, ["dcp", str(dc), "model.weight"], m, "checkpoint dir"))
    return out


def _two_dirs(m: Path) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"iteration": 1}, buf)
    benign = zip_entries(buf.getvalue())
    evil = [(n, payload(m) if n.endswith("/data.pkl") else b) for n, b in benign]
    return two_directories(evil, benign)


def benign_objects() -> dict[str, Any]:
    """What real checkpoints carry, made by the real libraries (torch 2.13, numpy 2.x, megatron-core 0.16.1)."""
    import argparse as ap
    import collections
    import enum
    import functools
    import pathlib
    import signal
    import types

    import numpy as np
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.enums import ModelType
    from megatron.core.optimizer import OptimizerConfig

    class Color(enum.Enum):  # noqa: F841 - local enums cannot be pickled; the stdlib's and megatron's are used
        RED = 1

    return {
        "argparse.Namespace-SIGTERM": {"args": ap.Namespace(exit_signal=signal.SIGTERM, lr=1e-4, seed=1234)},
        "types.SimpleNamespace": {"cfg": types.SimpleNamespace(hidden=64, heads=4)},
        "mcore-OptimizerConfig": {"optimizer": OptimizerConfig()},
        "mcore-DistributedDataParallelConfig": {"ddp": DistributedDataParallelConfig()},
        "np.random.RandomState": {"rng": np.random.RandomState(1234)},
        "np.random.default_rng": {"rng": np.random.default_rng(1234)},
        "np.random.get_state": {"np_rng_state": np.random.get_state()},
        "numpy-dtypes-scalars": {"dt": np.dtype("float32"), "f": np.float64(1.5), "i": np.int64(3),
                                 "b": np.bool_(True), "a": np.arange(4, dtype=np.int32)},
        "functools.partial-dict": {"factory": functools.partial(dict, lr=0.1)},
        "pathlib.PosixPath": {"save": pathlib.PosixPath("/ckpts/run42")},
        "datetime": {"t": datetime.datetime(2025, 1, 2, 3, 4, 5), "d": datetime.date(2025, 1, 2),
                     "dt": datetime.timedelta(hours=1)},
        "enum-members": {"sig": signal.SIGTERM, "model_type": ModelType.encoder_or_decoder},
        "collections.OrderedDict": {"sd": collections.OrderedDict([("a", 1), ("b", [1, 2])])},
        "torch-tensors-Size-dtypes": {"t": torch.randn(2, 3), "bf": torch.ones(2, dtype=torch.bfloat16),
                                      "size": torch.Size([2, 3]), "dtype": torch.bfloat16,
                                      "rng": torch.get_rng_state()},
    }


def build_benign(d: Path, with_sample_ckpts: bool = True) -> list[Sample]:
    import torch

    out: list[Sample] = []
    for name, obj in benign_objects().items():
        sub = d / name
        sub.mkdir(parents=True)
        p = sub / "common.pt"
        torch.save(obj, p)
        out.append(Sample(name, "benign", p, ["torch.load", str(p)], note="torch.save"))
    if with_sample_ckpts:
        for s in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
            out.append(Sample(f"sample_ckpts/{s.name}", "benign", s, None, note="sample_ckpts dir"))
    return out


# --- the real loaders (liveness) ---------------------------------------------------------------------------------------

_LOAD = r"""
import io, json, pickle, sys, warnings
warnings.simplefilter('ignore')
import numpy, torch, torch.distributed.checkpoint as dcp
try:
    import megatron.core.optimizer, megatron.core.distributed, megatron.core.transformer.spec_utils
except ImportError:
    pass
events = []
WATCH = ('os.system', 'subprocess.Popen', 'os.posix_spawn', 'os.spawn', 'os.exec', 'os.fork', 'pty.spawn')
def hook(ev, args):
    if ev in WATCH:
        events.append(ev)
    elif ev == 'open' and len(args) > 1 and isinstance(args[1], str) and any(c in args[1] for c in 'wax+'):
        events.append('open-for-write')
sys.addaudithook(hook)
out = {}
for job in json.loads(sys.argv[1]):
    kind, path = job[0], job[1]
    del events[:]
    err = ''
    try:
        if kind == 'pickle':
            pickle.loads(open(path, 'rb').read())
        elif kind == 'torch.load':
            torch.load(path, weights_only=False)
        elif kind == 'dcp':
            dcp.load({job[2]: None}, checkpoint_id=path)
    except BaseException as e:  # the loader may fail after running the payload
        err = repr(e)[:200]
    out[path] = [err, sorted(set(events))]
print('\n' + json.dumps(out))
"""


def check_live(samples: list[Sample], timeout: float = 240) -> None:
    """Load every sample that has a loader, in one subprocess (torch imported once; an audit hook records process
    spawns and writes); on a crash or timeout, each sample alone. Sets `live` (marker appeared) and `load_detail`."""
    jobs = [s for s in samples if s.load]
    for s in jobs:
        if s.marker:
            s.marker.unlink(missing_ok=True)
    results = _run_loaders([s.load for s in jobs], timeout)
    if results is None:
        results = {}
        for s in jobs:
            r = _run_loaders([s.load], timeout=60)
            results.update(r or {str(s.load[1]): ["loader subprocess died or timed out", []]})
    for s in jobs:
        err, events = results.get(str(s.load[1]), ["no result", []])
        if s.kind == "hostile":
            s.live = bool(s.marker and s.marker.exists())
            s.load_detail = (f"marker created ({', '.join(events) or 'no spawn'})" if s.live
                             else f"marker not created ({err or 'loaded'})")
        else:
            s.live = False
            ok = not err and not events
            s.load_detail = "loads, ran nothing" if ok else f"LOAD PROBLEM: {err} {events}"


def _run_loaders(jobs: list[list[Any]], timeout: float) -> dict[str, list[Any]] | None:
    try:
        r = subprocess.run([sys.executable, "-c", _LOAD, json.dumps(jobs)], capture_output=True, text=True,
                           timeout=timeout, cwd=tempfile.gettempdir())
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None


# --- the scanners ------------------------------------------------------------------------------------------------------

# Each peer driver: argv[1] = JSON [[path, dir_mode], ...]; prints one JSON line {path: [verdict, detail]}.
_PEER_DRIVERS = {
    "picklescan": r"""
import json, logging, os, sys
logging.disable(logging.CRITICAL)
from picklescan import scanner
EXT = scanner._zip_file_extensions | scanner._pickle_file_extensions | scanner._pytorch_file_extensions
out = {}
for path, dir_mode in json.loads(sys.argv[1]):
    if dir_mode and os.path.splitext(path)[1] not in EXT:  # what `picklescan -p DIR` picks
        out[path] = ['skipped', 'extension not scanned in directory mode']; continue
    try:
        r = scanner.scan_file_path(path)
        bad = sorted({f'{g.module}.{g.name}' for g in r.globals if g.safety.value == 'dangerous'})
        sus = sorted({f'{g.module}.{g.name}' for g in r.globals if g.safety.value == 'suspicious'})
        if r.issues_count:
            out[path] = ['flagged', 'dangerous: ' + ', '.join(bad)]
        elif r.scan_err:
            out[path] = ['error', 'scan error']
        else:
            out[path] = ['clean', ('suspicious (not an issue): ' + ', '.join(sus)) if sus else '']
    except BaseException as e:
        out[path] = ['error', repr(e)[:160]]
print(json.dumps(out))
""",
    "modelscan": r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from modelscan.modelscan import ModelScan
out = {}
for path, dir_mode in json.loads(sys.argv[1]):
    try:
        r = ModelScan().scan(path)
        issues = r.get('issues') or []
        errors = r.get('errors') or []
        scanned = r['summary']['scanned']['total_scanned']
        if issues:
            out[path] = ['flagged', ', '.join(sorted({f"{i.get('severity')}:{i.get('operator')}" for i in issues}))]
        elif errors:
            out[path] = ['error', '; '.join(str(e.get('description', e))[:120] for e in errors[:2])]
        elif not scanned:
            out[path] = ['skipped', 'not a format it scans']
        else:
            out[path] = ['clean', '']
    except BaseException as e:
        out[path] = ['error', repr(e)[:160]]
print(json.dumps(out))
""",
    # fickling's own file dispatch (its `--huggingface` path: zip -> scan_zip_archive, pickle -> scan_file, TAR not
    # supported), with zipfile.is_zipfile in place of fickling.polyglot (which needs torch, not in the peers' venv)
    "fickling": r"""
import json, os, sys, tarfile, zipfile
from fickling.loader import scan_file, scan_zip_archive
PICKLE_EXT = {'.bin', '.pkl', '.pickle', '.pt', '.pth'}
out = {}
for path, dir_mode in json.loads(sys.argv[1]):
    try:
        if zipfile.is_zipfile(path):
            results = list(scan_zip_archive(path, graceful=True).values())
            if not results:
                out[path] = ['skipped', 'zip without a .pkl member']; continue
        elif tarfile.is_tarfile(path):
            out[path] = ['skipped', 'TAR: not supported by fickling']; continue
        elif dir_mode and os.path.splitext(path)[1].lower() not in PICKLE_EXT and open(path, 'rb').read(1) != b'\x80':
            out[path] = ['skipped', 'not a pickle or zip']; continue
        else:
            results = [scan_file(path, graceful=True)]
        unsafe = [r for r in results if not r.is_safe]
        if unsafe:
            out[path] = ['flagged', ', '.join(sorted({r.severity.name for r in unsafe}))
                         + ('; parse errors' if any(r.errors for r in unsafe) else '')]
        elif any(r.errors for r in results):
            out[path] = ['error', '; '.join(e for r in results for e in r.errors)[:160]]
        else:
            out[path] = ['clean', '']
    except BaseException as e:
        out[path] = ['error', repr(e)[:160]]
print(json.dumps(out))
""",
}

_VERSIONS = r"""
import json
from importlib.metadata import version
print(json.dumps({n: version(n) for n in ('picklescan', 'modelscan', 'fickling')}))
"""


def peer_versions(py: str) -> dict[str, str]:
    try:
        r = subprocess.run([py, "-c", _VERSIONS], capture_output=True, text=True, timeout=60)
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError) as e:
        return {p: f"unavailable ({type(e).__name__})" for p in PEERS}


def files_of(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def run_peer(py: str, peer: str, sample: Sample, timeout: float) -> tuple[str, str]:
    """One peer on one sample: each file judged, the sample flagged if any file is; else error if any file errs."""
    dir_mode = sample.path.is_dir()
    files = [[str(f), dir_mode] for f in files_of(sample.path)]
    per_file = _peer_batch(py, peer, files, timeout)
    if per_file is None and len(files) > 1:  # one file hangs or crashes the peer: the others on their own
        per_file = {}
        for f in files:
            per_file.update(_peer_batch(py, peer, [f], timeout) or {f[0]: ["error", "timeout or crash"]})
    if per_file is None:
        return "error", "timeout or crash"
    return aggregate(per_file, sample.path)


def _peer_batch(py: str, peer: str, files: list[list[Any]], timeout: float) -> dict[str, list[str]] | None:
    try:
        r = subprocess.run([py, "-c", _PEER_DRIVERS[peer], json.dumps(files)], capture_output=True, text=True,
                           timeout=timeout, cwd=tempfile.gettempdir())
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None


def aggregate(per_file: dict[str, list[str]], root: Path) -> tuple[str, str]:
    def rel(p: str) -> str:
        return os.path.relpath(p, root) if root.is_dir() else Path(p).name

    by: dict[str, list[str]] = {}
    for p, (v, detail) in per_file.items():
        by.setdefault(v, []).append(f"{rel(p)}{': ' + detail if detail else ''}")
    for v in ("flagged", "error"):
        if v in by:
            return v, "; ".join(by[v][:3]) + (f" (+{len(by[v]) - 3} files)" if len(by[v]) > 3 else "")
    if "clean" in by:
        skipped = len(by.get("skipped", []))
        return "clean", f"{len(by['clean'])} files scanned" + (f", {skipped} skipped" if skipped else "")
    return "skipped", "no file scanned"


def run_ckptinspect(sample: Sample, timeout: float) -> tuple[str, str]:
    """`scan PATH -o json`, and `audit PATH --all -o json` on a dir; flagged when a status is `unsafe`.
    (`python -m ckptinspect.cli.app` runs nothing: app.py has no `__main__` block; its `main()` is the console
    script, called here the same way.)"""
    cmds = [["scan", str(sample.path), "-o", "json"]]
    if sample.path.is_dir():
        cmds.append(["audit", str(sample.path), "--all", "-o", "json"])
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    statuses = []
    for c in cmds:
        try:
            r = subprocess.run([sys.executable, "-c", "from ckptinspect.cli.app import main; main()", *c],
                               capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
        except (subprocess.TimeoutExpired, OSError) as e:
            statuses.append((c[0], "timeout" if isinstance(e, subprocess.TimeoutExpired) else "error"))
            continue
        try:
            statuses.append((c[0], str(json.loads(r.stdout)["status"])))
        except (ValueError, KeyError, TypeError):
            statuses.append((c[0], f"error(exit {r.returncode})"))
    detail = " ".join(f"{c}={s}" for c, s in statuses)
    if any(s == "unsafe" for _, s in statuses):
        return "flagged", detail
    if any(s == "timeout" or s.startswith("error") for _, s in statuses):
        return "error", detail
    return "clean", detail


# --- report ------------------------------------------------------------------------------------------------------------

SHORT = {"flagged": "FLAG", "clean": "-", "skipped": "skip", "error": "ERR"}


def flagged(s: Sample, tool: str) -> bool:
    return s.verdicts.get(tool, ("", ""))[0] == "flagged"


def summarize(samples: list[Sample]) -> dict[str, Any]:
    live = [s for s in samples if s.kind == "hostile" and s.live]
    benign = [s for s in samples if s.kind == "benign"]
    missed = [s.name for s in live if not flagged(s, "ckptinspect") and any(flagged(s, p) for p in PEERS)]
    false = [s.name for s in benign if flagged(s, "ckptinspect") and not any(flagged(s, p) for p in PEERS)]
    return {
        "hostile_live": len(live),
        "hostile_not_live": [s.name for s in samples if s.kind == "hostile" and not s.live],
        "benign": len(benign),
        "flagged_live": {t: sum(flagged(s, t) for s in live) for t in TOOLS},
        "errors_live": {t: sum(s.verdicts.get(t, ("",))[0] == "error" for s in live) for t in TOOLS},
        "false_alarms": {t: sum(flagged(s, t) for s in benign) for t in TOOLS},
        "ckptinspect_missed_all": [s.name for s in live if not flagged(s, "ckptinspect")],
        "ckptinspect_false_alarms_all": [s.name for s in benign if flagged(s, "ckptinspect")],
        "claim_flags_every_case_a_peer_flags": {"pass": not missed, "offending": missed},
        "claim_no_false_alarm_where_peers_have_none": {"pass": not false, "offending": false},
    }


def table(samples: list[Sample], summary: dict[str, Any]) -> str:
    head = "| sample | set | live (real loader) | " + " | ".join(TOOLS) + " |"
    lines = [head, "|" + "---|" * (3 + len(TOOLS))]
    for s in samples:
        live = "trusted (not loaded)" if s.load is None else ("yes" if s.live else "NOT LIVE") \
            if s.kind == "hostile" else s.load_detail
        lines.append(f"| `{s.name}` | {s.kind} | {live} | "
                     + " | ".join(SHORT.get(s.verdicts.get(t, ("error",))[0], "?") for t in TOOLS) + " |")
    n, b = summary["hostile_live"], summary["benign"]
    lines.append(f"| **live hostile flagged** | | {n} live | "
                 + " | ".join(f"{summary['flagged_live'][t]}/{n}" for t in TOOLS) + " |")
    lines.append(f"| **benign false alarms** | | {b} benign | "
                 + " | ".join(f"{summary['false_alarms'][t]}/{b}" for t in TOOLS) + " |")
    c1, c2 = summary["claim_flags_every_case_a_peer_flags"], summary["claim_no_false_alarm_where_peers_have_none"]
    lines += ["", "FLAG = flagged, - = scanned, not flagged, skip = not scanned (not a format it reads), ERR = error "
              "or timeout (not counted as flagged)", "",
              f"ckptinspect flags every live case any peer flags: {'PASS' if c1['pass'] else 'FAIL'}"
              + ("" if c1["pass"] else f" ({', '.join(c1['offending'])})"),
              f"ckptinspect has no false alarm on a benign case where all peers have none: "
              f"{'PASS' if c2['pass'] else 'FAIL'}" + ("" if c2["pass"] else f" ({', '.join(c2['offending'])})")]
    lines.append("ckptinspect misses (live, not flagged): " + (", ".join(summary["ckptinspect_missed_all"]) or "none"))
    lines.append("ckptinspect false alarms (benign, flagged): "
                 + (", ".join(summary["ckptinspect_false_alarms_all"]) or "none"))
    if summary["hostile_not_live"]:
        lines.append(f"not live (excluded from the score): {', '.join(summary['hostile_not_live'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers-python", required=True, help="python of the venv holding picklescan/modelscan/fickling")
    ap.add_argument("--json", metavar="OUT", help="write the raw results here")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per tool per sample (default 120)")
    ap.add_argument("--details", action="store_true", help="also print each verdict's detail")
    a = ap.parse_args(argv)

    versions = peer_versions(a.peers_python)
    with tempfile.TemporaryDirectory(prefix="compare_scanners.") as tmp:
        d = Path(tmp)
        samples = build_hostile(d / "hostile") + build_benign(d / "benign")
        check_live(samples)
        for i, s in enumerate(samples, 1):
            print(f"[{i}/{len(samples)}] {s.name}", file=sys.stderr, flush=True)
            s.verdicts["ckptinspect"] = run_ckptinspect(s, a.timeout)
            for p in PEERS:
                s.verdicts[p] = run_peer(a.peers_python, p, s, a.timeout)
        if any(s.marker and s.marker.exists() for s in samples if s.kind == "hostile" and s.load):
            check_live(samples)  # a scanner that ran a payload would leave a marker: re-check from scratch
        summary = summarize(samples)
        import torch

        env = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
               "torch": torch.__version__, "versions": versions,
               "command": " ".join(["python", "benchmarks/compare_scanners.py", *(argv or sys.argv[1:])])}
        print(f"# {env['date']}  ckptinspect (this tree) vs "
              + ", ".join(f"{p} {versions.get(p, '?')}" for p in PEERS) + f"; torch {env['torch']}")
        print(table(samples, summary))
        if a.details:
            print()
            for s in samples:
                print(f"{s.name}: {s.load_detail}")
                for t in TOOLS:
                    print(f"    {t:12} {s.verdicts[t][0]:8} {s.verdicts[t][1]}")
        if a.json:
            rows = [{**{k: v for k, v in asdict(s).items() if k not in ("path", "marker")}, "path": str(s.path)}
                    for s in samples]
            Path(a.json).write_text(json.dumps({"env": env, "summary": summary, "samples": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
