"""Calls the allowlist cannot vouch for (issue 18 §1, "no deny-list verdicts"): a call is judged by what it really
runs, not by the name of the callee.

- `copyreg._reconstructor(cls, base, state)` runs `base.__new__(cls, state)` and `base.__init__(obj, state)`: inert
  only when `base` is `object` or an inert constructor and `cls` a class NEWOBJ may create.
- NEWOBJ / NEWOBJ_EX run `cls.__new__` (and BUILD `cls.__setstate__`): a class allowed only through a module prefix
  (`megatron.core.*`) is a reference, not a vetted constructor; only exact entries and the plain data classes
  (`callables.PLAIN_CLASSES`, checked here against the real classes) may be created.

The malicious samples are loaded for real (torch.load in a subprocess) to prove the loader runs them, and both
`audit` and `scan` must say `unsafe` without running them.
"""

from __future__ import annotations

import argparse
import enum
import json
import pickle
import subprocess
import sys
import textwrap
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.audit import audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.findings import Status
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.pickling.callables import PLAIN_CLASSES
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.pickling.walk import walk_pickle
from hostile_samples import write_zip, zip_entries

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_ckpts"
LEGACY_FILE = SAMPLES / "legacy" / "iter_0000001" / "mp_rank_00_000" / "distrib_optim.pt"
DCP_METADATA = SAMPLES / "dcp" / "step-10" / ".metadata"

IDX = "megatron.core.datasets.indexed_dataset"
NORM = "megatron.core.transformer.torch_norm"


def _u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _g(module: str, name: str) -> bytes:
    return _u(module) + _u(name) + b"\x93"


def reconstruct(cls: tuple[str, str], base: tuple[str, str], state: bytes = b"N", proto0: bool = False) -> bytes:
    """`copyreg._reconstructor(cls, base, state)` as a pickle: protocol 4 (STACK_GLOBAL) or protocol 0 as Python 2
    wrote it (`copy_reg`, GLOBAL lines)."""
    if proto0:
        return (b"ccopy_reg\n_reconstructor\n(c" + "\n".join(cls).encode() + b"\nc" + "\n".join(base).encode()
                + b"\n" + state + b"tR.")
    return b"\x80\x04" + _g("copyreg", "_reconstructor") + _g(*cls) + _g(*base) + state + b"\x87R."


def _norm_config() -> bytes:
    """An `argparse.Namespace` with what `WrappedTorchNorm.__new__` reads (megatron-core 0.16.1)."""
    items = b"".join(_u(k) + b"\x89" for k in ("layernorm_zero_centered_gamma", "persist_layer_norm",
                                                 "sequence_parallel", "memory_efficient_layer_norm"))
    return _g("argparse", "Namespace") + b")\x81}(" + items + _u("normalization") + _u("LayerNorm") + b"ub"


def newobj(module: str, name: str, args: bytes = b")", ex: bool = False) -> bytes:
    """NEWOBJ (or NEWOBJ_EX with empty kwargs) of `module.name` with the tuple `args` (pickle bytes)."""
    return b"\x80\x04" + _g(module, name) + args + (b"}\x92" if ex else b"\x81") + b"."


NORM_ARGS = _norm_config() + b"K\x04\x86"  # (config, hidden_size=4)
INDEXED_STATE = b"(" + _u("/nonexistent/ckptinspect-prefix") + b"\x89\x89NNNNt"  # IndexedDataset.__setstate__


# --- the walker's verdict, per variant ---------------------------------------------------------------------------

