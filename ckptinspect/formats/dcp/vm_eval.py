"""The opcode evaluator behind the streaming `.metadata` reader (`stream.py`): values, memo, stack.

It walks the pickle opcode by opcode (protocols 2-5, as torch's `FileSystemWriter.finish` and Megatron write it) and
evaluates only what a DCP `Metadata` needs, writing chunks and storage entries into `_Sink` columns instead of
objects. Safety is the reference unpickler's (`unpickle.SafeUnpickler`): every global goes through the same
`policy.resolve` and is recorded in the `PickleReport`; nothing is imported or called except the same pure data builders
(`builders.BUILDERS`). Whatever this evaluator does not model exactly — a global outside the allowlist, an opcode
that no DCP writer emits, a memo reference it did not keep, a shape of data it does not know — raises `Fallback`,
and the caller reads the file with the reference unpickler instead (which reports and bounds it as always).

Memory: the memo keeps every value for its first `LOW_MEMO` slots (class globals, field names); beyond that only
scalars, strings (interned) and globals, which is all a DCP writer refers back to outside the plans. A chunk costs
its column entries, not objects. From the first `SavePlan` global on (Megatron's `all_local_plans`, about half of a
large file) lists only count their elements: the plans are needed for per-rank item counts, nothing else.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from typing import Any

from ckptinspect.pickling.builders import BUILDERS, DType, StorageType
from ckptinspect.pickling.allowlist import TORCH_DTYPES, TORCH_STORAGE_DTYPES, GlobalClass
from ckptinspect.pickling.policy import DICT_MAKERS, SLOT_HOOK_NAMES, STR_MAKERS, resolve
from ckptinspect.formats.dcp.names import CHUNK, INDEX, STORAGE_INFO
from ckptinspect.formats.dcp.names import RECORD_CLASSES as REC_CLASSES
from ckptinspect.pickling.report import PickleReport

LOW_MEMO = 1 << 16  # memo slots that keep any value
MAX_STACK = 1_000_000  # stack entries + open MARKs before giving up (the reference bounds deeper input)
MAX_BYTES_ARG = 64 << 20  # one string / bytes argument


class Fallback(Exception):
    """This stream needs the reference unpickler (the message says why; tests assert canonical files never do)."""


class Global:
    """An allowed class seen in the pickle (never imported): instances become `Inst`."""

    __slots__ = ("qual", "rec", "plan", "call_ok", "new_ok")

    def __init__(self, qual: str, name: str, call_ok: bool = False, new_ok: bool = False) -> None:
        self.qual = qual
        self.rec = qual in REC_CLASSES
        self.plan = name.endswith("SavePlan")
        self.call_ok = call_ok  # REDUCE on it runs no code (`callables.callable_safely`)
        self.new_ok = new_ok  # NEWOBJ on it runs no code (`callables.creatable_safely`)


class Inst:
    """An instance of an allowed class: its pickled state; `row` once its content went into the columns."""

    __slots__ = ("cls", "state", "row")

    def __init__(self, cls: Global) -> None:
        self.cls = cls
        self.state: Any = UNSET
        self.row = -1


class Rows:
    """`n` consecutive chunk rows (from `start`) standing for `n` chunk objects: one stack entry, not `n`."""

    __slots__ = ("start", "n")

    def __init__(self, start: int, n: int) -> None:
        self.start, self.n = start, n


class StoragePairs:
    """Storage entries the fast path wrote to the columns: stands for their key/value pairs on the stack."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class CountList:
    """A list of the plans: counts elements, keeps only `SavePlan`s (with their position)."""

    __slots__ = ("n", "plans")

    def __init__(self) -> None:
        self.n = 0
        self.plans: list[tuple[int, Inst]] = []

    def add(self, v: Any) -> None:
        if v.__class__ is Inst and v.cls.plan:
            self.plans.append((self.n, v))
        self.n += 1


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNSET = _Sentinel("<unset>")
OPAQUE = _Sentinel("<opaque>")  # a plans value, or a memo slot not kept
STORAGE_MARK = _Sentinel("<storage>")  # dict key: this dict's entries are the storage columns

_FUNC_TYPES = (type(len), type(lambda: 0), type)
_KEEP = frozenset({str, DType, StorageType, int, float, bool, type(None), Global, *_FUNC_TYPES})
_FUNCTIONS: dict[tuple[str, str], Any] = dict(BUILDERS)
# The values REDUCE may call: the pure data builders, nothing else that happens to be callable.
BUILDER_VALUES: frozenset[Any] = frozenset(map(id, _FUNCTIONS.values()))
# Globals whose results the walk does not keep apart (`judge.makes_str` / `judge.makes_dict`): as a dict key or a BUILD
# state the walk counts what went into them. No DCP writer uses one; the reference reader judges them.
_UNMODELLED = STR_MAKERS | DICT_MAKERS


