"""Reading a DCP `.metadata`: `read_metadata`, the one entry point: the streaming reader, falling back to the reference.

`read_metadata` walks the pickle's opcodes itself (`vm_walk.py`, `vm_fast.py`), the file read once, in blocks, and
returns a `DcpMetadata` whose chunks are a `ChunkTable` (a few dozen bytes per chunk instead of ~2 KB of stand-in
objects; its `tensors` are views of the table). Its safety is the reference unpickler's: the same allowlist verdict
for every global (recorded in the same `PickleReport`), the same pure data builders, nothing imported or called.
When the stream holds anything the evaluator does not model exactly (a global outside the allowlist, a shape of data
no DCP writer produces, a broken or truncated pickle), the reader starts over with the reference
`metadata.read_dcp_metadata`: findings, errors and the model are then the reference's by construction.
`DcpMetadata.fallback` says why that happened (None when the stream was read here).

A path is read at most once per checkpoint read: the sniff that parsed it hands its result to the reader that
follows through a `SeenMetadata` (made by `formats.read_checkpoint`, passed explicitly; nothing process-wide).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import IO, Any

from ckptinspect.errors import ReadError
from ckptinspect.formats.dcp.names import TSM
from ckptinspect.formats.dcp.vm_eval import UNSET, LOW_MEMO, CountList, Fallback, Inst, Sink
from ckptinspect.formats.dcp.vm_fast import install_fast_paths
from ckptinspect.formats.dcp.vm_stats import ReadStats
from ckptinspect.formats.dcp.table import build_table
from ckptinspect.formats.dcp.vm_walk import Walker, walk
from ckptinspect.pickling.unpickle import MAX_PICKLE_BYTES, PickleReport, no_gc
from ckptinspect.formats.dcp.metadata import (
    KNOWN_ATTRS,
    MAX_COORD,
    MAX_DIMS,
    DcpMetadata,
    parse_shard_key,
    read_dcp_metadata,
)
from ckptinspect.model import ObjectItem
from ckptinspect.io.local import file_size, open_regular

# The streaming reader holds no copy of the file: its bound is on what it walks, not what it keeps.
MAX_STREAM_BYTES = 64 << 30

_FileKey = tuple[object, int, int, int]


@dataclass(slots=True)
class SeenMetadata:
    """The `.metadata` files one checkpoint read parsed already, for the steps after the one that parsed them (the
    sniff, then the reader): keyed by the file's identity (device, inode, size, mtime; an object's URL and size), so
    a file that changed in between is read again. `keep` entries stay for the next caller; others are taken."""

    kept: dict[_FileKey, DcpMetadata] = field(default_factory=dict)


def read_metadata(
    source: PurePath | bytes | IO[bytes], report: PickleReport | None = None, *, seen: SeenMetadata | None = None,
    keep: bool = False, fast: bool = True, fast_from: int = LOW_MEMO, stats: ReadStats | None = None,
) -> DcpMetadata:
    """Read a `.metadata`: a path (opened safely, bounded to `MAX_STREAM_BYTES`), bytes, or a binary file from its
    current position. Raises `ReadError` as `read_dcp_metadata` does (CK106, CK603), `OSError` for a path that
    cannot be read; `report` collects the globals also when reading fails.

    `seen` (paths only): what earlier steps of the same checkpoint read parsed; a hit is returned (its whole verdict
    merged into `report`), and with `keep` (the sniff) the result stays there for the reader that follows.
    `fast=False` walks every opcode; `fast_from` (tests) starts the batch paths at that memo slot instead of
    `LOW_MEMO`. `stats`, when given, is filled with the records each path read (`ReadStats`; untouched when `seen`
    answers)."""
    report = report if report is not None else PickleReport()
    if isinstance(source, PurePath):
        return _read_path(source, report, seen, keep, stats)
    return _read(io.BytesIO(source) if isinstance(source, bytes) else source, report, fast, fast_from, stats)


def _read_path(path: PurePath, report: PickleReport, seen: SeenMetadata | None, keep: bool,
               stats: ReadStats | None) -> DcpMetadata:
    with open_regular(path, whole=True) as f:
        try:
            st = os.fstat(f.fileno())
            key: _FileKey = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            size = st.st_size
        except io.UnsupportedOperation:  # an object in object storage: its URL and listed size
            size = file_size(f)
            key = (str(path), size, 0, 0)
        hit = None if seen is None else seen.kept.pop(key, None)
        if hit is not None and seen is not None:
            # the whole verdict, not only the globals: a call outside the inert constructors is what makes it unsafe
            report.merge(hit.report)  # the worse verdict of a global spelled two ways stays
            if keep:
                seen.kept[key] = hit
            return hit
        if size > MAX_STREAM_BYTES:
            raise ReadError(f".metadata of {size} bytes exceeds the {MAX_STREAM_BYTES} byte bound", "CK603")
        out = _read(f, report, True, LOW_MEMO, stats)
    if keep and seen is not None:
        seen.kept.clear()
        seen.kept[key] = out
    return out


def _read(f: IO[bytes], report: PickleReport, fast: bool, fast_from: int, stats: ReadStats | None) -> DcpMetadata:
    start = f.tell()
    probe = PickleReport()
    try:
        with no_gc():
            w = Walker(f, Sink(), probe, MAX_STREAM_BYTES)
            try:
                if fast:
                    install_fast_paths(w, fast_from)
                root = walk(w)
                out = _finish(root, w)
            finally:
                if stats is not None:
                    stats.batch, stats.loop, stats.runs, stats.memo_slots, stats.fallback = (
                        dict(w.batch), dict(w.loop), dict(w.runs), w.memo.n, None)
                w.release()  # breaks the walker <-> fast-path cycle, which `no_gc`'s freeze would keep forever
        report.merge(probe)
        return out
    except Fallback as e:
        why = str(e) or "fallback"
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, UnicodeDecodeError, AttributeError,
            RecursionError, MemoryError, ReadError) as e:
        why = f"{type(e).__name__}: {e}"
    if stats is not None:
        stats.fallback = why
    f.seek(0, os.SEEK_END)
    remaining = f.tell() - start
    f.seek(start)
    if remaining > MAX_PICKLE_BYTES:
        # The reference keeps the whole object graph: beyond its bound it is not asked to. What the walk judged
        # (a dangerous global among them) is reported all the same.
        report.merge(probe)
        raise ReadError(f".metadata of {remaining} bytes needs the reference unpickler ({why}), which is bounded "
                        f"to {MAX_PICKLE_BYTES} bytes", "CK603")
    md = read_dcp_metadata(f, report)
    # as the streamed result: tensors are views of the table (the reference's chunk objects are dropped here)
    return replace(md, tensors=md.table.tensors, fallback=why)


def _state(o: Any) -> dict[Any, Any] | None:
    if o.__class__ is not Inst:
        return None
    st = o.state
    if st is UNSET:
        return {}
    return st if type(st) is dict else None


def _finish(root: Any, w: Walker) -> DcpMetadata:
    state = _state(root)
    report = w.report
    if any(g.endswith("SavePlan") for g in report.globals) and (not state or list(state)[-1] != "all_local_plans"):
        raise Fallback("plans are not the last field")
    if state is None or type(state.get("state_dict_metadata")) is not dict:
        raise Fallback("not a DCP Metadata object")
    sink = w.sink
    raw_storage = state.get("storage_data") or {}
    if type(raw_storage) is not dict or any(k is not _storage_mark() for k in raw_storage):
        raise Fallback("storage_data")
    if sink.s_fqn and not raw_storage:
        raise Fallback("storage entries outside storage_data")

    mcore_raw = state.get("mcore_data") or {}
    mcore_data: dict[str, tuple[int, ...]] = {}
    if isinstance(mcore_raw, dict):
        for k, v in mcore_raw.items():
            if isinstance(v, dict) and "nd_reformulated_orig_global_shape" in v:
                shape = v["nd_reformulated_orig_global_shape"]
                if type(shape) not in (tuple, list) or any(type(x) is not int for x in shape) or type(k) is not str:
                    raise Fallback("mcore_data")
                mcore_data[k] = tuple(shape)

    if not _coordinates_in_range(sink):
        # The reference reader refuses them (`metadata._count`): a negative length, say, is a malformed
        # `.metadata`, and its verdict must be the reference's, not a table that downstream int64 math trusts.
        raise Fallback("coordinates outside [0, 2**62]")

    tensor_rows: list[tuple[str, int]] = []
    object_keys: list[str] = []
    for key, md in state["state_dict_metadata"].items():
        if type(key) is not str or md.__class__ is not Inst:
            raise Fallback("state_dict_metadata entry")
        if md.cls.qual.endswith("BytesStorageMetadata"):
            object_keys.append(key)
        elif md.cls.qual == TSM and md.row >= 0:
            tensor_rows.append((key, md.row))
        else:
            raise Fallback("state_dict_metadata value")
    table, object_storage, orphans = build_table(sink, tensor_rows, object_keys, mcore_data)
    objects = []
    for key, item in zip(object_keys, object_storage):
        parsed = parse_shard_key(key)
        if parsed is None:
            objects.append(ObjectItem(key, key, None, None, item))
        else:
            objects.append(ObjectItem(key, parsed[0], parsed[1], parsed[2], item))

    planner = state.get("planner_data")
    if planner.__class__ is CountList:
        raise Fallback("planner_data in the plans")
    planner_keys = len(planner) if isinstance(planner, (dict, list, tuple)) else None
    meta = _state(state.get("storage_meta"))
    cid = _text(meta.get("checkpoint_id")) if meta and meta.get("checkpoint_id") else None
    version = state.get("version")
    if version is not None and type(version) not in (str, int, float):
        raise Fallback("version")
    unknown = tuple(sorted(k for k in state if k not in KNOWN_ATTRS and not str(k).startswith("_")))
    if any(type(k) is not str for k in unknown):
        raise Fallback("root attribute names")
    return DcpMetadata(
        table.tensors, tuple(objects), planner_keys, _rank_items(state.get("all_local_plans")), mcore_data,
        str(version) if version is not None else None, cid, root.cls.qual, unknown, orphans, w.report, table,
    )


def _coordinates_in_range(sink: Any) -> bool:
    """Every chunk offset and size, tensor dimension, storage offset and byte offset/length in [0, MAX_COORD]
    (storage keys of an object use -1 axes, not coordinates: their offsets row is empty); and, as the reference's
    `metadata._coords` requires of a tensor's size and of each chunk's offsets and sizes, at most `MAX_DIMS`
    axes and a product of at most MAX_COORD."""
    import numpy as np

    for column in (sink.c_off, sink.c_size, sink.t_shape, sink.s_off, sink.s_pos, sink.s_len):
        if len(column):
            values = np.frombuffer(column, dtype=np.int64)
            if int(values.min()) < 0 or int(values.max()) > MAX_COORD:
                return False
    for nd_col, cols in ((sink.c_nd, (sink.c_off, sink.c_size)), (sink.t_nd, (sink.t_shape,))):
        if not len(nd_col):
            continue
        nd = np.frombuffer(nd_col, dtype=np.int8).astype(np.int64)
        if int(nd.max()) > MAX_DIMS:
            return False
        start = np.zeros(len(nd), dtype=np.int64)
        np.cumsum(nd[:-1], out=start[1:])
        for column in cols:
            values = np.frombuffer(column, dtype=np.int64) if len(column) else np.zeros(0, dtype=np.int64)
            for d in np.unique(nd[nd > 1]).tolist():  # one axis: its value is in range already
                first = start[nd == d]
                approx = values[first[:, None] + np.arange(d)].astype(np.float64).prod(axis=1)
                for r in first[approx > MAX_COORD / 4].tolist():  # near the bound: exactly, as the reference
                    n = 1
                    for v in column[r:r + d]:
                        n *= v
                    if n > MAX_COORD:
                        return False
    return True


def _rank_items(plans: Any) -> tuple[int, ...]:
    def count(p: Any) -> int:
        ps = _state(p)
        items = ps.get("items") if ps else None
        if items.__class__ is CountList:
            return int(items.n)
        return len(items) if isinstance(items, list) else 0

    if isinstance(plans, list):
        return tuple(count(p) for p in plans)
    if plans.__class__ is CountList:
        out = [0] * plans.n
        for i, p in plans.plans:
            out[i] = count(p)
        return tuple(out)
    return ()


def _text(v: Any) -> str:
    """`str(v)` as the reference computes it on its stand-ins: an `Obj` (a `pathlib.PosixPath` checkpoint_id)
    prints as ``<qualname {attributes}>``."""
    if type(v) is str:
        return v
    if v.__class__ is Inst and not v.cls.rec and _plain(v.state):
        return f"<{v.cls.qual} {v.state!r}>"
    raise Fallback("checkpoint_id")


def _plain(v: Any) -> bool:
    if type(v) in (str, int, float, bool) or v is None:
        return True
    if type(v) in (tuple, list):
        return all(_plain(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain(x) for k, x in v.items())
    return False


def _storage_mark() -> Any:
    from ckptinspect.formats.dcp.vm_eval import STORAGE_MARK

    return STORAGE_MARK


