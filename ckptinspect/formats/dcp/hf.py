"""What torch DCP's Hugging Face storage writer writes, read as its reader reads it (torch 2.13 `hf_storage.py`).

`HuggingFaceStorageWriter` saves tensors (no byte items) into safetensors files, each with a `__metadata__` of
`DCP_SHARDING_INFO` (JSON: fqn -> `saved_offsets`), `DCP_VERSION` and `format: pt`:
- rank-0 mode: `model-0000i-of-0000N.safetensors` (files by `fqn_to_index_mapping`) and `model.safetensors.index.json`
  (`weight_map`: fqn -> file);
- `save_distributed=True`: every rank its `shard-0000R-model-0000i-of-0000N.safetensors`, no index;
- with `enable_consolidation=True`: those shards under `sharded/`, and `consolidate_safetensors_files` writes full
  tensors into top-level `model-*.safetensors` (no DCP metadata) plus the index.

`HuggingFaceStorageReader.read_metadata` lists the top-level `*.safetensors` files only and makes one chunk per file
and key: offsets from `DCP_SHARDING_INFO` (zeros without), sizes from the header shape, the tensor's size the maximum
of offset + shape. So here: every top-level safetensors file is read the same way (`safetensors_header.py`), chunks
and their stored bytes go into the model (`Checkpoint.raw_tensor_items`: raw element bytes, no archive), a header
that safetensors would refuse is CK106, an entry whose byte length is not numel × itemsize CK205, and a file the
index names that is not there CK201.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import list_files, regular_size
from ckptinspect.formats.safetensors_header import DTYPES, Header, read_header
from ckptinspect.model import Checkpoint, Chunk, Format, StoredItem, Topology, dtype_size
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.io.local import file_size, open_regular, read_small

INDEX = "model.safetensors.index.json"
SUFFIX = ".safetensors"
SHARDED = "sharded"
DCP_KEYS = ("DCP_SHARDING_INFO", "DCP_VERSION")
MAX_INDEX_BYTES = 64 << 20


def _header(path: Path) -> Header:
    with open_regular(path) as f:
        return read_header(f, 0, file_size(f))


def _dcp_written(path: Path) -> bool:
    try:
        return any(k in _header(path).metadata for k in DCP_KEYS)
    except (OSError, ReadError):
        return False


def hf_layout(path: Path) -> str | None:
    """Evidence that `path` is the Hugging Face storage writer's output, or None: a top-level safetensors file with
    DCP's `__metadata__`, or (consolidated mode) such files under `sharded/`. Never raises."""
    try:
        top = sorted(p for p in path.iterdir() if p.name.endswith(SUFFIX))
        sharded = sorted(p for p in (path / SHARDED).iterdir() if p.name.endswith(SUFFIX)) \
            if (path / SHARDED).is_dir() else []
    except OSError:
        return None
    if any(_dcp_written(p) for p in top[:8]):
        return (f"{len(top)} safetensors file(s) with DCP's __metadata__ (DCP_SHARDING_INFO): torch DCP's "
                "HuggingFaceStorageWriter")
    if (top or (path / INDEX).exists()) and any(_dcp_written(p) for p in sharded[:8]):
        return (f"{len(top)} consolidated safetensors file(s), {len(sharded)} DCP shard(s) under sharded/: "
                "HuggingFaceStorageWriter(enable_consolidation=True)")
    return None


def read_hf(path: Path, label: str) -> Checkpoint:
    """Read the Hugging Face storage writer's output as torch's `HuggingFaceStorageReader` does. Never raises."""
    files = list_files(path, recursive=True)
    findings: list[Finding] = []
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    chunks: dict[str, list[Chunk]] = {}
    for f in files:
        if "/" in f.name or not f.name.endswith(SUFFIX):
            continue
        try:
            h = _header(path / f.name)
            info = json.loads(h.metadata.get("DCP_SHARDING_INFO", "{}"))
            if not isinstance(info, dict):
                raise ReadError("DCP_SHARDING_INFO is not a JSON object", "CK106")
        except OSError as e:
            findings.append(Finding("CK106", f"{f.name} unreadable: {e.strerror or e}", f.name, label))
            continue
        except (ReadError, ValueError, RecursionError) as e:
            code = e.code if isinstance(e, ReadError) else "CK106"
            findings.append(Finding(code, f"{f.name}: {e}", f.name, label))
            continue
        for ent in h.entries:
            saved = info.get(ent.name, {}).get("saved_offsets") if isinstance(info.get(ent.name), dict) else None
            offs = tuple(saved) if isinstance(saved, list) and all(type(x) is int and x >= 0 for x in saved) \
                and len(saved) == len(ent.shape) else (0,) * len(ent.shape)
            dtype = DTYPES.get(ent.dtype, ent.dtype.lower())
            size = dtype_size(dtype)
            numel = 1
            for d in ent.shape:
                numel *= d
            if size is not None and ent.end - ent.begin != numel * size:
                findings.append(Finding("CK205", f"{ent.name}: {f.name} holds {ent.end - ent.begin} bytes for a "
                                        f"{list(ent.shape)} {dtype} chunk ({numel * size} expected)", ent.name, label,
                                        {"file": f.name, "offset": ent.begin, "length": ent.end - ent.begin}))
            have = shapes.setdefault(ent.name, [0] * len(ent.shape))
            if len(have) == len(ent.shape):
                shapes[ent.name] = [max(a, o + s) for a, o, s in zip(have, offs, ent.shape)]
            dtypes.setdefault(ent.name, dtype)
            chunks.setdefault(ent.name, []).append(
                Chunk(offs, ent.shape, StoredItem(f.name, ent.begin, ent.end - ent.begin)))
    findings.extend(_index_findings(path, label, {f.name for f in files}))
    table = ChunkTable.of(TensorEntry(k, tuple(shapes[k]), dtypes[k], c) for k, c in chunks.items())
    ranks = {f.name.split("-", 2)[1] for f in files if "/" not in f.name and f.name.startswith("shard-")}
    return Checkpoint(
        path=label, format=Format.TORCH_DCP,
        generation="torch.distributed.checkpoint HuggingFaceStorageWriter (safetensors)",
        files=files, findings=tuple(findings), table=table, raw_tensor_items=True,
        topology=Topology(world_size=len(ranks) or None,
                          sources={"world_size": "shard-<rank> file names"} if ranks else {}),
        extra={"hf_index": (path / INDEX).exists()},
    )


def _index_findings(path: Path, label: str, present: set[str]) -> list[Finding]:
    """CK201 for every file `model.safetensors.index.json`'s `weight_map` names that does not exist; CK106 for an
    index that is not that JSON."""
    if regular_size(path / INDEX) is None:
        return []
    try:
        doc = json.loads(read_small(path / INDEX, MAX_INDEX_BYTES).decode("utf-8"))
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        return [Finding("CK106", f"{INDEX} unreadable: {e}", INDEX, label)]
    missing: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        if isinstance(name, str) and name not in present:
            missing.setdefault(name, []).append(str(key))
    return [Finding("CK201", f"{name}: named by {INDEX} for {len(keys)} tensor(s) (e.g. {keys[0]}) but does not exist",
                    name, label, {"items": len(keys), "example": keys[0]}) for name, keys in missing.items()]