class Sink:
    """The columns a walk fills: interned strings, chunk rows, tensor rows, storage rows."""

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.file_ids: dict[str, int] = {}
        # chunks: per row its number of axes; offsets and sizes flat
        self.c_nd = array("b")
        self.c_off = array("q")
        self.c_size = array("q")
        # tensors (in the order their TensorStorageMetadata was built): shape, dtype, chunk rows
        self.t_nd = array("b")
        self.t_shape = array("q")
        self.t_dtype: list[str] = []
        self.t_rows = array("q")
        self.t_rows_end = array("q")
        # storage entries: fqn (interned str), offsets (-1 axes = None), file id, byte offset, length
        self.s_fqn: list[str] = []
        self.s_nd = array("b")
        self.s_off = array("q")
        self.s_file = array("i")
        self.s_pos = array("q")
        self.s_len = array("q")
        self.s_transforms: dict[int, tuple[str, ...]] = {}
        self.storage_dicts = 0

    def intern(self, s: str) -> str:
        return self.strings.setdefault(s, s)

    def file_id(self, path: str) -> int:
        fid = self.file_ids.get(path)
        if fid is None:
            fid = self.file_ids[path] = len(self.file_ids)
        return fid

    def add_chunk(self, state: Any) -> int:
        if type(state) is dict:
            offs, sizes = state.get("offsets"), state.get("sizes")
        elif type(state) is tuple and len(state) == 2:
            offs, sizes = state
        else:
            raise Fallback("ChunkStorageMetadata state")
        offs, sizes = ints(offs), ints(sizes)
        if len(offs) != len(sizes):
            raise Fallback("chunk offsets and sizes differ in length")
        row = len(self.c_nd)
        self.c_nd.append(len(offs))
        self.c_off.extend(offs)
        self.c_size.extend(sizes)
        return row

    def add_tensor(self, state: Any, items: list[Any]) -> int:
        if type(state) is not dict or "size" not in state:
            raise Fallback("TensorStorageMetadata state")
        size = ints(state["size"])
        row = len(self.t_nd)
        self.t_nd.append(len(size))
        self.t_shape.extend(size)
        self.t_dtype.append(dtype_of(state.get("properties")))
        rows = self.t_rows
        for c in items:
            if c.__class__ is Rows:
                rows.extend(range(c.start, c.start + c.n))
            elif c.__class__ is Inst and c.cls.qual == CHUNK and c.row >= 0:
                rows.append(c.row)
            else:
                raise Fallback("chunk list element")
        self.t_rows_end.append(len(rows))
        return row

    def add_storage(self, key: Any, value: Any) -> None:
        if key.__class__ is not Inst or value.__class__ is not Inst or key.cls.qual != INDEX \
                or value.cls.qual != STORAGE_INFO or key.row >= 0:
            raise Fallback("storage_data entry")
        fqn, off, _ = fields(key.state, 3, ("fqn", "offset", "index"))
        path, pos, length, tr = fields(value.state, 4, ("relative_path", "offset", "length", "transform_descriptors"))
        if type(fqn) is not str or type(path) is not str or type(pos) is not int or type(length) is not int:
            raise Fallback("storage_data field types")
        key.row = len(self.s_fqn)
        self.s_fqn.append(self.intern(fqn))
        if off is None:
            self.s_nd.append(-1)
        else:
            o = ints(off)
            self.s_nd.append(len(o))
            self.s_off.extend(o)
        self.s_file.append(self.file_id(path))
        self.s_pos.append(pos)
        self.s_len.append(length)
        if tr:
            if not isinstance(tr, (list, tuple)) or not all(type(d) is str for d in tr):
                raise Fallback("transform_descriptors")
            self.s_transforms[key.row] = tuple(tr)


def ints(v: Any) -> tuple[int, ...]:
    if type(v) is tuple or type(v) is list:
        for x in v:
            if type(x) is not int:
                raise Fallback("non-int coordinate")
        return tuple(v)
    raise Fallback(f"coordinates are {type(v).__name__}")


def fields(state: Any, n: int, names: tuple[str, ...]) -> tuple[Any, ...]:
    if type(state) is tuple and len(state) == n:
        return state
    if type(state) is dict:
        return tuple(map(state.get, names))
    raise Fallback("record state")


