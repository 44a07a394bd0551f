"""The header of a safetensors blob, parsed without the `safetensors` package and without reading tensor bytes.

Kept minimal on purpose, for what DCP's readers need (torch 2.13 `hf_storage.py` / `_hf_utils.py`, the Hugging Face
storage writer's files and `FileSystemWriter(serialization_format=SAFETENSORS)` `.distcp` blobs): the 8-byte
little-endian header length, the JSON header (`dtype`, `shape`, `data_offsets` per tensor, the `__metadata__`
string map), the offset the data starts at. It is not a reader of safetensors release artifacts (index files,
sharded repos, dtype coverage of every framework): that belongs to the release-artifact reader, which can build on
`read_header` instead of parsing the format a second time.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

from ckptinspect.errors import ReadError

MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers (`MAX_HEADER_SIZE`)
# safetensors dtype codes -> the model's dtype names (`model.DTYPE_SIZES`)
DTYPES: Mapping[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of the header. begin / end: absolute byte offsets in the file (data start + `data_offsets`)."""

    name: str
    dtype: str  # the safetensors code ("F32")
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Header:
    """entries in header order; metadata: the `__metadata__` map (str -> str); data_start: first data byte."""

    entries: tuple[Entry, ...]
    metadata: Mapping[str, str]
    data_start: int


def read_header(f: IO[bytes], offset: int, available: int) -> Header:
    """Parse the header of the blob at `offset` of `f` (`available` bytes from there to the end). Raises `ReadError`
    (code CK106) for anything the safetensors library would refuse to open."""
    f.seek(offset)
    head = f.read(8)
    if len(head) < 8:
        raise ReadError("shorter than a safetensors header length (8 bytes)", "CK106")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or n > available - 8:
        raise ReadError(f"safetensors header length {n} exceeds the data ({available - 8} bytes) or the "
                        f"{MAX_HEADER_BYTES}-byte bound", "CK106")
    raw = f.read(n)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ReadError(f"safetensors header is not JSON: {e}", "CK106") from e
    if not isinstance(doc, dict):
        raise ReadError("safetensors header is not a JSON object", "CK106")
    start = offset + 8 + n
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ReadError("safetensors __metadata__ is not a map of strings", "CK106")
    entries = []
    for name, item in doc.items():
        try:
            dtype, shape, (b, end) = item["dtype"], item["shape"], item["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise ReadError(f"safetensors entry {name[:200]!r} lacks dtype / shape / data_offsets", "CK106") from exc
        ints = [*shape, b, end] if isinstance(shape, list) else None
        if not isinstance(dtype, str) or ints is None or any(type(x) is not int or x < 0 for x in ints) or b > end \
                or len(shape) > 64 or math.prod(shape) > (1 << 62):
            raise ReadError(f"safetensors entry {name[:200]!r} is malformed", "CK106")
        entries.append(Entry(name, dtype, tuple(shape), start + b, start + end))
    return Header(tuple(entries), meta, start)
