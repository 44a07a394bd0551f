"""What the allowlisted globals of a pickle become: plain values and pure data builders, never the real thing.

`torch._utils._rebuild_tensor_v2` builds a `TensorRef` (dtype, shape, stride, storage key — the bytes are not read),
`torch.Size` a tuple, torch dtypes a `DType` string, `OrderedDict` a dict. `BUILDERS` maps each allowed function
global to its builder; `SafeUnpickler` (`unpickle.py`) hands them out from `find_class`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.model import dtype_size, numel


class DType(str):
    """A torch dtype seen in a pickle (`torch.float32` → ``DType("float32")``)."""

    __slots__ = ()


class StorageType(str):
    """A torch storage class seen in a pickle (`torch.FloatStorage`); the value is its element dtype."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class StorageRef:
    """A persistent storage id of a torch archive: `('storage', type, key, location, numel)`."""

    dtype: str
    key: str
    location: str
    numel: int


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor described, not loaded: what `torch._utils._rebuild_tensor_v2` would have built.

    storage_key is the archive record (``data/<key>``) holding the bytes.
    """

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_key: str | None
    storage_offset: int
    storage_numel: int | None

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * (dtype_size(self.dtype) or 0)


class StateDict(dict):  # type: ignore[type-arg]
    """`collections.OrderedDict` stand-in: a dict that also takes attributes (torch state dicts carry
    `_metadata`, which pickles as a BUILD state)."""


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any) -> TensorRef:
    if isinstance(storage, StorageRef):
        dtype, key, snumel = storage.dtype, storage.key, storage.numel
    else:
        dtype, key, snumel = "unknown", None, None
    return TensorRef(dtype, _ints(size), _ints(stride), key, _int(storage_offset),
                     _int(snumel) if snumel is not None else None)


def _rebuild_tensor_v3(
    storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, dtype: Any, *rest: Any
) -> TensorRef:
    ref = _rebuild_tensor(storage, storage_offset, size, stride)
    if isinstance(dtype, str):
        ref = TensorRef(str(dtype), ref.shape, ref.stride, ref.storage_key, ref.storage_offset, ref.storage_numel)
    return ref


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if callable(func) and isinstance(args, tuple):
        return func(*args)
    return func


MAX_DIMS = 64
MAX_EXTENT = 1 << 62  # shapes, strides and offsets beyond this are no tensor (and would wrap int64 arithmetic)


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise ReadError(f"expected a shape, got {type(value).__name__}", "CK206")
    if len(value) > MAX_DIMS:
        raise LimitExceeded(f"tensor of {len(value)} dimensions (bound {MAX_DIMS})", "CK603")
    out = tuple(_int(v) for v in value)
    n = 1
    for v in out:
        n *= abs(v)
        if n > MAX_EXTENT:
            raise LimitExceeded(f"{len(out)}-dim shape of more than 2**62 elements", "CK603")
    return out


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not -MAX_EXTENT <= v <= MAX_EXTENT:
        what = f"{v.bit_length()}-bit int" if isinstance(v, int) else type(v).__name__
        raise LimitExceeded(f"tensor coordinate out of bounds ({what})", "CK603")
    return v


def _get_layout(name: Any) -> str:
    return str(name)


def _device(*args: Any) -> str:
    return ":".join(str(a) for a in args)


def _codecs_encode(obj: Any, encoding: Any = "utf-8", *rest: Any) -> bytes:
    # protocol-2 pickles carry bytes as `_codecs.encode(str, 'latin1')`.
    if isinstance(obj, str) and str(encoding).lower().replace("_", "-") in ("latin1", "latin-1", "iso-8859-1"):
        return obj.encode("latin-1")
    raise ReadError("unsupported _codecs.encode call in pickle", "CK206")


def _guarded(kind: type[Any]) -> Callable[..., Any]:
    """`bytes` / `bytearray` that refuse to allocate from a claimed length (`bytes(10**12)`)."""

    def build(*args: Any) -> Any:
        if args and isinstance(args[0], int) and args[0] > (1 << 20):
            raise LimitExceeded(f"{kind.__name__}({args[0]}) exceeds the allocation bound", "CK603")
        return kind(*args)

    return build


def _deque(iterable: Any = (), maxlen: Any = None) -> list[Any]:
    """`collections.deque(iterable, maxlen)` as a list (APPENDS fills it; `maxlen` is not data of interest)."""
    return list(iterable)


def _counter(iterable: Any = ()) -> dict[Any, Any]:
    """`collections.Counter(mapping)` (what a Counter pickles as) as a dict of its counts."""
    if isinstance(iterable, dict):
        return dict(iterable)
    counts: dict[Any, Any] = {}
    for item in iterable:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _defaultdict(default_factory: Any = None, *args: Any) -> dict[Any, Any]:
    """`collections.defaultdict(factory)` (what a defaultdict pickles as, its items follow by SETITEMS) as a dict: the
    factory is data here (a stand-in), never called."""
    return dict(*args[:1])


BUILDERS: Mapping[tuple[str, str], Callable[..., Any]] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): tuple,  # REDUCE(torch.Size, (t,)): the builtin keeps this C-speed (millions of calls)
    ("torch.serialization", "_get_layout"): _get_layout,
    # int-valued enums of DCP (`WriteItemType(2)`, `_MEM_FORMAT_ENCODING(1)`): their values, built in C.
    ("torch.distributed.checkpoint.planner", "WriteItemType"): int,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): int,
    ("torch", "device"): _device,
    ("collections", "OrderedDict"): StateDict,
    ("collections", "deque"): _deque,
    ("collections", "Counter"): _counter,
    ("collections", "defaultdict"): _defaultdict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): _guarded(bytearray),
    ("builtins", "tuple"): tuple,
    ("builtins", "list"): list,
    ("builtins", "dict"): dict,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "str"): str,
    ("builtins", "bytes"): _guarded(bytes),
    ("builtins", "bool"): bool,
    ("__builtin__", "set"): set,
    ("_codecs", "encode"): _codecs_encode,
}