def dtype_of(props: Any) -> str:
    """As the reference `_dtype`: the first field of TensorProperties' tuple state (a dict state's `dtype`)."""
    if props.__class__ is not Inst or not props.cls.rec or props.state is UNSET:
        return "unknown"
    st = props.state
    if type(st) is tuple and st:
        v = st[0]
    elif type(st) is dict and st.get("dtype") is not None:
        v = st["dtype"]
    else:
        return "unknown"
    if isinstance(v, str) or v is None or type(v) in (int, float, bool):
        return str(v)
    raise Fallback("dtype value")


class Memo:
    """The pickle memo: any value below `LOW_MEMO`, kept kinds above it (sorted arrays, 16 bytes a slot)."""

    __slots__ = ("low", "hi_idx", "hi_val", "n", "version")

    def __init__(self) -> None:
        self.low: list[Any] = []
        self.hi_idx = array("q")
        self.hi_val: list[Any] = []
        self.n = 0  # the next MEMOIZE slot
        self.version = 0  # bumped when a PUT overwrites a slot

    def push(self, v: Any) -> None:
        n = self.n
        if n < LOW_MEMO:
            self.low.append(v)
        elif v.__class__ in _KEEP:
            self.hi_idx.append(n)
            self.hi_val.append(v)
        self.n = n + 1

    def put(self, idx: int, v: Any) -> None:
        if idx == self.n:
            self.push(v)
        elif idx < self.n and idx < LOW_MEMO:
            self.low[idx] = v
            self.version += 1
        else:
            raise Fallback("out-of-order memo PUT")

    def skip(self, k: int) -> None:
        """`k` slots the fast path filled with values nobody refers back to outside the plans."""
        n = self.n
        if n < LOW_MEMO:
            take = min(k, LOW_MEMO - n)
            self.low.extend([OPAQUE] * take)
        self.n = n + k

    def get(self, idx: int) -> Any:
        if idx < LOW_MEMO:
            if idx < len(self.low):
                return self.low[idx]
            raise Fallback("memo GET of an empty slot")
        if idx >= self.n:
            raise Fallback("memo GET of an empty slot")
        i = bisect_left(self.hi_idx, idx)
        if i < len(self.hi_idx) and self.hi_idx[i] == idx:
            return self.hi_val[i]
        return OPAQUE


def resolve_global(module: str, name: str, report: PickleReport, cache: dict[tuple[str, str], Any]) -> Any:
    """What a GLOBAL / STACK_GLOBAL pushes, judged exactly as `SafeUnpickler.find_class` judges it. Cached per
    (module, name) as spelled: two spellings of one qualified name may be judged apart (`policy.resolve`)."""
    key = (module, name)
    hit = cache.get(key)
    if hit is not None:
        report.note(hit[0], hit[2])
        return hit[1]
    r = resolve(module, name)  # the one rule, as `SafeUnpickler.find_class` asks it
    qual, verdict = r.qual, r.verdict
    report.note(qual, verdict)
    if verdict is not GlobalClass.ALLOWED:
        raise Fallback(f"global {qual} is {verdict.value}")
    if r.through or qual in _UNMODELLED:
        # What a call of it does with its arguments (`callables.through_kind`: `functools.partial`,
        # `copyreg._reconstructor`, `collections.defaultdict`, ...) is what the walk judges: the reference reads it.
        raise Fallback(f"global {qual} calls or keeps its arguments")
    module, name = r.target
    fn = _FUNCTIONS.get((module, name))
    if fn is not None:
        value: Any = fn
    elif module == "torch" and name in TORCH_DTYPES:
        value = DType(TORCH_DTYPES[name])
    elif module in ("torch", "torch.storage") and name in TORCH_STORAGE_DTYPES:
        value = StorageType(TORCH_STORAGE_DTYPES[name])
    else:
        # named as spelled, as the reference's stand-in classes are; judged as the unpickler would import it
        value = Global(qual, name, r.call_ok, r.new_ok)
    cache[key] = (qual, value, verdict)
    return value


def may_hook(state: Any) -> bool:
    """True when a BUILD with `state` may install a hook the unpickler calls later, as the walk judges it
    (`judge.hooked`): a class or function that may not be called, an instance (the walk keeps NEWOBJ results whole),
    or a `(state, slotstate)` pair holding one. Dicts had their keys checked as they were filled (`hook_key`)."""
    c = state.__class__
    if c is Global:
        return not state.call_ok
    if c is Inst:
        return True
    if c is tuple and len(state) == 2:
        return may_hook(state[0]) or may_hook(state[1])
    return False


def hook_key(key: Any) -> bool:
    """True for a dict key under which a stored value may be called (`policy.SLOT_HOOK_NAMES`; `judge.dict_value`)."""
    return key.__class__ is str and key in SLOT_HOOK_NAMES


D = struct.Struct("<d")
