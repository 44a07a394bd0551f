"""Who wrote what: bytes per save-time rank and per file, split into model / optimizer / rng / other.

Ranks come from the data file names (`__{rank}_{i}.distcp`, Megatron `filesystem_async.py` and torch
`prepare_global_plan`); components from the item keys. This shows whether the fully-parallel save spread the write
evenly over the DP group and how big each component is.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from ckptinspect.model.components import COMPONENTS, component_of
from ckptinspect.model import Checkpoint, frozen, frozen2

_RANK_FILE = re.compile(r"^(?:.*?)__(\d+)_(\d+)\.distcp$")


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts and byte splits of a checkpoint."""

    tensors: int
    chunks: int
    objects: int
    files: int
    bytes: int
    payload_bytes: int
    by_component: Mapping[str, int]
    by_rank: Mapping[int, Mapping[str, int]]
    by_file: Mapping[str, Mapping[str, int]]
    dtypes: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: frozen({}))  # component -> dtype -> count

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_component", frozen(self.by_component))
        for name in ("by_rank", "by_file", "dtypes"):
            object.__setattr__(self, name, frozen2(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": self.tensors, "chunks": self.chunks, "objects": self.objects, "files": self.files,
            "bytes": self.bytes, "payload_bytes": self.payload_bytes, "by_component": dict(self.by_component),
            "by_rank": {str(k): dict(v) for k, v in sorted(self.by_rank.items())},
            "by_file": {k: dict(v) for k, v in self.by_file.items()},
            "dtypes": {k: dict(v) for k, v in self.dtypes.items()},
        }


def _table_bytes(ckpt: Checkpoint, acc: dict[tuple[str, str], int]) -> None:
    """Bytes per (file, component) from the chunk table's columns: one `bincount`, no object per chunk."""
    import numpy as np

    from ckptinspect.checks.columns import chunk_tensor_ids

    table = ckpt.table
    comp_of_tensor = np.array([COMPONENTS.index(component_of(k)) for k in table.keys], dtype=np.int64)
    rows = np.flatnonzero(table.file_id >= 0)
    if not len(rows):
        return
    cell = table.file_id[rows].astype(np.int64) * len(COMPONENTS) + comp_of_tensor[chunk_tensor_ids(table)[rows]]
    # int64 sums (a float64 weight sum would round above 2**53 bytes)
    order = np.argsort(cell, kind="stable")
    cells, starts = np.unique(cell[order], return_index=True)
    sums = np.add.reduceat(table.byte_length[rows][order], starts)
    for c, n in zip(cells.tolist(), sums.tolist()):
        acc[(table.files[c // len(COMPONENTS)], COMPONENTS[c % len(COMPONENTS)])] += int(n)


def summarize(ckpt: Checkpoint) -> Summary:
    by_component = dict.fromkeys(COMPONENTS, 0)
    # (file, component) -> bytes; the component is decided once per tensor, not per chunk
    acc: dict[tuple[str, str], int] = defaultdict(int)
    dtypes: dict[str, dict[str, int]] = {}
    for t in ckpt.tensors:
        per = dtypes.setdefault(component_of(t.key), {})
        per[t.dtype] = per.get(t.dtype, 0) + 1
    _table_bytes(ckpt, acc)
    for o in ckpt.objects:
        if o.storage is not None:
            acc[(o.storage.file, component_of(o.key))] += o.storage.length
    by_file: dict[str, dict[str, int]] = {}
    by_rank: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COMPONENTS, 0))
    for (name, comp), n in acc.items():
        by_component[comp] += n
        by_file.setdefault(name, dict.fromkeys(COMPONENTS, 0))[comp] += n
        m = _RANK_FILE.match(name.rsplit("/", 1)[-1])
        if m:
            by_rank[int(m.group(1))][comp] += n
    return Summary(
        tensors=len(ckpt.tensors), chunks=ckpt.table.n_chunks, objects=len(ckpt.objects), files=len(ckpt.files),
        bytes=ckpt.data_bytes, payload_bytes=sum(t.nbytes for t in ckpt.tensors),
        by_component=by_component, by_rank=dict(by_rank), by_file=dict(sorted(by_file.items())),
        dtypes={c: dict(sorted(dtypes[c].items())) for c in COMPONENTS if c in dtypes},
    )
