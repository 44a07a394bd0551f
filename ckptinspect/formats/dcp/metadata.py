"""Read a DCP `.metadata` pickle into plain data (`DcpMetadata`), without torch.

Handles what torch's `FileSystemWriter.finish` writes (torch `Metadata`, reference §5.1) and what Megatron-Core adds:
`all_local_plans` (0.11+, every rank's SavePlan), `mcore_data` (0.8–0.15 N-D reformulated DistOpt tensors), the
0.15 `MCoreMetadata` root class and 0.11–0.15 `MCoreSavePlan` plans (both are plain stand-ins here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.formats.dcp.names import RECORDS, RECORDS_DISCARDING_PLANS
from ckptinspect.pickling.unpickle import CRec, Obj, PickleReport, Rec, load_pickle, no_gc
from ckptinspect.model import Chunk, ObjectItem, StoredItem, Tensor
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry

_SHARD_KEY = re.compile(r"^(?P<family>.*)/shard_(?P<offset>-?\d+(?:\.-?\d+)*)_(?P<shape>-?\d+(?:\.-?\d+)*)$")

# Attributes of torch's Metadata (torch 2.13) and the ones Megatron adds; anything else is noted as unknown.
KNOWN_ATTRS = frozenset(
    {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version", "all_local_plans", "mcore_data"}
)


@dataclass(frozen=True, slots=True)
class DcpMetadata:
    """The parts of a `.metadata` pickle ckptinspect uses, as plain data: what both readers return (the streaming
    `stream.read_metadata` and the reference `read_dcp_metadata`).

    tensors / objects: every TensorStorageMetadata / BytesStorageMetadata entry, with storage looked up (from
      `read_metadata`, the tensors are views of `table`: no object per chunk).
    planner_keys: number of entries of `planner_data` (None when it is None; Megatron writes None).
    rank_items: number of items each save-time rank wrote (`all_local_plans`), () when absent.
    mcore_data: Megatron-Core 0.8–0.15 original shapes of N-D reformulated tensors.
    root_class: qualified name of the root object (torch Metadata or Megatron's MCoreMetadata).
    unknown_attrs: root attributes this reader does not know (tolerated, noted).
    storage_without_metadata: storage entries whose fqn has no metadata entry.
    report: globals the pickle referenced.
    table: the chunks of `tensors` as columns (not compared: `tensors` says the same).
    fallback: why the streaming reader handed the file to the reference one (None when it read it itself, and
      from the reference reader).
    """

    tensors: tuple[Tensor, ...]
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
    table: ChunkTable = field(compare=False)  # the one chunk store; `tensors` are its `tensors`
    fallback: str | None = field(default=None, compare=False)



def parse_shard_key(key: str) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """Split a ShardedObject unique key ``family/shard_<offsets>_<shape>`` (Megatron `mapping.py`).

    Old keys whose offset has one more axis than the shape get a ``-1`` appended to the shape, as Megatron's
    `empty_from_unique_key` does.
    """
    m = _SHARD_KEY.match(key)
    if m is None or len(key) > 4096 or any(len(x) > 18 for x in re.split(r"[._]", key[m.start("offset"):])):
        return None  # not a Megatron key: coordinates beyond int64 (or 4300 digits) are no grid cell
    offset = tuple(int(x) for x in m.group("offset").split("."))
    shape = tuple(int(x) for x in m.group("shape").split("."))
    if len(shape) + 1 == len(offset):
        shape = shape + (-1,)
    return m.group("family"), offset, shape


def read_dcp_metadata(data: bytes | IO[bytes], report: PickleReport | None = None) -> DcpMetadata:
    """Parse `.metadata` bytes (or a binary file). Raises `ReadError` with code CK106 (or CK603 for bounds).

    `report` collects the globals the pickle referenced, also when parsing fails (a hostile `.metadata` is both
    unreadable and unsafe).
    """
    report = report if report is not None else PickleReport()
    start = data.tell() if not isinstance(data, bytes) else 0
    with no_gc():
        try:
            try:
                root = load_pickle(data, report, RECORDS_DISCARDING_PLANS)
            except LimitExceeded:
                raise  # the walk's bound holds for the plain read too
            except ReadError:
                # A pickle the plan-discarding fast path cannot take (a non-dict item state): read it plainly.
                if isinstance(data, bytes):
                    root = load_pickle(data, report, RECORDS, prewalked=True)
                else:
                    data.seek(start)
                    root = load_pickle(data, report, RECORDS, prewalked=True)
        except ReadError as e:
            raise ReadError(str(e), e.code if e.code in ("CK603", "CK605") else "CK106") from e
        state = _state(root)
        if _plans_not_last(state, report):
            # The fast path assumes the plans are the root's last field (Megatron sets `all_local_plans` after
            # torch built the Metadata); anything read after them would have been discarded. Read plainly.
            if isinstance(data, bytes):
                root = load_pickle(data, report, RECORDS, prewalked=True)
            else:
                data.seek(start)
                root = load_pickle(data, report, RECORDS, prewalked=True)
            state = _state(root)
        if state is None or not isinstance(state.get("state_dict_metadata"), dict):
            what = getattr(root, "qualname", type(root).__name__)
            raise ReadError(f"not a DCP Metadata object (root is {what})", "CK106")
        try:
            return _convert(root, state, report)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError, ArithmeticError) as e:
            raise ReadError(f"malformed DCP Metadata: {type(e).__name__}: {str(e)[:300]}", "CK106") from e


def _plans_not_last(state: dict[str, Any] | None, report: PickleReport) -> bool:
    saw_plans = any(g.endswith("SavePlan") for g in report.globals)
    if not saw_plans:
        return False
    return state is None or not state or list(state)[-1] != "all_local_plans"


def _state(o: Any) -> dict[str, Any] | None:
    """The field dict of a DCP stand-in: a `Rec`'s pickled state, or an `Obj`'s attributes (Megatron-Core 0.15
    `MCoreMetadata` / 0.11–0.15 `MCoreSavePlan` are allowed `Obj`s)."""
    if isinstance(o, Rec):
        st = o[0] if o else {}
        return st if isinstance(st, dict) else None
    if isinstance(o, Obj):
        return o.__dict__
    return None


def _convert(root: Any, state: dict[str, Any], report: PickleReport) -> DcpMetadata:
    """Translate the stand-ins into the neutral model.

    Stand-ins are dropped as soon as they are translated (`storage_data`, each tensor's chunk list, the plans), so
    the memory they free is reused by the model objects instead of both peaking together.
    """
    plans = state.get("all_local_plans")
    rank_items: tuple[int, ...] = ()
    if isinstance(plans, list):
        ranks = []
        for p in plans:
            ps = _state(p)
            items = ps.get("items") if ps else None
            ranks.append(len(items) if isinstance(items, list) else 0)
        rank_items = tuple(ranks)
        plans.clear()

    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem] = {}
    raw_storage = state.get("storage_data") or {}
    if not isinstance(raw_storage, dict):
        raise TypeError("storage_data is not a dict")
    for index, info in raw_storage.items():
        if not isinstance(index, CRec) or not isinstance(info, CRec):
            raise TypeError("storage_data entry is not MetadataIndex -> _StorageInfo")
        ist, fst = index[0] if index else None, info[0] if info else None
        # the compact tuple BUILD left (see CRec); `.values()` for anything else
        fqn, off, _ = ist if type(ist) is tuple and len(ist) == 3 else index.values()
        path, offset, length, descriptors = fst if type(fst) is tuple and len(fst) == 4 else info.values()
        if not isinstance(fqn, str):
            raise TypeError("MetadataIndex without an fqn")
        storage[(fqn, tuple(off) if off is not None else None)] = StoredItem(
            str(path), _count(offset, "item offset"), _count(length, "item length"),
            tuple(str(d) for d in descriptors) if descriptors else (),
        )
    raw_storage.clear()

    mcore_raw = state.get("mcore_data") or {}
    mcore_data: dict[str, tuple[int, ...]] = {}
    if isinstance(mcore_raw, dict):
        for k, v in mcore_raw.items():
            if isinstance(v, dict) and "nd_reformulated_orig_global_shape" in v:
                mcore_data[str(k)] = tuple(int(x) for x in v["nd_reformulated_orig_global_shape"])

    tensors: list[TensorEntry] = []
    objects: list[ObjectItem] = []
    get = storage.get
    for key, md in state["state_dict_metadata"].items():
        key = str(key)
        qual = getattr(md, "qualname", "")
        if qual.endswith("BytesStorageMetadata"):
            parsed = parse_shard_key(key)
            item = get((key, None))
            if parsed is None:
                objects.append(ObjectItem(key, key, None, None, item))
            else:
                objects.append(ObjectItem(key, parsed[0], parsed[1], parsed[2], item))
            continue
        mst = _state(md)
        if mst is None:
            raise TypeError(f"metadata entry for {key!r} is {type(md).__name__}")
        size = _coords(mst["size"], "size of " + key[:200])
        raw_chunks = mst.get("chunks") or []
        chunks = []
        for c in raw_chunks:
            if not isinstance(c, CRec):
                raise TypeError(f"chunk of {key!r} is not a ChunkStorageMetadata")
            cst = c[0] if c else None
            offs, sizes = cst if type(cst) is tuple and len(cst) == 2 else c.values()
            offs, sizes = _coords(offs, "chunk offset"), _coords(sizes, "chunk size")
            if len(offs) != len(sizes):
                raise ValueError(f"chunk of {key[:200]!r} has {len(offs)} offsets and {len(sizes)} sizes: "
                                 "chunk offsets and sizes differ in length")
            chunks.append(Chunk(offs, sizes, get((key, offs))))
        tensors.append(TensorEntry(key, size, _dtype(mst.get("properties")), chunks, None, mcore_data.get(key)))
        if isinstance(raw_chunks, list):
            raw_chunks.clear()

    planner = state.get("planner_data")
    planner_keys = len(planner) if isinstance(planner, (dict, list, tuple)) else None
    meta = _state(state.get("storage_meta"))
    checkpoint_id = str(meta["checkpoint_id"]) if meta and meta.get("checkpoint_id") else None
    version = state.get("version")
    unknown = tuple(sorted(k for k in state if k not in KNOWN_ATTRS and not str(k).startswith("_")))
    seen = {t.key for t in tensors} | {o.key for o in objects}
    orphans = sum(1 for fqn, _ in storage if fqn not in seen)
    table = ChunkTable.of(tensors)
    return DcpMetadata(
        table.tensors, tuple(objects), planner_keys, rank_items, mcore_data,
        str(version) if version is not None else None, checkpoint_id, getattr(root, "qualname", "?"), unknown,
        orphans, report, table,
    )


MAX_COORD = 1 << 62  # offsets, lengths, sizes: what int64 arithmetic downstream (numpy) can add without wrapping
MAX_DIMS = 64


def _count(x: Any, what: str) -> int:
    """A non-negative integer within `MAX_COORD` (a float `inf`, a 5000-digit int or a negative length is no
    coordinate: the `.metadata` is malformed)."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{what} is a {type(x).__name__}, not an int")
    if not 0 <= x <= MAX_COORD:
        raise ValueError(f"{what} is outside [0, 2**62] ({x.bit_length()}-bit{' negative' if x < 0 else ''} value)")
    return x


def _coords(values: Any, what: str) -> tuple[int, ...]:
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"{what} is a {type(values).__name__}, not a tuple")
    if len(values) > MAX_DIMS:
        raise ValueError(f"{what} has {len(values)} dimensions (bound {MAX_DIMS})")
    out = tuple(_count(v, what) for v in values)
    n = 1
    for v in out:
        n *= v
        if n > MAX_COORD:
            raise ValueError(f"{what}: {len(out)}-dim shape of more than 2**62 elements")
    return out


def _dtype(props: Any) -> str:
    """dtype name from a TensorProperties stand-in (torch pickles it as a tuple state, older ones as a dict)."""
    if isinstance(props, Rec) and props:
        st = props[0]
        if isinstance(st, tuple) and st:
            return str(st[0])
        if isinstance(st, dict) and st.get("dtype") is not None:
            return str(st["dtype"])
    return "unknown"
