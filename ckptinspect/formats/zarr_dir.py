"""Megatron-Core ≤0.15 `zarr` backend (`metadata.json` `sharded_backend: "zarr"`), read without the zarr package.

Layout (megatron-core 0.15.3 `dist_checkpointing/strategies/zarr.py` `_create_zarr_array`, `strategies/common.py`;
verified on sample_ckpts/mcore_0_15_3_zarr):
- one zarr v2 array dir per ShardedTensor key: `<key>/.zarray` (JSON: `shape`, `chunks` = the tensor's regular
  sharding grid, `dtype` numpy typestr — `"bfloat16"` patched in for bf16 —, `compressor: null`, `order`,
  `dimension_separator`, default "."), and one UNCOMPRESSED chunk file per grid cell named by its grid index
  (`0.1`); every chunk file holds a full chunk (`prod(chunks) × itemsize` bytes, edge chunks padded);
- flattened tensors add a `<key>.sync` lock dir (zarr ProcessSynchronizer);
- ShardedObjects as `<key>/shard_<offsets>_<grid>.pt` (`torch.save`), and `common.pt`, `metadata.json`.
There is no `.metadata`: the array dirs ARE the metadata. Each chunk becomes a `Chunk` whose `StoredItem` is the
whole chunk file, so the storage checks report a missing chunk file (CK201) or a short one (CK202) with its key
and grid index, and coverage sees the array's grid.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

from ckptinspect.errors import read_code
from ckptinspect.findings import Finding
from ckptinspect.formats.files import regular_size
from ckptinspect.model import Chunk, ObjectItem, StoredItem
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.io.local import probe_dir, read_small

ZARRAY = ".zarray"
_MAX_CHUNKS = 1_000_000
_SHARD = re.compile(r"^shard_([0-9.]+)_([0-9.]+)\.pt$")
# numpy typestrs Megatron writes (torch_to_numpy_dtype_dict) -> torch dtype names
_DTYPES = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "bfloat16": "bfloat16", "<i8": "int64",
           "<i4": "int32", "<i2": "int16", "|i1": "int8", "|u1": "uint8", "|b1": "bool"}
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1}


def read_zarr_arrays(path: Path, label: str) -> tuple[ChunkTable, tuple[ObjectItem, ...], list[Finding]]:
    """Every zarr array and ShardedObject file under `path` (one checkpoint dir). Never raises."""
    tensors: list[TensorEntry] = []
    objects: list[ObjectItem] = []
    findings: list[Finding] = []
    try:
        entries = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.endswith(".sync"))
    except OSError as e:
        return ChunkTable.empty(), (), [Finding(read_code(e, "CK113"), f"zarr checkpoint dir unreadable: {e.strerror or e}",
                                                None, label)]
    for d in entries:
        if probe_dir(d) is not None:
            continue  # an array dir this user may not list or enter: CK209 (noted), its chunks unknown, not missing
        if (d / ZARRAY).is_file():
            t = _array(d, label, findings)
            if t is not None:
                tensors.append(t)
            continue
        try:
            names = sorted(p.name for p in d.iterdir() if p.is_file())
        except OSError:
            names = []
        for name in names:
            m = _SHARD.match(name)
            if m is None:
                continue
            off = tuple(int(x) for x in m.group(1).split("."))
            grid = tuple(int(x) for x in m.group(2).split("."))
            size = regular_size(d / name) or 0  # an object in a bucket has no stat(): the listing's size
            objects.append(ObjectItem(f"{d.name}/{name[:-3]}", d.name, off, grid,
                                      StoredItem(f"{d.name}/{name}", 0, size)))
    return ChunkTable.of(tensors), tuple(objects), findings


def _array(d: Path, label: str, findings: list[Finding]) -> TensorEntry | None:
    key = d.name
    try:
        meta = json.loads(read_small(d / ZARRAY, 1 << 20).decode("utf-8"))
        shape = tuple(int(x) for x in meta["shape"])
        chunks = tuple(int(x) for x in meta["chunks"])
        dtype = _DTYPES.get(str(meta["dtype"]), str(meta["dtype"]))
        sep = str(meta.get("dimension_separator") or ".")
        compressed = meta.get("compressor") is not None or bool(meta.get("filters"))
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        findings.append(Finding(read_code(e, "CK113"), f"{key}/.zarray unreadable: {e}", f"{key}/{ZARRAY}", label))
        return None
    if len(chunks) != len(shape) or any(c < 1 for c in chunks) or any(s < 0 for s in shape):
        findings.append(Finding("CK113", f"{key}/.zarray: chunks {list(chunks)} do not fit shape {list(shape)}",
                                f"{key}/{ZARRAY}", label))
        return None
    grid = [math.ceil(s / c) if s else 0 for s, c in zip(shape, chunks)]
    if math.prod(grid) > _MAX_CHUNKS:
        findings.append(Finding("CK113", f"{key}/.zarray: {math.prod(grid)} chunks exceed the reader bound",
                                f"{key}/{ZARRAY}", label))
        return None
    itemsize = _ITEMSIZE.get(dtype)
    full = math.prod(chunks) * itemsize if itemsize is not None else 0
    out: list[Chunk] = []
    for idx in itertools.product(*(range(g) for g in grid)):
        offsets = tuple(i * c for i, c in zip(idx, chunks))
        sizes = tuple(min(c, s - o) for c, s, o in zip(chunks, shape, offsets))
        name = sep.join(str(i) for i in idx) if idx else "0"
        # uncompressed chunks are exactly `full` bytes; with a compressor the length is whatever is on disk
        length = full if not compressed else _size(d / name)
        out.append(Chunk(offsets, sizes, StoredItem(f"{key}/{name}", 0, length)))
    return TensorEntry(key, shape, dtype, tuple(out))


def _size(p: Path) -> int:
    return regular_size(p) or 0
