"""The only place in ckptinspect that deserialises anything read from a checkpoint.

`SafeUnpickler` is an allowlisting unpickler that never calls a global from the pickle: `find_class` hands back
inert stand-ins (`standins.py`). Allowed classes become `Obj` instances holding their pickled state; the few allowed functions
(`torch._utils._rebuild_tensor_v2`, `torch.Size`, `OrderedDict`, ...) are re-implemented here as pure data builders
(a tensor becomes a `TensorRef` description: dtype, shape, stride, storage key — its bytes are never read). Unknown
globals become `Opaque` placeholders (CK602) and dangerous ones (`os.system`, `eval`, ...) `Opaque` placeholders
flagged dangerous (CK601): calling a placeholder only records its arguments.

torch is never imported. Torch zip archives are opened by `torch_archive.py`, which hands their `data.pkl` to
`load_pickle` here; `plain.py` turns the stand-ins into plain data.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.pickling.builders import BUILDERS, DType, StorageRef, StorageType
from ckptinspect.pickling.walk import PickleWalk, walk_pickle, walk_stream
from ckptinspect.pickling.allowlist import (
    DICT_SUBCLASSES,
    TORCH_DTYPES,
    TORCH_STORAGE_DTYPES,
    GlobalClass,
)
from ckptinspect.pickling.policy import resolve
from ckptinspect.pickling.report import PickleReport as PickleReport
from ckptinspect.pickling.standins import (
    HEAPTYPE,
    CRec as CRec,
    DictObj,
    FrozenCall,
    Obj as Obj,
    Opaque as Opaque,
    Rec as Rec,
    StatefulObj as StatefulObj,
    frozen_class,
)

# Resource bounds. A pickle that exceeds them is reported (CK603), never followed to an out-of-memory kill.
MAX_PICKLE_BYTES = 4 << 30  # a 1M-chunk `.metadata` is ~300 MB
MAX_ARCHIVE_PICKLE_BYTES = 1 << 30  # `data.pkl` inside a torch archive
PREWALK_MAX_BYTES = 16 << 20  # pickles up to this size are read whole; larger ones are walked and read as streams
MAX_NESTING = 200  # depth `to_plain` follows (two Python frames per level: stay far below the recursion limit)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    if isinstance(cls, type) and issubclass(cls, Obj):
        return cls()
    raise ReadError("copyreg._reconstructor on a non-allowlisted class", "CK206")


_FUNCTIONS: Mapping[tuple[str, str], Callable[..., Any]] = {
    **BUILDERS,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("copy_reg", "_reconstructor"): _reconstructor,
}

@dataclass(frozen=True, slots=True)
class Records:
    """A reader's hint to the unpickler for the allowed classes a file holds millions of (its format's records):

    classes: built as `Rec`s (a list holding the pickled state: C-speed, no `__dict__`) instead of `StatefulObj`s;
    compact: of those, the ones built as `CRec`s that keep only these fields' values (in this order);
    discard_from / discard: once a class whose name ends with `discard_from` is referenced, the classes of
      `discard` take their state through the given C function (`dict.clear`: dropped as BUILD hands it over).
    The verdict on a global never depends on it (`find_class` judges first).
    """

    classes: frozenset[str] = frozenset()
    compact: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    discard_from: str | None = None
    discard: Mapping[str, Any] = field(default_factory=dict)


NO_RECORDS = Records()


class SafeUnpickler(pickle.Unpickler):
    """Allowlisting unpickler: nothing from the pickle is ever imported or called.

    1. `find_class` judges the global (`policy.resolve`), records it in `report`, and returns a data
       builder (allowed function), an `Obj` subclass (allowed class), or an `Opaque` placeholder.
    2. `persistent_load` turns torch's `('storage', ...)` ids into `StorageRef`s (the bytes are not read).
    """

    def __init__(self, file: IO[bytes], report: PickleReport | None = None, records: Records = NO_RECORDS) -> None:
        super().__init__(file)
        self.report = report if report is not None else PickleReport()
        self.records = records
        self._in_plans = False
        self._shared: dict[type[Rec], Rec] = {}
        self._classes: dict[str, type[Any]] = {}
        self._recs: dict[str, type[Rec]] = {}
        self._builders: dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Judged by the one rule (`policy.resolve`: Python 2 names and dotted names as the unpickler would import
        # them), reported as the pickle spells it; the stand-in is chosen for what it resolves to.
        r = resolve(module, name)
        qual, verdict = r.qual, r.verdict
        self.report.note(qual, verdict)
        if verdict is GlobalClass.ALLOWED:
            module, name = r.target
            if self.records.discard_from and not self._in_plans and name.endswith(self.records.discard_from):
                self._enter_plans()
            fn = _FUNCTIONS.get((module, name))
            if fn is not None:
                return self._builder(module, name, fn)
            if module == "torch" and name in TORCH_DTYPES:
                return DType(TORCH_DTYPES[name])
            if module in ("torch", "torch.storage") and name in TORCH_STORAGE_DTYPES:
                return StorageType(TORCH_STORAGE_DTYPES[name])
            if qual in self.records.classes:
                return self._rec(qual)
            if (module, name) in DICT_SUBCLASSES:
                return self._stub(qual, DictObj)
            return self._stub(qual, StatefulObj)
        cls = self._stub(qual, Opaque)
        type.__setattr__(cls, "verdict", verdict)
        return cls

    def _builder(self, module: str, name: str, fn: Callable[..., Any]) -> Any:
        """The stand-in of an allowed function, made for this load only: a C type that cannot be changed (`tuple`,
        `int`, ...) as is, a Python class as a frozen subclass, a Python function behind a frozen wrapper. BUILD on
        what `find_class` returned must not change the reader for later loads (nor this one)."""
        if isinstance(fn, type) and not (fn.__flags__ & HEAPTYPE):
            return fn
        key = f"{module}.{name}"
        made = self._builders.get(key)
        if made is None:
            made = frozen_class(name, (fn,), {}) if isinstance(fn, type) else FrozenCall(fn)
            self._builders[key] = made
        return made

    def _rec(self, qual: str) -> type[Rec]:
        cls = self._recs.get(qual)
        if cls is None:
            fields = self.records.compact.get(qual)
            if fields is not None:
                cls = frozen_class(qual.rsplit(".", 1)[-1], (CRec,), {"qualname": qual, "fields": fields})
            else:
                cls = frozen_class(qual.rsplit(".", 1)[-1], (Rec,), {"qualname": qual})
            self._recs[qual] = cls
            if self._in_plans and qual in self.records.discard:
                self._discard(cls, qual)
        return cls

    def _discard(self, cls: type[Rec], qual: str) -> None:
        # NEWOBJ returns one shared record per class (`dict.get(cls)`: C, no object per item) and BUILD empties the
        # state (C). The plan lists still hold one reference per item, so per-rank counts stay exact.
        setstate = self.records.discard[qual]
        type.__setattr__(cls, "__setstate__", setstate)
        shared = frozen_class(cls.__name__, (Rec,), {"qualname": qual, "__setstate__": setstate})
        self._shared[cls] = shared()
        type.__setattr__(cls, "__new__", staticmethod(self._shared.get))

    def _enter_plans(self) -> None:
        """From the first `discard_from` class on (DCP: the first SavePlan of Megatron's `all_local_plans`, ~half of
        a large `.metadata`), the `discard` records' states are dropped as soon as BUILD hands them over: the
        reader only counts them. The memo keeps every state dict alive until the load ends; emptying them (in C:
        `dict.clear`) roughly halves the plans' memory."""
        self._in_plans = True
        for qual, cls in self._recs.items():
            if qual in self.records.discard:
                self._discard(cls, qual)

    def _stub(self, qual: str, base: type[Any]) -> type[Any]:
        cls = self._classes.get(qual)
        if cls is None:
            cls = frozen_class(qual.rsplit(".", 1)[-1], (base,), {"qualname": qual})
            self._classes[qual] = cls
        return cls

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            _, stype, key, location, count = pid[:5]
            dtype = str(stype) if isinstance(stype, str) else "unknown"
            return StorageRef(dtype, str(key), str(location), int(count))
        raise pickle.UnpicklingError(f"unsupported persistent id {type(pid).__name__}")


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while millions of acyclic objects are built, then freeze what was built.

    A million-chunk `.metadata` makes ~10M objects; with the GC on, every young-generation pass walks them again and
    unpickling takes 4× longer (measured on the synthetic 200k-chunk checkpoint: 6.5 s → 1.6 s). The objects built
    here hold no cycles the GC would need to free.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was built survives (the model): move it out of the collector's sight, or each later full
        # collection walks millions of objects again (~1 s apiece at 1M chunks). Refcounting still frees it.
        gc.freeze()
        if enabled:
            gc.enable()


