"""One test per allowlist entry: the real library writes it (or its real loader allows it), and it reads back here.

Every exact entry of `pickling/allowlist.py` (`_ALLOWED_EXACT`, `_ALLOWED_IN_DANGEROUS`) has a WITNESS below: an
object built with the real library whose pickle references the entry, and a note saying why calling the entry with
any argument the pickle can pass runs no code of the pickle's choosing. The test per entry proves that
- the real pickler writes a reference to the entry (stdlib `pickle` at protocol 0, 2 and 4, or `torch.save`), and the
  real loader reads the bytes back (stdlib `pickle.loads`, or `torch.load(weights_only=True)` for torch witnesses);
- ckptinspect's walker judges every global of those bytes allowed, records no call outside the inert constructors,
  and its safe unpickler reads them back;
- `policy.resolve` calls the entry allowed.
An entry added to the allowlist without a witness here fails `test_every_allowlist_entry_has_a_witness`.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import enum
import functools
import io
import pathlib
import pickle
import signal
import types
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from ckptinspect.pickling import allowlist
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.policy import resolve
from ckptinspect.pickling.unpickle import PickleReport, SafeUnpickler
from ckptinspect.pickling.walk import walk_pickle


@dataclass(frozen=True)
class Witness:
    build: Callable[[], Any]  # the object, built with the real library
    why: str  # why the entry is inert for every argument a pickle can give it
    torch: bool = False  # written with torch.save (persistent ids), read back with torch.load(weights_only=True)
    spelled: tuple[str, str] | None = None  # the real pickler spells the entry this way (Python 2 names, numpy 1.x)
    torch_allows: bool = True  # (torch entries nothing writes) torch's weights_only unpickler allows the name


def _t() -> Any:
    import torch

    return torch


def _param_with_state() -> Any:
    p = _t().nn.Parameter(_t().zeros(2))
    p.tag = "x"  # a Python attribute: torch.save writes _rebuild_parameter_with_state
    return p


def _tensor_with_attr() -> Any:
    t = _t().zeros(2)
    t.tag = "x"  # _rebuild_from_type_v2(func, torch.Tensor, args, state)
    return t


_MESH: list[Any] = []


def _dtensor() -> Any:
    """A DTensor on a one-rank CPU mesh (a gloo group through a file store, made once for this module)."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if not _MESH:
        if not dist.is_initialized():
            store = tempfile.NamedTemporaryFile(prefix="ckptinspect-pg-", delete=False)
            store.close()
            dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
        _MESH.append(init_device_mesh("cpu", (1,)))
    return distribute_tensor(_t().arange(4.0), _MESH[0], [Shard(0)])


def _njt() -> Any:
    return _t().nested.nested_tensor([_t().zeros(2), _t().zeros(3)], layout=_t().jagged)


_TYPE = "a class object: pickling the type itself writes the reference; calling it builds a plain value"
_REBUILD = ("torch's rebuild function: builds a tensor view over a storage torch.load resolves through persistent ids; "
            "torch's own weights_only unpickler allows it")

