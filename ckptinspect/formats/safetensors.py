"""Hugging Face safetensors release artifacts, read without the `safetensors` package and without trusting the file.

PATH is one `*.safetensors` file, a dir holding one (or several), or a sharded set: `model-0000i-of-0000N.safetensors`
files and `model.safetensors.index.json` (`{"metadata": {"total_size": N}, "weight_map": {tensor: file}}`, as
transformers' `save_pretrained` and huggingface_hub's `split_torch_state_dict_into_shards` write it). Every file's
header is parsed once, by `safetensors_header.read_header` (bounded: the length, `MAX_HEADER_BYTES`, the JSON
nesting); each tensor is one chunk at offsets 0 whose stored item is its span
`StoredItem(file, 8 + header_len + begin, end - begin)`; `__metadata__` (and the index's `metadata`) are plain data in
`Checkpoint.common`. Tensor bytes are raw elements (`raw_tensor_items`): nothing to unpickle.

What the safetensors library (0.8.0, `Metadata::validate`) refuses to open is corrupt here, each finding naming the
file and the tensor: a header it would not parse (CK140-CK143), an unknown dtype (CK144), a span that is not
numel × bits / 8 bytes (CK145), reaches past the file (CK146), overlaps another (CK147), leaves a gap (CK148) or
bytes after the last span (CK149). A zero-element tensor's span `[x, x)` is legal. Between the index and the shards:
a tensor the index places in a shard that lacks it (CK150), a tensor in two files (CK151), a shard the index names
that is missing (CK152), a shard file no index entry names (CK153, a warning, like a stale `.distcp`), a tensor of a
listed shard that the index does not name (CK155: transformers loads by the index's keys and drops it), an index
that is not that JSON (CK154).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError, access_failure, read_code
from ckptinspect.findings import Finding
from ckptinspect.formats.files import list_files, regular_size
from ckptinspect.formats.safetensors_header import DTYPE_BITS, DTYPES, INDEX, SUFFIX, Entry, HeaderError, read_header
from ckptinspect.io.local import file_size, leaves_dir, note_unread, open_regular, read_small
from ckptinspect.model import Checkpoint, Chunk, FileInfo, FileRole, Format, StoredItem
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry

MAX_INDEX_BYTES = 64 << 20  # a 1T-parameter model's index is a few MB
MAX_LISTED = 20  # findings of one code per file; the rest are counted in one more finding
HEADER_CODES = {"length": "CK140", "json": "CK141", "nesting": "CK142", "entry": "CK143"}
GENERATION = "safetensors"


def safetensors_evidence(path: Path) -> str | None:
    """Evidence that `path` is a safetensors file or a dir of them (top-level `*.safetensors`, or the index), or None.
    Never raises. (DCP's Hugging Face storage layout is sniffed before this: `dcp/hf.py`.)"""
    if path.name.endswith(SUFFIX) and regular_size(path) is not None:
        return f"{path.name}: a safetensors file"
    try:
        names = sorted(p.name for p in path.iterdir() if p.name.endswith(SUFFIX))
    except OSError:
        return None
    index = regular_size(path / INDEX) is not None
    if not names and not index:
        return None
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"{len(names)} safetensors file(s) ({shown or 'none'})" + (f" and {INDEX}" if index else "")
            + ", no DCP __metadata__: a Hugging Face safetensors checkpoint")