SAFE_RECONSTRUCT = {
    "object base": reconstruct(("argparse", "Namespace"), ("builtins", "object")),
    "builtin base": reconstruct(("collections", "OrderedDict"), ("builtins", "dict"), b"}"),
    "python 2 names": reconstruct(("argparse", "Namespace"), ("__builtin__", "object"), b"N", proto0=True),
    "plain data class, object base": reconstruct(("megatron.core.dist_checkpointing.mapping", "ShardedObject"),
                                                 ("builtins", "object")),
}
UNSAFE_RECONSTRUCT = {
    # base.__init__(obj, path) opens `path` for writing (megatron-core 0.16.1 IndexedDatasetBuilder)
    "prefix-allowed base and cls": (reconstruct((IDX, "IndexedDatasetBuilder"), (IDX, "IndexedDatasetBuilder"),
                                                _u("m")), f"{IDX}.IndexedDatasetBuilder"),
    "inert cls, prefix-allowed base": (reconstruct(("argparse", "Namespace"), (IDX, "IndexedDatasetBuilder"),
                                                   _u("m")), f"{IDX}.IndexedDatasetBuilder"),
    "protocol 0": (reconstruct(("argparse", "Namespace"), (IDX, "IndexedDatasetBuilder"), b"Vm\n", proto0=True),
                   f"{IDX}.IndexedDatasetBuilder"),
    "allowed but not inert base": (reconstruct(("argparse", "Namespace"), ("functools", "partial")),
                                   "functools.partial"),
    "enum base": (reconstruct(("argparse", "Namespace"), ("megatron.core.enums", "ModelType")),
                  "megatron.core.enums.ModelType"),
    "unknown base": (reconstruct(("argparse", "Namespace"), ("logging", "FileHandler"), _u("m")),
                     "logging.FileHandler"),
    "prefix-allowed cls with custom __setstate__": (reconstruct((IDX, "IndexedDataset"), ("builtins", "object")),
                                                    f"{IDX}.IndexedDataset"),
}


@pytest.mark.parametrize("name", SAFE_RECONSTRUCT)
def test_reconstructor_on_object_or_inert_base_is_no_call(name: str) -> None:
    walk = walk_pickle(SAFE_RECONSTRUCT[name])
    assert walk.error is None and walk.called == {}, (walk.error, walk.called)


@pytest.mark.parametrize("name", UNSAFE_RECONSTRUCT)
def test_reconstructor_is_judged_by_the_constructor_it_runs(name: str) -> None:
    data, callee = UNSAFE_RECONSTRUCT[name]
    walk = walk_pickle(data)
    assert walk.error is None, walk.error
    assert callee in walk.called, walk.called


@pytest.mark.parametrize("protocol", [0, 1])
def test_what_pythons_pickler_writes_with_reconstructor_stays_inert(protocol: int) -> None:
    # protocols 0/1 pickle plain instances as copyreg._reconstructor(cls, object, None) + BUILD
    data = pickle.dumps({"args": argparse.Namespace(lr=0.1), "order": OrderedDict(a=1)}, protocol=protocol)
    assert b"_reconstructor" in data
    walk = walk_pickle(data)
    assert walk.error is None and walk.called == {}, walk.called