WITNESSES: dict[tuple[str, str], Witness] = {
    ("collections", "OrderedDict"): Witness(lambda: collections.OrderedDict(a=1), "a dict subclass"),
    ("collections", "defaultdict"): Witness(lambda: collections.defaultdict(list, a=[1]),
                                            "stores its factory; only a missing-key lookup after loading calls it"),
    ("collections", "deque"): Witness(lambda: collections.deque([1, 2], maxlen=4), "a container (builders.py)"),
    ("collections", "Counter"): Witness(lambda: collections.Counter("aab"), "a dict subclass"),
    ("builtins", "set"): Witness(lambda: {1, 2}, "a container"),
    ("builtins", "frozenset"): Witness(lambda: frozenset({1}), "a container"),
    ("builtins", "slice"): Witness(lambda: slice(1, 5, 2), "stores its three arguments"),
    ("builtins", "complex"): Witness(lambda: complex(1, 2), "a number"),
    ("builtins", "bytearray"): Witness(lambda: bytearray(b"xy"), "a buffer"),
    ("builtins", "range"): Witness(lambda: range(3), "stores its arguments"),
    ("builtins", "tuple"): Witness(lambda: tuple, _TYPE),
    ("builtins", "list"): Witness(lambda: collections.defaultdict(list), _TYPE),
    ("builtins", "dict"): Witness(lambda: dict, _TYPE),
    ("builtins", "int"): Witness(lambda: collections.defaultdict(int), _TYPE),
    ("builtins", "float"): Witness(lambda: float, _TYPE),
    ("builtins", "str"): Witness(lambda: str, _TYPE),
    ("builtins", "bytes"): Witness(lambda: bytes, _TYPE),
    ("builtins", "bool"): Witness(lambda: bool, _TYPE),
    ("builtins", "object"): Witness(lambda: argparse.Namespace(a=1), "protocols 0/1 name it as _reconstructor's "
                                    "base: object.__new__ runs no user code, object.__init__ is skipped"),
    ("__builtin__", "set"): Witness(lambda: {1}, "Python 2 spelling of builtins.set (protocols < 3)",
                                    spelled=("__builtin__", "set")),
    ("copy_reg", "_reconstructor"): Witness(lambda: argparse.Namespace(a=1), "base.__new__(cls) and "
                                            "base.__init__(obj, state) for "
                                            "an allowlisted base only (callables.init_safely)",
                                            spelled=("copy_reg", "_reconstructor")),
    ("copyreg", "_reconstructor"): Witness(lambda: argparse.Namespace(a=1),
                                           "as copy_reg._reconstructor (fix_imports=False)"),
    ("argparse", "Namespace"): Witness(lambda: argparse.Namespace(lr=1e-4), "an attribute bag"),
    ("datetime", "datetime"): Witness(lambda: datetime.datetime(2026, 1, 1, 12), "parses its bytes state"),
    ("datetime", "date"): Witness(lambda: datetime.date(2026, 1, 1), "parses its bytes state"),
    ("datetime", "timedelta"): Witness(lambda: datetime.timedelta(seconds=5), "a number"),
    ("pathlib", "PosixPath"): Witness(lambda: pathlib.PosixPath("/x/y"), "a path string; never touches the disk"),
    ("pathlib", "WindowsPath"): Witness(lambda: pathlib.WindowsPath, _TYPE + " (refuses to build on POSIX)"),
    ("pathlib", "PurePosixPath"): Witness(lambda: pathlib.PurePosixPath("x"), "a path string"),
    ("uuid", "UUID"): Witness(lambda: uuid.UUID(int=7), "parses an int"),
    ("enum", "Enum"): Witness(lambda: enum.Enum, _TYPE + "; Enum(value) is a lookup among existing members"),
    ("functools", "partial"): Witness(lambda: functools.partial(collections.OrderedDict, a=1),
                                      "stores func/args; calls nothing when built (a partial of a dangerous func "
                                      "is judged on the func's own reference)"),
    ("_codecs", "encode"): Witness(lambda: b"\x00\xff", "protocols < 3 write bytes as encode(str, 'latin1'); the "
                                   "codec name is looked up among installed codecs only (encodings package)"),
    ("signal", "Signals"): Witness(lambda: signal.SIGTERM, "an IntEnum: Signals(15) is a lookup by value "
                                   "(Megatron-LM's args.exit_signal; Megatron-Core's safe_globals.py allows it)"),
    ("types", "SimpleNamespace"): Witness(lambda: types.SimpleNamespace(a=1), "an attribute bag"),
    ("_io", "BytesIO"): Witness(lambda: io.BytesIO, _TYPE + " (an instance refuses to pickle); BytesIO(b) is an "
                                "in-memory buffer"),
    ("io", "BytesIO"): Witness(lambda: io.BytesIO, _TYPE + " (io re-exports _io.BytesIO)", spelled=("_io", "BytesIO")),
    # numpy (2.x writes numpy._core; 1.x wrote numpy.core, which numpy 2 still resolves through its shim)
    ("numpy", "dtype"): Witness(lambda: np.dtype("float16"), "parses a type code"),
    ("numpy", "ndarray"): Witness(lambda: np.arange(3), "an array of its bytes state"),
    ("numpy._core.multiarray", "_reconstruct"): Witness(lambda: np.arange(3), "allocates an empty array"),
    ("numpy._core.multiarray", "scalar"): Witness(lambda: np.float32(1.5), "a scalar of its bytes; object dtypes "
                                                  "are refused (callables.py)"),
    ("numpy.core.multiarray", "_reconstruct"): Witness(lambda: np.arange(3), "numpy 1.x spelling of "
                                                       "numpy._core.multiarray._reconstruct",
                                                       spelled=("numpy._core.multiarray", "_reconstruct")),
    ("numpy.core.multiarray", "scalar"): Witness(lambda: np.float32(1.5), "numpy 1.x spelling",
                                                 spelled=("numpy._core.multiarray", "scalar")),
    **{("numpy.dtypes", f"{n}DType"): Witness((lambda n=n: type(np.dtype(n.lower()))), _TYPE)
       for n in ("Float64", "Float32", "Float16", "Int64", "Int32", "Int16", "Int8", "UInt64", "UInt32", "UInt16",
                 "UInt8", "Bool")},
    ("numpy.random._pickle", "__randomstate_ctor"): Witness(lambda: np.random.RandomState(0),
                                                            "builds a RandomState of an allowlisted bit generator"),
    ("numpy.random._pickle", "__bit_generator_ctor"): Witness(lambda: np.random.RandomState(0),
                                                              "instantiates a bit generator class or name"),
    ("numpy.random._pickle", "__generator_ctor"): Witness(lambda: np.random.default_rng(0), "builds a Generator"),
    ("numpy.random.mtrand", "RandomState"): Witness(lambda: np.random.RandomState, _TYPE),
    ("numpy.random._mt19937", "MT19937"): Witness(lambda: np.random.RandomState(0), "a bit generator"),
    ("numpy.random._pcg64", "PCG64"): Witness(lambda: np.random.default_rng(0), "a bit generator"),
    ("numpy.random._pcg64", "PCG64DXSM"): Witness(lambda: np.random.Generator(np.random.PCG64DXSM(0)),
                                                  "a bit generator"),
    ("numpy.random._philox", "Philox"): Witness(lambda: np.random.Generator(np.random.Philox(0)), "a bit generator"),
    ("numpy.random._sfc64", "SFC64"): Witness(lambda: np.random.Generator(np.random.SFC64(0)), "a bit generator"),
    ("numpy.random.bit_generator", "SeedSequence"): Witness(lambda: np.random.default_rng(0),
                                                            "Cython's unpickle helper builds it"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"): Witness(
        lambda: np.random.default_rng(0), "Cython's generated unpickle helper: checks a checksum, sets fields"),
    # torch: torch.save witnesses are read back by torch.load(weights_only=True)
    ("torch", "Size"): Witness(lambda: {"s": _t().Size([2, 3])}, "a tuple", torch=True),
    ("torch._utils", "_rebuild_tensor_v2"): Witness(lambda: {"t": _t().zeros(2)}, _REBUILD, torch=True),
    ("torch._utils", "_rebuild_tensor_v3"): Witness(lambda: {"t": _t().zeros(2, dtype=_t().float8_e4m3fn)},
                                                    _REBUILD, torch=True),
    ("torch._utils", "_rebuild_parameter"): Witness(lambda: {"p": _t().nn.Parameter(_t().zeros(2))}, _REBUILD,
                                                    torch=True),
    ("torch._utils", "_rebuild_parameter_with_state"): Witness(lambda: {"p": _param_with_state()}, _REBUILD,
                                                               torch=True),
    ("torch._utils", "_rebuild_qtensor"): Witness(
        lambda: {"q": _t().quantize_per_tensor(_t().ones(2), 0.1, 0, _t().qint8)}, _REBUILD, torch=True),
    ("torch._utils", "_rebuild_sparse_tensor"): Witness(lambda: {"s": _t().eye(2).to_sparse()}, _REBUILD,
                                                        torch=True),
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): Witness(lambda: {"m": _t().zeros(2, device="meta")},
                                                                 _REBUILD, torch=True),
    ("torch._utils", "_rebuild_nested_tensor"): Witness(
        lambda: {"n": _t().nested.nested_tensor([_t().zeros(2), _t().zeros(3)])}, _REBUILD, torch=True),
    ("torch._tensor", "_rebuild_from_type_v2"): Witness(lambda: {"t": _tensor_with_attr()},
                                                        "calls an allowlisted rebuild function, sets plain "
                                                        "attributes", torch=True),
    ("torch", "Tensor"): Witness(lambda: {"t": _tensor_with_attr()}, _TYPE, torch=True),
    ("torch.serialization", "_get_layout"): Witness(lambda: {"s": _t().eye(2).to_sparse()},
                                                    "maps a layout name to a torch layout", torch=True),
    ("torch", "device"): Witness(lambda: {"d": _t().device("cpu")}, "parses a device string", torch=True),
    ("torch.storage", "UntypedStorage"): Witness(lambda: {"t": _t().zeros(2, dtype=_t().uint16)},
                                                 "the storage type named in a persistent id", torch=True),
    ("torch", "strided"): Witness(lambda: {"l": _t().strided}, "a layout constant", torch=True,
                                  spelled=("torch.serialization", "_get_layout")),
    # entries torch 2.13 no longer writes for a CPU tensor but its weights_only unpickler still allows (older
    # checkpoints, other devices): the witness is the real pickler's reference to the real object
    ("torch._utils", "_rebuild_tensor"): Witness(lambda: _t()._utils._rebuild_tensor, _REBUILD),
    ("torch._utils", "_rebuild_wrapper_subclass"): Witness(lambda: _t()._utils._rebuild_wrapper_subclass, _REBUILD),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"): Witness(
        lambda: _t()._utils._rebuild_device_tensor_from_numpy, _REBUILD),
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): Witness(
        lambda: _t()._utils._rebuild_device_tensor_from_cpu_tensor, _REBUILD),
    ("torch._tensor", "_rebuild_from_type"): Witness(
        lambda: _t()._tensor._rebuild_from_type, "torch 1.x wrote it for a tensor with attributes (v2 since 1.12; "
        "torch's weights_only no longer allows it): it calls its func argument, so that argument counts as called "
        "(callables.THROUGH_CALL) and is judged on its own", torch_allows=False),
    ("torch.nn.parameter", "Parameter"): Witness(lambda: _t().nn.parameter.Parameter, _TYPE),
    ("torch.storage", "TypedStorage"): Witness(lambda: _t().storage.TypedStorage, _TYPE),
    ("torch", "UntypedStorage"): Witness(lambda: _t().UntypedStorage, _TYPE,
                                         spelled=("torch.storage", "UntypedStorage")),
    ("torch", "sparse_coo"): Witness(lambda: {"l": _t().sparse_coo}, "a layout constant", torch=True,
                                     spelled=("torch.serialization", "_get_layout")),
    # torch.distributed / torch.nested classes torch 2.13 registers with its weights_only unpickler: a DTensor
    # (on a one-rank gloo mesh, `_dtensor`) pickles its DTensorSpec, TensorMeta, ShardOrderEntry, DeviceMesh and
    # its layouts; a jagged nested tensor its NestedTensor, `_rebuild_njt` and a `_DimRange`
    **{k: Witness(lambda: {"d": _dtensor()}, "a data class built by NEWOBJ + BUILD (no __init__ runs); DeviceMesh's "
                  "own __setstate__ only stores fields", torch=True)
       for k in (("torch.distributed.tensor", "DTensor"), ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
                 ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
                 ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
                 ("torch.distributed.device_mesh", "DeviceMesh"), ("torch.distributed._mesh_layout", "_MeshLayout"),
                 ("torch.distributed._mesh_layout", "_FlatLayout"))},
    **{k: Witness(lambda: {"n": _njt()}, "NestedTensor(**kwargs) over the tensors it is given; _DimRange a frozen "
                  "dataclass of three ints", torch=True, torch_allows=False)
       for k in (("torch.nested._internal.nested_tensor", "NestedTensor"),
                 ("torch.nested._internal.nested_tensor", "_rebuild_njt"), ("torch._dynamo.decorators", "_DimRange"))},
    # memory formats: the real pickler writes them from protocol 4 on (below 4 it refuses), torch's weights_only
    # refuses them; they are non-callable constants (test_torch_constants_are_not_callable): naming one runs nothing
    **{("torch", n): Witness((lambda n=n: getattr(_t(), n)), "a memory-format constant", torch_allows=False,
                             spelled=("torch._utils", f"torch.{n}"))
       for n in ("contiguous_format", "channels_last", "preserve_format")},
}

