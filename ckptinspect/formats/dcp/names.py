"""The torch classes a DCP `.metadata` pickles, by qualified name (torch 2.13 `distributed/checkpoint/metadata.py`,
`planner.py`, `filesystem.py`): what both `.metadata` readers (`metadata.py`, the reference; `vm_*.py`, the
streaming evaluator) recognise, and how the reference asks the unpickler to build them (`RECORDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptinspect.pickling.unpickle import Records

_MD = "torch.distributed.checkpoint.metadata."
_PLANNER = "torch.distributed.checkpoint.planner."
METADATA = _MD + "Metadata"
CHUNK = _MD + "ChunkStorageMetadata"
TSM = _MD + "TensorStorageMetadata"
BYTES = _MD + "BytesStorageMetadata"
PROPS = _MD + "TensorProperties"
INDEX = _MD + "MetadataIndex"
STORAGE_META = _MD + "StorageMeta"
STORAGE_INFO = "torch.distributed.checkpoint.filesystem._StorageInfo"
SAVE_PLAN = _PLANNER + "SavePlan"
WRITE_ITEM = _PLANNER + "WriteItem"
TENSOR_WRITE_DATA = _PLANNER + "TensorWriteData"

# The classes both readers make records (the reference: list-based `Rec`s, C-speed, no `__dict__`; they ignore
# NEWOBJ arguments); every other allowed class is a plain object.
RECORD_CLASSES = frozenset({
    PROPS, METADATA, TSM, BYTES, CHUNK, INDEX, STORAGE_META, STORAGE_INFO, SAVE_PLAN, WRITE_ITEM, TENSOR_WRITE_DATA,
})

# Field order of the three per-chunk records (three objects per chunk), which keep only their values (`CRec`).
COMPACT_FIELDS: Mapping[str, tuple[str, ...]] = {
    CHUNK: ("offsets", "sizes"),
    INDEX: ("fqn", "offset", "index"),
    STORAGE_INFO: ("relative_path", "offset", "length", "transform_descriptors"),
}

# The records of the plans whose state nobody reads (Megatron's `all_local_plans`: only items per rank are
# counted), and how they take their state once the plans began in the reference reader's plan-discarding read:
# dict states are emptied, TensorProperties' tuple state is ignored. Both are C functions: no Python call per item.
_PLAN_DISCARD: Mapping[str, Any] = {
    WRITE_ITEM: staticmethod(dict.clear),
    TENSOR_WRITE_DATA: staticmethod(dict.clear),
    INDEX: staticmethod(dict.clear),
    CHUNK: staticmethod(dict.clear),
    PROPS: staticmethod(id),
}
PLAN_ITEMS = frozenset(_PLAN_DISCARD)

RECORDS = Records(RECORD_CLASSES, COMPACT_FIELDS)
RECORDS_DISCARDING_PLANS = Records(RECORD_CLASSES, COMPACT_FIELDS, "SavePlan", _PLAN_DISCARD)
