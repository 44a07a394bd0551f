"""Streaming reader of a DCP `.metadata` pickle: the chunk table as columns, the file read once, in blocks.

`read_dcp_metadata_columns(f)` walks the pickle's opcodes itself (`pickling/stream_walk.py`, `pickling/stream_fast.py`) and returns
`StreamedMetadata`: what `dcp_metadata.DcpMetadata` holds, with the tensors as a `ChunkTable` (a few dozen bytes
per chunk instead of ~2 KB of stand-in objects). Its safety is the reference unpickler's: the same allowlist
verdict for every global (recorded in the same `PickleReport`), the same pure data builders, nothing imported or
called. When the stream holds anything the evaluator does not model exactly (a global outside the allowlist, a
shape of data no DCP writer produces, a broken or truncated pickle), the reader starts over with the reference
`read_dcp_metadata` and converts its result: findings, errors and the model are then the reference's by
construction. `StreamedMetadata.fallback` says why that happened (None when the stream was read here).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from dataclasses import dataclass
from typing import IO, Any

from ckptinspect.model.chunk_table import ChunkTable
from ckptinspect.errors import ReadError
from ckptinspect.pickling.stream_eval import _UNSET, LOW_MEMO, TSM, CountList, Fallback, Inst, Sink
from ckptinspect.pickling.stream_fast import install_fast_paths
from ckptinspect.formats._stream_table import build_table
from ckptinspect.pickling.stream_walk import Walker, walk
from ckptinspect.pickling.unpickle import MAX_PICKLE_BYTES, PickleReport, no_gc
from ckptinspect.formats.dcp_metadata import (
    _KNOWN_ATTRS,
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


@dataclass(frozen=True, slots=True)
class StreamedMetadata:
    """`DcpMetadata` with the tensors as columns (`table`); every other field as there."""

    table: ChunkTable
    objects: tuple[ObjectItem, ...]
    planner_keys: int | None
    rank_items: tuple[int, ...]
    mcore_data: Mapping[str, tuple[int, ...]]
    version: str | None
    checkpoint_id: str | None
    root_class: str
    unknown_attrs: tuple[str, ...]
    storage_without_metadata: int
    report: PickleReport
    fallback: str | None = None

    def as_dcp_metadata(self) -> DcpMetadata:
        """The `DcpMetadata` of this read: its tensors are the table's (equal to the reference reader's value)."""
        return DcpMetadata(self.table.tensors, self.objects, self.planner_keys, self.rank_items,
                           self.mcore_data, self.version, self.checkpoint_id, self.root_class, self.unknown_attrs,
                           self.storage_without_metadata, self.report, self.table)

    to_dcp_metadata = as_dcp_metadata  # the name the tests comparing with the reference reader use


def read_dcp_metadata_columns(
    data: bytes | IO[bytes], report: PickleReport | None = None, fast: bool = True, fast_from: int = LOW_MEMO
) -> StreamedMetadata:
    """Read `.metadata` (bytes, or a binary file from its current position). Raises `ReadError` as
    `read_dcp_metadata` does (CK106, CK603); `report` collects the globals also when reading fails. `fast=False`
    walks every opcode; `fast_from` (tests) starts the batch paths at that memo slot instead of `LOW_MEMO`."""
    report = report if report is not None else PickleReport()
    f: IO[bytes]
    if isinstance(data, bytes):
        import io

        f = io.BytesIO(data)
    else:
        f = data
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
                w.release()  # breaks the walker <-> fast-path cycle, which `no_gc`'s freeze would keep forever
        report.globals.update(probe.globals)
        return out
    except Fallback as e:
        why = str(e) or "fallback"
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, UnicodeDecodeError, AttributeError,
            RecursionError, MemoryError, ReadError) as e:
        why = f"{type(e).__name__}: {e}"
    f.seek(0, os.SEEK_END)
    remaining = f.tell() - start
    f.seek(start)
    if remaining > MAX_PICKLE_BYTES:
        # The reference keeps the whole object graph: beyond its bound it is not asked to. What the walk judged
        # (a dangerous global among them) is reported all the same.
        report.globals.update(probe.globals)
        raise ReadError(f".metadata of {remaining} bytes needs the reference unpickler ({why}), which is bounded "
                        f"to {MAX_PICKLE_BYTES} bytes", "CK603")
    md = read_dcp_metadata(f, report)
    return from_reference(md, why)


# What the last sniff read, for the reader that follows it (one entry: the sniff of one checkpoint dir).
_SHARED: dict[tuple[object, int, int, int], StreamedMetadata] = {}


def read_metadata_file(path: Path, report: PickleReport | None = None, keep: bool = False) -> StreamedMetadata:
    """Read the `.metadata` at `path` once per process: with `keep` (the sniff) the result is kept for the next
    caller of the same unchanged file (the reader), which takes it. Raises `OSError` / `ReadError`."""
    report = report if report is not None else PickleReport()
    with open_regular(path, whole=True) as f:
        try:
            st = os.fstat(f.fileno())
            key: tuple[object, int, int, int] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            size = st.st_size
        except io.UnsupportedOperation:  # an object in object storage: its URL and listed size
            size = file_size(f)
            key = (str(path), size, 0, 0)
        hit = _SHARED.pop(key, None)
        if hit is not None:
            # the whole verdict, not only the globals: a call outside the inert constructors is what makes it unsafe
            report.globals.update(hit.report.globals)
            for q, at in hit.report.called.items():
                report.called.setdefault(q, at)
            if keep:
                _SHARED[key] = hit
            return hit
        if size > MAX_STREAM_BYTES:
            raise ReadError(f".metadata of {size} bytes exceeds the {MAX_STREAM_BYTES} byte bound", "CK603")
        out = read_dcp_metadata_columns(f, report)
    if keep:
        _SHARED.clear()
        _SHARED[key] = out
    return out


def from_reference(md: DcpMetadata, why: str | None = None) -> StreamedMetadata:
    """A `StreamedMetadata` of what the reference reader built."""
    return StreamedMetadata(md.table, md.objects, md.planner_keys,
                            md.rank_items, md.mcore_data, md.version, md.checkpoint_id, md.root_class,
                            md.unknown_attrs, md.storage_without_metadata, md.report, why)


def _state(o: Any) -> dict[Any, Any] | None:
    if o.__class__ is not Inst:
        return None
    st = o.state
    if st is _UNSET:
        return {}
    return st if type(st) is dict else None


def _finish(root: Any, w: Walker) -> StreamedMetadata:
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
        # The reference reader refuses them (`dcp_metadata._count`): a negative length, say, is a malformed
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
    unknown = tuple(sorted(k for k in state if k not in _KNOWN_ATTRS and not str(k).startswith("_")))
    if any(type(k) is not str for k in unknown):
        raise Fallback("root attribute names")
    return StreamedMetadata(
        table, tuple(objects), planner_keys, _rank_items(state.get("all_local_plans")), mcore_data,
        str(version) if version is not None else None, cid, root.cls.qual, unknown, orphans, w.report,
    )


def _coordinates_in_range(sink: Any) -> bool:
    """Every chunk offset and size, tensor dimension, storage offset and byte offset/length in [0, MAX_COORD]
    (storage keys of an object use -1 axes, not coordinates: their offsets row is empty); and, as the reference's
    `dcp_metadata._coords` requires of a tensor's size and of each chunk's offsets and sizes, at most `MAX_DIMS`
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
    from ckptinspect.pickling.stream_eval import STORAGE_MARK

    return STORAGE_MARK