# Entries of libraries that are no test dependency: the witness is a committed file the real library wrote (the tool
# that rebuilds it says how), and the note says why the entry is inert. megatron-energon 7.4.1's dataloader state
# classes (tools/make_stack_samples.py `add_bridge_energon`): slotted kw-only dataclasses (`edataclass`) that NEWOBJ
# makes with object.__new__ and BUILD fills with their slot values, and `FlexState`, `class FlexState(dict): pass`;
# none defines `__new__`, `__setstate__` or `__reduce__`. Megatron-Bridge's own restricted loader allows them.
_ENERGON = pathlib.Path(__file__).resolve().parents[3] / "sample_ckpts/bridge/energon/iter_0000002"
RECORDED: dict[tuple[str, str], pathlib.Path] = {
    (m, n): _ENERGON / "train_dataloader_dprank000.pt"
    for m, n in (("megatron.energon.state", "FlexState"), ("megatron.energon.rng", "SystemRngState"),
                 *(("megatron.energon.savable_loader", k) for k in
                   ("SavableDataLoaderState", "SavableDatasetCheckpoint", "SavableDatasetState")))
}

ENTRIES = sorted(allowlist._ALLOWED_EXACT | allowlist._ALLOWED_IN_DANGEROUS)


def test_every_allowlist_entry_has_a_witness() -> None:
    assert set(ENTRIES) - set(WITNESSES) - set(RECORDED) == set(), "allowlist entries without a witness"
    assert (set(WITNESSES) | set(RECORDED)) - set(ENTRIES) == set(), "witnesses for names not on the allowlist"


