"""Plain data from unpickled stand-ins: dicts, lists, scalars, `TensorRef`s and `OpaqueValue`s.

Megatron's common state and legacy state dicts are converted with `to_plain` before anything else looks at them;
`walk_tensors` lists the tensors of a state dict. Both bound the nesting they follow (CK603).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckptinspect.errors import LimitExceeded
from ckptinspect.pickling.builders import DType, StorageRef, StorageType, TensorRef
from ckptinspect.pickling.unpickle import MAX_NESTING, Obj

@dataclass(frozen=True, slots=True)
class OpaqueValue:
    """A value the tool kept opaque (an object of a non-builtin class): its class and a short summary."""

    qualname: str
    summary: str

    def __str__(self) -> str:
        return f"<{self.qualname}>" if not self.summary else f"<{self.qualname} {self.summary}>"


MAX_PLAIN_NODES = 2_000_000  # values built by one conversion (shared references count each time they are reached)


def to_plain(obj: Any) -> Any:
    """`_to_plain` with Python's own recursion limit also reported as a resource bound (CK603).

    A pickle can reference one list from many places ("billion laughs": 30 levels of two references to the level
    below are 2**30 paths): the unpickler shares them, a plain copy would not. The conversion counts every value it
    builds and stops at `MAX_PLAIN_NODES` (CK603)."""
    _budget[0] = MAX_PLAIN_NODES
    try:
        size = _expanded_size(obj, 0, {})
        if size > MAX_PLAIN_NODES:
            raise LimitExceeded(f"shared references expand to {size} values (bound {MAX_PLAIN_NODES})", "CK603")
        return _to_plain(obj, 0)
    except RecursionError as e:
        raise LimitExceeded("object nesting exceeds the interpreter's recursion limit", "CK603") from e


def _to_plain(obj: Any, depth: int = 0) -> Any:
    """Convert unpickled stand-ins into plain data: dicts, lists, tuples, scalars, `TensorRef`, `OpaqueValue`.

    `argparse.Namespace` becomes a dict; a Megatron enum member becomes its value's string. Raises
    `LimitExceeded` when nesting is deeper than `MAX_NESTING`.
    """
    if depth > MAX_NESTING:
        raise LimitExceeded(f"object nesting deeper than {MAX_NESTING}", "CK603")
    _budget[0] -= 1
    if _budget[0] < 0:
        raise LimitExceeded(f"more than {MAX_PLAIN_NODES} values reached through shared references", "CK603")
    if isinstance(obj, int) and not isinstance(obj, bool) and obj.bit_length() > MAX_INT_BITS:
        # beyond CPython's int-to-str limit (4,300 digits): str() / repr() / JSON of it would raise
        return OpaqueValue("int", f"{obj.bit_length()}-bit")
    if obj is None or isinstance(obj, (bool, int, float, complex, TensorRef, StorageRef)):
        return obj
    if isinstance(obj, (DType, StorageType)):
        return str(obj)
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, bytearray):
        return bytes(obj)
    if isinstance(obj, dict):
        return {_key(_to_plain(k, depth + 1)): _to_plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_plain(v, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_plain(v, depth + 1) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return sorted((_to_plain(v, depth + 1) for v in obj), key=repr)
    if isinstance(obj, Obj):
        q = obj.qualname
        if q == "argparse.Namespace":
            return {str(k): _to_plain(v, depth + 1) for k, v in obj.__dict__.items() if not k.startswith("_")}
        args = obj.__dict__.get("_args")
        if args is not None and len(args) == 1 and isinstance(args[0], (int, str, float)) and len(obj.__dict__) == 1:
            # Enum members pickle as `EnumClass(value)`.
            return OpaqueValue(q, _short_repr(args[0]))
        return OpaqueValue(q, "")
    if isinstance(obj, slice):
        return _short_repr(obj)
    return OpaqueValue(type(obj).__name__, "")


_budget = [MAX_PLAIN_NODES]


def _expanded_size(obj: Any, depth: int, memo: dict[int, int]) -> int:
    """How many values a plain copy of `obj` would hold, counted once per distinct container (linear in what the
    pickle built, whatever it expands to)."""
    if depth > MAX_NESTING:
        raise LimitExceeded(f"object nesting deeper than {MAX_NESTING}", "CK603")
    if isinstance(obj, dict):
        children: Any = [x for kv in obj.items() for x in kv]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = obj
    elif isinstance(obj, Obj):
        children = list(obj.__dict__.values())
    else:
        return 1
    known = memo.get(id(obj))
    if known is not None:
        return known
    memo[id(obj)] = 1  # a cycle counts once
    total = 1 + sum(_expanded_size(c, depth + 1, memo) for c in children)
    memo[id(obj)] = total
    return total
MAX_INT_BITS = 13_000  # ~3,900 decimal digits


def _short_repr(v: Any) -> str:
    if isinstance(v, int) and v.bit_length() > MAX_INT_BITS:
        return f"<{v.bit_length()}-bit int>"
    try:
        text = repr(v)
    except (ValueError, RecursionError):
        return f"<{type(v).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


def _key(k: Any) -> Any:
    try:
        hash(k)
        return k
    except TypeError:
        return _short_repr(k)


def walk_tensors(obj: Any, prefix: str = "") -> list[tuple[str, TensorRef]]:
    """`(dotted.path, TensorRef)` for every tensor inside plain data (state dicts); deep nesting is CK603."""
    try:
        return list(_walk_tensors(obj, prefix, 0))
    except RecursionError as e:
        raise LimitExceeded("object nesting exceeds the interpreter's recursion limit", "CK603") from e


def _walk_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, TensorRef]]:
    if depth > MAX_NESTING:
        raise LimitExceeded(f"object nesting deeper than {MAX_NESTING}", "CK603")
    if isinstance(obj, TensorRef):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk_tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk_tensors(v, f"{prefix}.{i}" if prefix else str(i), depth + 1)