NEWOBJ_UNSAFE = {
    "custom __new__": (newobj(NORM, "WrappedTorchNorm", NORM_ARGS), f"{NORM}.WrappedTorchNorm"),
    "custom __new__, NEWOBJ_EX": (newobj(NORM, "WrappedTorchNorm", NORM_ARGS, ex=True), f"{NORM}.WrappedTorchNorm"),
    "custom __setstate__": (newobj(IDX, "IndexedDataset")[:-1] + INDEXED_STATE + b"b.", f"{IDX}.IndexedDataset"),
    "DCP class that is not a record": (newobj("torch.distributed.checkpoint.filesystem", "FileSystemWriter"),
                                       "torch.distributed.checkpoint.filesystem.FileSystemWriter"),
    "through numpy _reconstruct": (b"\x80\x04" + _g("numpy.core.multiarray", "_reconstruct") + _g(NORM, "Norm")
                                   + b"K\x00\x85" + _u("b") + b"\x87R.", f"{NORM}.Norm"),
}
NEWOBJ_SAFE = {
    "exact entry": newobj("argparse", "Namespace"),
    "megatron record": newobj("megatron.core.dist_checkpointing.mapping", "ShardedTensor"),
    "megatron record, NEWOBJ_EX": newobj("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan",
                                         ex=True),
    "DCP record": newobj("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
}


@pytest.mark.parametrize("name", NEWOBJ_UNSAFE)
def test_newobj_on_a_prefix_allowed_class_is_a_call(name: str) -> None:
    data, callee = NEWOBJ_UNSAFE[name]
    walk = walk_pickle(data)
    assert walk.error is None, walk.error
    assert callee in walk.called, walk.called
    assert all(v.value == "allowed" for v in walk.globals.values())  # every name is on the allowlist


@pytest.mark.parametrize("name", NEWOBJ_SAFE)
def test_newobj_on_plain_data_classes_is_no_call(name: str) -> None:
    walk = walk_pickle(NEWOBJ_SAFE[name])
    assert walk.error is None and walk.called == {}, walk.called


# Methods of plain classes read line by line (torch 2.13): they assign fields and map an enum, nothing else.
REVIEWED = {"torch.distributed.checkpoint.metadata.TensorProperties.__setstate__"}

# Run in the real-loader subprocess (megatron-core and torch are imported there once): for every `PLAIN_CLASSES`
# entry, the Python methods of its own that NEWOBJ + BUILD would run (`__new__`, `__setstate__` anywhere in its MRO
# but `object`'s; for enums, `Enum(value)` is a member lookup whose only hook is `_missing_`). torch 2.13's DTensor
# placements are C++ (pybind11): their `__setstate__` only unpacks the (dim,) / (reduce_op,) state.
_PLAIN_CHECK = textwrap.dedent("""
    def plain_check(names):
        import enum, importlib, inspect
        out = {}
        for module, name in names:
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as e:
                out[module + '.' + name] = ['missing: ' + repr(e)[:100]]
                continue
            if not isinstance(cls, type):
                out[module + '.' + name] = ['not a class']
                continue
            mro = [k for k in cls.__mro__ if k is not object]
            methods = ['__new__', '__setstate__']
            if issubclass(cls, enum.Enum):
                if cls.__new__ is not enum.Enum.__new__ or cls._missing_.__func__ is not enum.Enum._missing_.__func__:
                    out[module + '.' + name] = ['enum with its own __new__ / _missing_']
                    continue
                methods = ['__setstate__']
                mro = [k for k in mro if k.__module__ not in ('enum', 'builtins')]
            out[module + '.' + name] = sorted(
                f'{k.__module__}.{k.__qualname__}.{m}' for k in mro for m in methods
                if m in vars(k) and inspect.isfunction(getattr(vars(k)[m], '__func__', vars(k)[m])))
        return out
""")


@pytest.mark.slow
def test_plain_classes_really_are_plain(loaded: dict[str, Loaded]) -> None:
    """Every `PLAIN_CLASSES` entry, imported from the real libraries (torch 2.13, megatron-core 0.16.1): NEWOBJ +
    BUILD on it run no code of its own."""
    own = loaded["plain classes"].outcome
    assert isinstance(own, dict) and len(own) == len(PLAIN_CLASSES)
    for q, methods in own.items():
        if q.startswith("torch.distributed._tensor.placement_types."):
            continue  # torch < 2.5 spelled the placements so; torch 2.13 has them under `distributed.tensor`
        assert set(methods) <= REVIEWED, (q, methods)


# --- the streaming `.metadata` reader defers to the reference on such calls ---------------------------------------------


def test_streaming_metadata_reader_defers_unsafe_newobj_to_the_reference(tmp_path: Path) -> None:
    import shutil

    import torch.distributed.checkpoint  # noqa: F401 - the sample is trusted: rewritten through torch's classes

    ckpt = tmp_path / "dcp"
    shutil.copytree(DCP_METADATA.parent, ckpt)
    md = pickle.loads(DCP_METADATA.read_bytes())
    md.storage_meta = "EVIL-SLOT"
    data = pickle.dumps(md, protocol=2)  # no frames: bytes can be swapped
    # the slot's string becomes a NEWOBJ of a prefix-allowed class with its own __new__ (the BINPUT after it stays)
    data = data.replace(b"X\x09\x00\x00\x00EVIL-SLOT", _g(NORM, "WrappedTorchNorm") + NORM_ARGS + b"\x81")
    (ckpt / ".metadata").write_bytes(data)
    report = PickleReport()
    out = read_metadata(data, report)
    assert out.fallback is not None and "WrappedTorchNorm" in out.fallback
    assert f"{NORM}.WrappedTorchNorm" in report.called, report.called
    a = audit(ckpt)
    assert a.status is Status.UNSAFE and "CK604" in {f.code for f in a.findings}, a.findings
    assert scan_path(ckpt, "s").status is Status.UNSAFE


# --- the real loader runs them; ckptinspect says unsafe ---------------------------------------------------------------

_TYPES = _PLAIN_CHECK + textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter('ignore')
    import torch
    out = {'plain classes': plain_check(json.loads(sys.argv[1]))}
    for p in sys.argv[2:]:
        try:
            obj = torch.load(p, weights_only=False)
            out[p] = 'returned ' + type(obj).__module__ + '.' + type(obj).__qualname__
        except BaseException as e:
            out[p] = 'raised ' + repr(e)[:300]
    print(json.dumps(out))
""")


@dataclass(frozen=True)
class Loaded:
    path: Path
    marker: Path | None
    outcome: Any


REAL = {
    # name: (data.pkl builder given the marker path, marker expected, what the loader's outcome must show)
    "reconstructor: builder base writes a file": (
        lambda m: reconstruct((IDX, "IndexedDatasetBuilder"), (IDX, "IndexedDatasetBuilder"), _u(str(m))), True, ""),
    "reconstructor: inert cls, builder base": (
        lambda m: reconstruct(("argparse", "Namespace"), (IDX, "IndexedDatasetBuilder"), _u(str(m))), True, ""),
    "reconstructor: protocol 0": (
        lambda m: reconstruct(("argparse", "Namespace"), (IDX, "IndexedDatasetBuilder"), f"V{m}\n".encode(),
                              proto0=True), True, ""),
    # WrappedTorchNorm.__new__ builds and returns a torch LayerNorm: the class's own code ran
    "newobj: custom __new__": (lambda m: newobj(NORM, "WrappedTorchNorm", NORM_ARGS), False,
                               "returned torch.nn.modules.normalization.LayerNorm"),
    "newobj_ex: custom __new__": (lambda m: newobj(NORM, "WrappedTorchNorm", NORM_ARGS, ex=True), False,
                                  "returned torch.nn.modules.normalization.LayerNorm"),
    # IndexedDataset.__setstate__ opens the files its state names (here: asserts they exist)
    "newobj + build: custom __setstate__": (lambda m: newobj(IDX, "IndexedDataset")[:-1] + INDEXED_STATE + b"b.",
                                            False, "cannot be found at the path prefix"),
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Loaded]:
    root = tmp_path_factory.mktemp("calls")
    entries = zip_entries(LEGACY_FILE.read_bytes())
    out: dict[str, tuple[Path, Path | None]] = {}
    for i, (name, (build, wants_marker, _)) in enumerate(REAL.items()):
        marker = root / f"ran-{i}"
        path = root / f"sample-{i}.pt"
        evil = build(marker)
        path.write_bytes(write_zip([(n, evil if n.endswith("/data.pkl") else d) for n, d in entries]))
        out[name] = (path, marker if wants_marker else None)
    result = subprocess.run([sys.executable, "-c", _TYPES, json.dumps(sorted(PLAIN_CLASSES)),
                             *(str(p) for p, _ in out.values())], capture_output=True, text=True, timeout=300)
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    got = {k: Loaded(p, m, outcomes[str(p)]) for k, (p, m) in out.items()}
    got["plain classes"] = Loaded(root, None, outcomes["plain classes"])
    return got


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_loader_runs_it_and_ckptinspect_says_unsafe(name: str, loaded: dict[str, Loaded],
                                                         tmp_path: Path) -> None:
    sample = loaded[name]
    if sample.marker is not None:
        assert sample.marker.exists(), f"torch.load did not run it: {sample.outcome}"
        sample.marker.unlink()
    assert REAL[name][2] in sample.outcome
    s = scan_path(sample.path, "s")
    a = audit(sample.path)
    assert s.status is Status.UNSAFE, s.findings
    assert a.status is Status.UNSAFE, a.findings
    assert "CK604" in {f.code for f in s.findings} & {f.code for f in a.findings}
    if sample.marker is not None:
        assert not sample.marker.exists()  # ckptinspect ran nothing


def test_a_safe_reconstructor_in_a_real_archive_stays_complete(tmp_path: Path) -> None:
    entries = zip_entries(LEGACY_FILE.read_bytes())
    data = pickle.dumps({"args": argparse.Namespace(lr=0.1)}, protocol=1)
    path = tmp_path / "ok.pt"
    path.write_bytes(write_zip([(n, data if n.endswith("/data.pkl") else d) for n, d in entries]))
    assert scan_path(path, "s").status is Status.COMPLETE
    assert "CK604" not in {f.code for f in audit(path).findings}