class _Found:
    """Findings, at most `MAX_LISTED` of one code per file (then one that counts the rest)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.items: list[Finding] = []
        self.more: dict[tuple[str, str], int] = {}

    def add(self, code: str, file: str, tensor: str | None, message: str, **details: Any) -> None:
        key = (code, file)
        n = self.more.get(key, 0)
        self.more[key] = n + 1
        if n < MAX_LISTED:
            self.items.append(Finding(code, f"{file}: {message}", tensor if tensor is not None else file, self.label,
                                      {"file": file, **({"tensor": tensor} if tensor is not None else {}), **details}))

    def done(self) -> tuple[Finding, ...]:
        extra = [Finding(code, f"{file}: {n - MAX_LISTED} more finding(s) of this kind", file, self.label,
                         {"file": file, "more": n - MAX_LISTED})
                 for (code, file), n in self.more.items() if n > MAX_LISTED]
        return tuple(self.items + extra)


def _short(name: str) -> str:
    return name if len(name) <= 200 else name[:200] + "…"


def _check_spans(found: _Found, file: str, entries: Iterable[Entry], data_start: int, size: int) -> None:
    """dtype, span length, place: what `Metadata::validate` checks, reported tensor by tensor."""
    data = size - data_start
    ordered = sorted(entries, key=lambda e: (e.begin, e.end))
    reach, last = data_start, None
    for e in ordered:
        begin, end = e.begin - data_start, e.end - data_start
        bits = DTYPE_BITS.get(e.dtype)
        if bits is None:
            found.add("CK144", file, e.name, f"{_short(e.name)}: unknown dtype {_short(e.dtype)!r}", dtype=e.dtype)
        else:
            nbits = math.prod(e.shape) * bits
            if nbits % 8 or e.end - e.begin != nbits // 8:
                found.add("CK145", file, e.name, f"{_short(e.name)}: span [{begin}, {end}) is {e.end - e.begin} bytes, "
                          f"but {e.dtype} × {list(e.shape)} is {nbits / 8:g}", dtype=e.dtype, shape=list(e.shape),
                          span=[begin, end], expected_bytes=nbits / 8 if nbits % 8 else nbits // 8)
        if e.end > size:
            found.add("CK146", file, e.name, f"{_short(e.name)}: span [{begin}, {end}) reaches past the data area "
                      f"({data} bytes after the {data_start}-byte header)", span=[begin, end], data_bytes=data)
        if e.begin < reach:
            other = last.name if last is not None else None
            found.add("CK147", file, e.name, f"{_short(e.name)}: span [{begin}, {end}) overlaps "
                      f"{_short(other or '?')} (which reaches {reach - data_start})", span=[begin, end], other=other)
        elif e.begin > reach:
            found.add("CK148", file, e.name, f"{_short(e.name)}: {e.begin - reach} byte(s) that no tensor holds "
                      f"before its span [{begin}, {end}) (from {reach - data_start})", span=[begin, end],
                      gap=[reach - data_start, begin])
        if e.end > reach:
            reach, last = e.end, e
    if reach < size:
        found.add("CK149", file, last.name if last is not None else None,
                  f"{size - reach} byte(s) after the last span (data area {data} bytes, spans end at "
                  f"{reach - data_start})" + (f", last tensor {_short(last.name)}" if last is not None else ""),
                  trailing_bytes=size - reach)


def _read_index(base: Path, found: _Found) -> tuple[dict[str, str], dict[str, Any]] | None:
    """The index's (weight_map, metadata), or None when there is none or it is not that JSON (CK154)."""
    if regular_size(base / INDEX) is None:
        return None
    try:
        doc = json.loads(read_small(base / INDEX, MAX_INDEX_BYTES).decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        weight_map, meta = doc.get("weight_map"), doc.get("metadata", {})
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("weight_map is not an object of tensor name -> file name")
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
        outside = sorted({v for v in weight_map.values() if leaves_dir(v)})
        if outside:
            raise ValueError(f"weight_map names files outside the dir ({_short(outside[0])}): not opened")
    except OSError as e:
        if access_failure(e):
            note_unread(base / INDEX, e, "open")  # CK209 (`read_checkpoint`)
            return None
        found.add("CK154", INDEX, None, f"unreadable: {e.strerror or e}")
        return None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        msg = "nested too deeply to parse" if isinstance(e, RecursionError) else str(e)[:300]
        found.add("CK154", INDEX, None, f"not a safetensors index ({msg}): shards checked without it")
        return None
    return weight_map, meta


def read_safetensors(path: Path, label: str, seen: object = None) -> Checkpoint:
    """Read a safetensors file, dir or sharded set (module docstring). Never raises for a broken or hostile one."""
    found = _Found(label)
    if path.name.endswith(SUFFIX) and not path.is_dir():
        base, listed = path.parent, tuple(f for f in list_files(path.parent) if f.name == path.name)
        index = None
    else:
        base, listed = path, list_files(path)
        index = _read_index(base, found)
    weight_map, index_meta = index if index is not None else ({}, None)
    present = {f.name for f in listed}
    shard_names = sorted({f.name for f in listed if f.name.endswith(SUFFIX)}
                         | {n for n in weight_map.values() if n in present or regular_size(base / n) is not None})
    listed_shards = set(weight_map.values())
    where: dict[str, list[str]] = {}  # tensor -> files holding it
    spans: dict[tuple[str, str], Entry] = {}
    metadata: dict[str, dict[str, str]] = {}
    parsed: set[str] = set()
    for name in shard_names:
        try:
            with open_regular(base / name) as f:
                size = file_size(f)
                header = read_header(f, 0, size)
        except HeaderError as e:
            found.add(read_code(e, HEADER_CODES[e.kind]), name, None, f"header refused: {e}")
            continue
        except (OSError, ReadError) as e:
            if isinstance(e, OSError) and access_failure(e):
                note_unread(base / name, e, "open")  # CK209 (`read_checkpoint`), also for a read that failed
            else:
                found.add("CK140", name, None, f"unreadable: {getattr(e, 'strerror', None) or e}")
            continue
        parsed.add(name)
        metadata[name] = dict(header.metadata)
        _check_spans(found, name, header.entries, header.data_start, size)
        for ent in header.entries:
            where.setdefault(ent.name, []).append(name)
            spans[(ent.name, name)] = ent
    if index is not None:
        _index_findings(found, weight_map, where, parsed, shard_names, listed_shards)
    entries = []
    for tensor, holders in where.items():
        named = weight_map.get(tensor)
        file = named if named in holders else holders[0]
        ent = spans[(tensor, file)]
        entries.append(TensorEntry(tensor, ent.shape, DTYPES.get(ent.dtype, _short(ent.dtype).lower()),
                                   [Chunk((0,) * len(ent.shape), ent.shape, StoredItem(file, ent.begin,
                                                                                       ent.end - ent.begin))]))
    files = tuple(FileInfo(f.name, f.size, FileRole.DATA if f.name.endswith(SUFFIX) else
                           FileRole.METADATA if f.name == INDEX else f.role) for f in listed)
    common: dict[str, Any] = {"__metadata__": metadata}
    if index_meta is not None:
        common["index_metadata"] = index_meta
    return Checkpoint(
        path=label, data_dir=str(base) if base != path else "", format=Format.SAFETENSORS,
        generation=GENERATION + (f" (sharded: {INDEX})" if index is not None else ""),
        files=files, findings=found.done(), table=ChunkTable.of(entries), raw_tensor_items=True, common=common,
        extra={"hf_index": index is not None, "shards": len(shard_names)},
    )


def _index_findings(found: _Found, weight_map: dict[str, str], where: dict[str, list[str]], parsed: set[str],
                    shard_names: list[str], listed_shards: set[str]) -> None:
    """The index against the shards' headers (CK150-CK153, CK155)."""
    missing: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        if file not in shard_names:
            missing.setdefault(file, []).append(tensor)
        elif file in parsed and file not in where.get(tensor, ()):
            elsewhere = where.get(tensor, [])
            found.add("CK150", file, tensor, f"{_short(tensor)}: {INDEX} places it here, but the header does not "
                      "hold it" + (f" ({', '.join(elsewhere)} does)" if elsewhere else ""), elsewhere=elsewhere)
    for file, tensors in missing.items():
        found.add("CK152", file, None, f"named by {INDEX} for {len(tensors)} tensor(s) (e.g. {_short(tensors[0])}) "
                  "but does not exist", tensors=len(tensors), example=tensors[0])
    for tensor, files in where.items():
        if len(files) > 1:
            for file in files[1:]:
                found.add("CK151", file, tensor, f"{_short(tensor)} is also in {files[0]}" +
                          (f" ({INDEX} names {weight_map[tensor]})" if tensor in weight_map else ""),
                          files=files, indexed=weight_map.get(tensor))
        elif tensor not in weight_map and files[0] in listed_shards:
            found.add("CK155", files[0], tensor, f"{_short(tensor)}: in the header but not in {INDEX}'s weight_map "
                      "(loaders that follow the index never read it)")
    for file in shard_names:
        if file not in listed_shards:
            found.add("CK153", file, None, f"a safetensors file that {INDEX} does not name (a leftover? loaders "
                      "that follow the index never read it)", tensors=sum(file in f for f in where.values()))
