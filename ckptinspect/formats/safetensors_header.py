"""The header of a safetensors blob, parsed without the `safetensors` package and without reading tensor bytes.

Kept minimal on purpose, for what DCP's readers need (torch 2.13 `hf_storage.py` / `_hf_utils.py`, the Hugging Face
storage writer's files and `FileSystemWriter(serialization_format=SAFETENSORS)` `.distcp` blobs): the 8-byte
little-endian header length, the JSON header (`dtype`, `shape`, `data_offsets` per tensor, the `__metadata__`
string map), the offset the data starts at. The release-artifact reader (`formats/safetensors.py`: index files,
sharded sets, dtype and span checks) builds on `read_header` too: a refusal is a `HeaderError` whose `kind` says
which part (DCP's readers report every kind as CK106, the release-artifact reader each as its own code).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

from ckptinspect.errors import ReadError
from ckptinspect.model import DTYPE_SIZES

MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers (`MAX_HEADER_SIZE`)
SUFFIX = ".safetensors"
INDEX = "model.safetensors.index.json"  # transformers' `SAFE_WEIGHTS_INDEX_NAME`
# safetensors dtype codes -> the model's dtype names (`model.DTYPE_SIZES`)
DTYPES: Mapping[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}
# bits per element of every dtype safetensors 0.8.0 knows (`Dtype::bitsize`): the sub-byte F4 / F6 codes pack
# elements across bytes, so a span is numel × bits / 8 bytes (a whole number, or the library refuses the file)
DTYPE_BITS: Mapping[str, int] = {
    **{code: 8 * DTYPE_SIZES[name] for code, name in DTYPES.items()}, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


class HeaderError(ReadError):
    """A header the safetensors library would refuse. `kind`: which part — `length` (the 8-byte length: past the
    data or over `MAX_HEADER_BYTES`, or no 8 bytes at all), `json` (not UTF-8 JSON, or not an object), `nesting`
    (JSON nested deeper than the parser's recursion bound), `entry` (a tensor entry or `__metadata__` of the wrong
    shape). Raised with code CK106, what DCP's readers report; the release-artifact reader maps `kind` to its own."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message, "CK106")
        self.kind = kind


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
        raise HeaderError(f"{len(head)} bytes, shorter than a safetensors header length (8 bytes)", "length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or n > available - 8:
        raise HeaderError(f"safetensors header length {n} exceeds the data ({available - 8} bytes) or the "
                          f"{MAX_HEADER_BYTES}-byte bound", "length")
    raw = f.read(n)
    if len(raw) < n:  # the file shrank since its size was taken
        raise HeaderError(f"safetensors header length {n}: only {len(raw)} bytes follow", "length")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except RecursionError as e:
        raise HeaderError(f"safetensors header JSON is nested too deeply to parse within bounds ({n} bytes)",
                          "nesting") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise HeaderError(f"safetensors header is not JSON: {e}", "json") from e
    if not isinstance(doc, dict):
        raise HeaderError(f"safetensors header is JSON but not an object (a {type(doc).__name__})", "json")
    start = offset + 8 + n
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise HeaderError("safetensors __metadata__ is not a map of strings", "entry")
    entries = []
    for name, item in doc.items():
        try:
            dtype, shape, (b, end) = item["dtype"], item["shape"], item["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise HeaderError(f"safetensors entry {name[:200]!r} lacks dtype / shape / data_offsets", "entry") from exc
        ints = [*shape, b, end] if isinstance(shape, list) else None
        if not isinstance(dtype, str) or ints is None or any(type(x) is not int or x < 0 for x in ints) or b > end \
                or max(shape, default=0) > (1 << 62) or end > (1 << 62) or len(shape) > 64 \
                or math.prod(shape) > (1 << 62):  # each number fits the chunk table's int64 columns
            raise HeaderError(f"safetensors entry {name[:200]!r} is malformed", "entry")
        entries.append(Entry(name, dtype, tuple(shape), start + b, start + end))
    return Header(tuple(entries), meta, start)