def release_frozen() -> None:
    """Hand what earlier loads froze (`no_gc`) back to the collector, and collect.

    Every load makes its own stand-in classes, and a class is a cycle (its `__mro__` names it): refcounting never
    frees one, and once frozen the collector never sees it, so a process reading checkpoint after checkpoint keeps
    ~8-30 KB per read for good (measured: 7.6 KiB per `read_checkpoint` of the torch_dist sample, 0.16 with this).
    Loops over many checkpoints (a save-dir audit, `ls`, `watch`) call it between two, when the last one's model is
    gone: the collection then walks only what is still alive, and what survives is frozen again (later full
    collections stay cheap)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def load_pickle(
    source: bytes | memoryview | IO[bytes], report: PickleReport | None = None, records: Records = NO_RECORDS,
    prewalked: bool = False,
) -> Any:
    """Unpickle `source` (bytes, or a binary file streamed from its current position) with `SafeUnpickler`.

    Every pickle is opcode-walked first (`walk.py`: the verdict, the memo / nesting / length bounds), whatever
    its size; `prewalked` skips that for a second read of bytes already walked into the same `report`.
    Raises `ReadError` (CK206) / `LimitExceeded` (CK603) on bad input. A file is streamed rather than read whole:
    a 1M-chunk `.metadata` is ~500 MB that need not sit in memory next to what it describes.
    """
    report = report if report is not None else PickleReport()
    if not isinstance(source, (bytes, memoryview)):
        # Small files are read whole; large ones (a big `.metadata`) are walked as a stream, then unpickled from it.
        head = source.read(PREWALK_MAX_BYTES + 1)
        if len(head) <= PREWALK_MAX_BYTES:
            source = head
        else:
            start = source.tell() - len(head)
            size = source.seek(0, os.SEEK_END) - start
            source.seek(start)
            if size > MAX_PICKLE_BYTES:
                raise LimitExceeded(f"pickle of {size} bytes exceeds the {MAX_PICKLE_BYTES} byte bound", "CK603")
            if not prewalked:
                # The memo bound must hold for every size: the walk streams (bounded memory), then the unpickler
                # reads the same bytes again.
                vet_walk(walk_stream(source, size), report)
                source.seek(start)
    if isinstance(source, (bytes, memoryview)):
        if len(source) > MAX_PICKLE_BYTES:
            raise LimitExceeded(f"pickle of {len(source)} bytes exceeds the {MAX_PICKLE_BYTES} byte bound", "CK603")
        # CPython's unpickler sizes its memo array from the largest index a PUT names, trusts length claims and
        # hashes nested tuples recursively in C: a 12-byte pickle can make it allocate gigabytes or overflow the C
        # stack. The opcode walk (no objects built) sees it, and gives the verdict `scan` gives the same bytes.
        if not prewalked:
            vet_walk(walk_pickle(source), report)
        stream: IO[bytes] = io.BufferedReader(io.BytesIO(source))
    else:
        stream = source
    return unpickle_stream(stream, report, records)


def unpickle_stream(stream: IO[bytes], report: PickleReport, records: Records = NO_RECORDS,
                    unpickler: type[SafeUnpickler] | None = None) -> Any:
    """Unpickle ONE pickle from `stream`, leaving it just past that pickle's STOP (a buffered stream: the C unpickler
    reads ahead with `peek` and consumes only what it used). The bytes must have been opcode-walked into `report`
    already (`walk_stream` of the whole stream): this is the second read. Same errors as `load_pickle`."""
    reader = (unpickler or SafeUnpickler)(stream, report, records)
    try:
        return reader.load()
    except (MemoryError, RecursionError) as e:
        raise LimitExceeded(f"pickle exceeds resource bounds ({type(e).__name__})", "CK603") from e
    except ReadError:
        raise
    except Exception as e:  # noqa: BLE001 - any decoding failure of untrusted bytes is a finding, not a crash
        raise ReadError(f"not a readable pickle: {type(e).__name__}: {short_error(e)}", "CK206") from e


def vet_walk(walk: PickleWalk, report: PickleReport) -> None:
    """Merge a walk's verdict into `report`, and refuse the bytes when the walk hit a bound: CK605 when the rest was
    not judged (fail closed), CK603 when they exceed what the unpickler could build."""
    report.merge_walk(walk)
    if walk.limit is not None:
        if walk.unjudged:  # the rest of the pickle was not judged: fail closed
            raise LimitExceeded(f"pickle not judged to its end, a scanner bound was hit: {walk.limit}", "CK605")
        raise LimitExceeded(f"pickle exceeds resource bounds: {walk.limit}", "CK603")


def short_error(e: BaseException) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:200] + "..."

