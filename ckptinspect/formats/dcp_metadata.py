"""Read a DCP `.metadata` pickle into plain data (`DcpMetadata`), without torch.

Handles what torch's `FileSystemWriter.finish` writes (torch `Metadata`, reference §5.1) and what Megatron-Core adds:
`all_local_plans` (0.11+, every rank's SavePlan), `mcore_data` (0.8–0.15 N-D reformulated DistOpt tensors), the
0.15 `MCoreMetadata` root class and 0.11–0.15 `MCoreSavePlan` plans (both are plain stand-ins here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.formats._unpickle import Obj, PickleReport, load_pickle
from ckptinspect.model import Chunk, ObjectItem, StoredItem, Tensor

_SHARD_KEY = re.compile(r"^(?P<family>.*)/shard_(?P<offset>-?\d+(?:\.-?\d+)*)_(?P<shape>-?\d+(?:\.-?\d+)*)$")

# Attributes of torch's Metadata (torch 2.13) and the ones Megatron adds; anything else is noted as unknown.
_KNOWN_ATTRS = frozenset(
    {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version", "all_local_plans", "mcore_data"}
)


@dataclass(frozen=True, slots=True)
class DcpMetadata:
    """The parts of a `.metadata` pickle ckptinspect uses, as plain data.

    tensors / objects: every TensorStorageMetadata / BytesStorageMetadata entry, with storage looked up.
    planner_keys: number of entries of `planner_data` (None when it is None; Megatron writes None).
    rank_items: item keys each save-time rank wrote (`all_local_plans`), () when absent.
    mcore_data: Megatron-Core 0.8–0.15 original shapes of N-D reformulated tensors.
    root_class: qualified name of the root object (torch Metadata or Megatron's MCoreMetadata).
    unknown_attrs: root attributes this reader does not know (tolerated, noted).
    storage_without_metadata: storage entries whose fqn has no metadata entry.
    report: globals the pickle referenced.
    """

    tensors: tuple[Tensor, ...]
    objects: tuple[ObjectItem, ...]
    planner_keys: int | None
    rank_items: tuple[tuple[str, ...], ...]
    mcore_data: Mapping[str, tuple[int, ...]]
    version: str | None
    checkpoint_id: str | None
    root_class: str
    unknown_attrs: tuple[str, ...]
    storage_without_metadata: int
    report: PickleReport


def parse_shard_key(key: str) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """Split a ShardedObject unique key ``family/shard_<offsets>_<shape>`` (Megatron `mapping.py`).

    Old keys whose offset has one more axis than the shape get a ``-1`` appended to the shape, as Megatron's
    `empty_from_unique_key` does.
    """
    m = _SHARD_KEY.match(key)
    if m is None:
        return None
    offset = tuple(int(x) for x in m.group("offset").split("."))
    shape = tuple(int(x) for x in m.group("shape").split("."))
    if len(shape) + 1 == len(offset):
        shape = shape + (-1,)
    return m.group("family"), offset, shape


def read_dcp_metadata(data: bytes, report: PickleReport | None = None) -> DcpMetadata:
    """Parse `.metadata` bytes. Raises `ReadError` with code CK106 (or CK603 for resource bounds).

    `report` collects the globals the pickle referenced, also when parsing fails (a hostile `.metadata` is both
    unreadable and unsafe).
    """
    report = report if report is not None else PickleReport()
    try:
        root = load_pickle(data, report)
    except ReadError as e:
        raise ReadError(str(e), "CK603" if e.code == "CK603" else "CK106") from e
    if not isinstance(root, Obj) or not isinstance(root.get("state_dict_metadata"), dict):
        what = root.qualname if isinstance(root, Obj) else type(root).__name__
        raise ReadError(f"not a DCP Metadata object (root is {what})", "CK106")
    try:
        return _convert(root, report)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as e:
        raise ReadError(f"malformed DCP Metadata: {type(e).__name__}: {e}", "CK106") from e


def _convert(root: Obj, report: PickleReport) -> DcpMetadata:
    storage: dict[tuple[str, tuple[int, ...] | None], StoredItem] = {}
    raw_storage = root.get("storage_data") or {}
    if not isinstance(raw_storage, dict):
        raise TypeError("storage_data is not a dict")
    for index, info in raw_storage.items():
        fqn = index.get("fqn") if isinstance(index, Obj) else None
        if not isinstance(fqn, str) or not isinstance(info, Obj):
            raise TypeError("storage_data entry is not MetadataIndex -> _StorageInfo")
        off = index.get("offset")
        descriptors = info.get("transform_descriptors") or ()
        storage[(fqn, tuple(off) if off is not None else None)] = StoredItem(
            str(info.get("relative_path")), int(info.get("offset")), int(info.get("length")),
            tuple(str(d) for d in descriptors),
        )

    mcore_raw = root.get("mcore_data") or {}
    mcore_data: dict[str, tuple[int, ...]] = {}
    if isinstance(mcore_raw, dict):
        for k, v in mcore_raw.items():
            if isinstance(v, dict) and "nd_reformulated_orig_global_shape" in v:
                mcore_data[str(k)] = tuple(int(x) for x in v["nd_reformulated_orig_global_shape"])

    tensors: list[Tensor] = []
    objects: list[ObjectItem] = []
    seen_fqns: set[str] = set()
    for key, md in root.get("state_dict_metadata").items():
        key = str(key)
        seen_fqns.add(key)
        if not isinstance(md, Obj):
            raise TypeError(f"metadata entry for {key!r} is {type(md).__name__}")
        if md.qualname.endswith("BytesStorageMetadata"):
            parsed = parse_shard_key(key)
            item = storage.get((key, None))
            if parsed is None:
                objects.append(ObjectItem(key, key, None, None, item))
            else:
                objects.append(ObjectItem(key, parsed[0], parsed[1], parsed[2], item))
            continue
        size = tuple(int(x) for x in md.get("size"))
        chunks = tuple(
            Chunk(offs, tuple(c.get("sizes")), storage.get((key, offs)))
            for c in md.get("chunks") or ()
            for offs in (tuple(c.get("offsets")),)
        )
        tensors.append(Tensor(key, size, _dtype(md.get("properties")), chunks, None, mcore_data.get(key)))

    plans = root.get("all_local_plans")
    rank_items: tuple[tuple[str, ...], ...] = ()
    if isinstance(plans, list):
        rank_items = tuple(
            tuple(str(it.get("index").get("fqn")) for it in (p.get("items") or ()))
            for p in plans
            if isinstance(p, Obj)
        )
    planner = root.get("planner_data")
    planner_keys = len(planner) if isinstance(planner, (dict, list, tuple)) else None
    meta = root.get("storage_meta")
    checkpoint_id = str(meta.get("checkpoint_id")) if isinstance(meta, Obj) and meta.get("checkpoint_id") else None
    version = root.get("version")
    unknown = tuple(sorted(k for k in root.__dict__ if k not in _KNOWN_ATTRS and not k.startswith("_")))
    orphans = sum(1 for fqn, _ in storage if fqn not in seen_fqns)
    return DcpMetadata(
        tuple(tensors), tuple(objects), planner_keys, rank_items, mcore_data,
        str(version) if version is not None else None, checkpoint_id, root.qualname, unknown, orphans, report,
    )


def _dtype(props: Any) -> str:
    """dtype name from a TensorProperties stand-in (torch pickles it as a tuple state, older ones as a dict)."""
    if isinstance(props, Obj):
        state = props.get("_state")
        if isinstance(state, tuple) and state:
            return str(state[0])
        dtype = props.get("dtype")
        if dtype is not None:
            return str(dtype)
    return "unknown"