class _Recording(pickle.Unpickler):
    """The real (stdlib) unpickler, recording the globals it resolves."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.seen: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.seen.add((module, name))
        return super().find_class(module, name)


def _torch_pickle(obj: Any) -> tuple[bytes, bytes]:
    buf = io.BytesIO()
    _t().save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return buf.getvalue(), z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def _judged_here(data: bytes) -> None:
    walk = walk_pickle(data)
    assert walk.complete and not walk.unsafe, (walk.error, walk.limit, walk.dangerous)
    assert all(v is GlobalClass.ALLOWED for v in walk.globals.values()), walk.globals
    assert not walk.called, walk.called
    report = PickleReport()
    SafeUnpickler(io.BytesIO(data), report).load()
    assert all(v is GlobalClass.ALLOWED for v in report.globals.values()), report.globals


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{m}.{n}" for m, n in ENTRIES])
def test_entry_is_written_by_the_real_library_and_read_back(entry: tuple[str, str]) -> None:
    if entry in RECORDED:
        assert resolve(*entry).verdict is GlobalClass.ALLOWED
        with zipfile.ZipFile(RECORDED[entry]) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
        assert f"{entry[0]}.{entry[1]}" in walk_pickle(data).globals, "the real file does not name the entry"
        _judged_here(data)
        return
    witness = WITNESSES[entry]
    module, name = witness.spelled or entry
    assert resolve(*entry).verdict is GlobalClass.ALLOWED
    obj = witness.build()
    if witness.torch:
        archive, data = _torch_pickle(obj)
        walked = walk_pickle(data).globals
        assert f"{module}.{name}" in walked, walked
        if witness.torch_allows:
            _t().load(io.BytesIO(archive), weights_only=True)  # the real loader's own allowlist takes it
        else:  # the real loader, as a checkpoint of these classes is loaded (weights_only refuses _DimRange)
            _t().load(io.BytesIO(archive), weights_only=False)
        _judged_here(data)
        return
    found = False
    for protocol, fix_imports in ((0, True), (0, False), (2, True), (2, False), (4, True)):
        try:
            data = pickle.dumps(obj, protocol=protocol, fix_imports=fix_imports)
        except TypeError:  # torch's memory formats pickle from protocol 4 on only
            continue
        real = _Recording(data)
        real.load()  # the real unpickler reads it back
        found |= (module, name) in real.seen
        _judged_here(data)
    assert found, f"the real pickler never wrote {module}.{name}"
    if entry[0].startswith("torch") and witness.torch_allows:
        assert f"{module}.{name}" in _t()._weights_only_unpickler._get_allowed_globals()


def test_torch_constants_are_not_callable() -> None:
    """The `torch.<name>` globals allowed by rule (dtypes and their aliases, layouts, memory formats, qschemes, sub-byte
    and bit types): the real objects are non-callable constants, so a pickle naming one runs nothing; the dtypes
    torch.save writes read back through torch's weights_only unpickler and are judged allowed here."""
    torch = _t()
    allowed = torch._weights_only_unpickler._get_allowed_globals()
    for n in sorted(set(allowlist.TORCH_DTYPES) | allowlist.TORCH_CONSTANTS):
        obj = getattr(torch, n)
        assert not callable(obj), n
        assert resolve("torch", n).verdict is GlobalClass.ALLOWED, n
        if isinstance(obj, torch.dtype) and f"torch.{n}" in allowed:
            archive, data = _torch_pickle({"dtype": obj})
            assert torch.load(io.BytesIO(archive), weights_only=True)["dtype"] is obj, n
            _judged_here(data)
