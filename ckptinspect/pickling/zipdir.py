"""Zip members as ANY zip reader could see them: the candidates a safety verdict must cover.

Python's `zipfile` and PyTorch's `PyTorchFileReader` (caffe2/serialize/inline_container.cc over miniz) can disagree
about which bytes are `data.pkl`:
- miniz matches member names case-insensitively (`mz_zip_reader_locate_file` without MZ_ZIP_FLAG_CASE_SENSITIVE):
  torch reads `archive/DATA.PKL` for `archive/data.pkl`, and of several matching members it takes the one its
  binary search over the (heap-sorted) directory lands on — measured with torch 2.13: the later of two duplicates;
- miniz takes the central directory offset of the end record literally, Python adds the bytes prepended before the
  archive (`concat`); a file can carry a second central directory for either reading;
- miniz does not compare the local header's name with the directory's, Python refuses a mismatch.
So `zip_members` returns every member of every central directory reachable from any end record in the archive's
tail, read both literally and shifted, and `member_bytes` reads a member from its local header without trusting
names. Callers walk every pickle candidate (`is_pickle_member`) and report the worst.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from dataclasses import dataclass
from typing import IO

END = b"PK\x05\x06"
END64_LOCATOR = b"PK\x06\x07"
END64 = b"PK\x06\x06"
CENTRAL = b"PK\x01\x02"
LOCAL = b"PK\x03\x04"
MAX_TAIL = 22 + 0xFFFF  # an end record sits in the last 64 KiB + 22 bytes (its comment is at most 65535 bytes)
MAX_DIRECTORY_BYTES = 256 << 20
MAX_ENTRIES = 200_000
MAX_END_RECORDS = 16


@dataclass(frozen=True, slots=True)
class ZipMember:
    """One central-directory entry. header: offset of its local header inside the archive (already shifted for the
    reading it comes from)."""

    name: str
    method: int
    compressed_size: int
    size: int
    header: int


def zip_members(f: IO[bytes], offset: int, length: int) -> tuple[list[ZipMember], str | None]:
    """Every member of the archive at [offset, offset+length) of `f`, under every reading (deduplicated), and why the
    directory could not be read when no member was found."""
    tail_len = min(length, MAX_TAIL)
    f.seek(offset + length - tail_len)
    tail = f.read(tail_len)
    # Both readers take the LAST end-record signature of the tail (zipfile `_EndRecData`, miniz
    # `mz_zip_reader_locate_header_sig`); a stricter reader takes one whose comment reaches the end of the file.
    # Signatures of archives stored inside this one are neither.
    ends: list[int] = []
    i = tail.rfind(END)
    while i >= 0 and len(ends) < MAX_END_RECORDS:
        comment = int.from_bytes(tail[i + 20 : i + 22], "little") if i + 22 <= len(tail) else -1
        if not ends or i + 22 + comment == len(tail):
            ends.append(length - tail_len + i)
        i = tail.rfind(END, 0, i)
    if not ends:
        return [], "no zip end record"
    members: dict[tuple[str, int, int], ZipMember] = {}
    why: str | None = None
    for at in ends:
        f.seek(offset + at)
        rec = f.read(22)
        if len(rec) < 22:
            continue
        count = int.from_bytes(rec[10:12], "little")
        cd_size = int.from_bytes(rec[12:16], "little")
        cd_offset = int.from_bytes(rec[16:20], "little")
        dir_end = at
        if at >= 20:
            f.seek(offset + at - 20)
            loc = f.read(20)
            if loc[:4] == END64_LOCATOR:
                z64 = int.from_bytes(loc[8:16], "little")
                for base in {z64, at - 20 - 56}:  # literal, and where it must be when bytes were prepended
                    if 0 <= base <= length - 56:
                        f.seek(offset + base)
                        r64 = f.read(56)
                        if r64[:4] == END64:
                            count = int.from_bytes(r64[32:40], "little")
                            cd_size = int.from_bytes(r64[40:48], "little")
                            cd_offset = int.from_bytes(r64[48:56], "little")
                            dir_end = base
                            break
        concat = dir_end - cd_size - cd_offset
        for shift in {0, concat} if concat > 0 else {0}:
            found, problem = _directory(f, offset, length, cd_offset + shift, cd_size, count, shift)
            why = why or problem
            for m in found:
                members.setdefault((m.name, m.header, m.compressed_size), m)
            if len(members) > MAX_ENTRIES:
                return list(members.values())[:MAX_ENTRIES], f"more than {MAX_ENTRIES} members"
    return list(members.values()), (None if members else why or "empty central directory")


def _directory(f: IO[bytes], offset: int, length: int, start: int, size: int, count: int,
               shift: int) -> tuple[list[ZipMember], str | None]:
    if start < 0 or size < 0 or start + size > length:
        return [], "central directory outside the archive"
    if size > MAX_DIRECTORY_BYTES:
        return [], f"central directory of {size} bytes (bound {MAX_DIRECTORY_BYTES})"
    f.seek(offset + start)
    data = f.read(size)
    out: list[ZipMember] = []
    pos = 0
    while pos + 46 <= len(data) and data[pos : pos + 4] == CENTRAL and len(out) < MAX_ENTRIES:
        flags = int.from_bytes(data[pos + 8 : pos + 10], "little")
        method = int.from_bytes(data[pos + 10 : pos + 12], "little")
        csize = int.from_bytes(data[pos + 20 : pos + 24], "little")
        usize = int.from_bytes(data[pos + 24 : pos + 28], "little")
        n = int.from_bytes(data[pos + 28 : pos + 30], "little")
        e = int.from_bytes(data[pos + 30 : pos + 32], "little")
        c = int.from_bytes(data[pos + 32 : pos + 34], "little")
        header = int.from_bytes(data[pos + 42 : pos + 46], "little")
        raw = data[pos + 46 : pos + 46 + n]
        extra = data[pos + 46 + n : pos + 46 + n + e]
        usize, csize, header = _zip64(extra, usize, csize, header)
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        out.append(ZipMember(name, method, csize, usize, header + shift))
        pos += 46 + n + e + c
    if not out and count:
        return [], "central directory unreadable"
    return out, None


def _zip64(extra: bytes, usize: int, csize: int, header: int) -> tuple[int, int, int]:
    """Sizes and offset from a zip64 extra field (0x0001), for the fields whose 32-bit value is 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag = int.from_bytes(extra[pos : pos + 2], "little")
        ln = int.from_bytes(extra[pos + 2 : pos + 4], "little")
        body = extra[pos + 4 : pos + 4 + ln]
        if tag == 1:
            vals = [int.from_bytes(body[i : i + 8], "little") for i in range(0, len(body) - 7, 8)]
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if header == 0xFFFFFFFF and vals:
                header = vals.pop(0)
        pos += 4 + ln
    return usize, csize, header


def is_torchscript_record(name: str) -> bool:
    """A member that makes `torch.load` hand the archive to `torch.jit.load` (which compiles and runs its code):
    torch/serialization.py `_is_torchscript_zip` is ``"constants.pkl" in zip_file.get_all_records()``, the member
    names without the archive's top directory (caffe2/serialize/inline_container.cc `getAllRecords`), compared
    exactly."""
    _, sep, record = name.partition("/")
    return bool(sep) and record == "constants.pkl"


def is_pickle_member(name: str) -> bool:
    """A member a reader may unpickle: `data.pkl` in any letter case (miniz), or any other `.pkl` member."""
    return name.lower().endswith(".pkl")


def data_offset(f: IO[bytes], offset: int, length: int, m: ZipMember) -> int | None:
    """Offset (inside the archive) of a member's bytes, after its local header; None when there is none."""
    if m.header < 0 or m.header + 30 > length:
        return None
    start = local_data_start(f, offset, m.header)
    return start if start is not None and start + m.compressed_size <= length else None


def local_data_start(f: IO[bytes], offset: int, header: int) -> int | None:
    """Offset (inside the archive at `offset` of `f`) where the member whose local header is at `header` starts:
    after the 30-byte header, the file name and the extra field. None when no local header is there. The one
    local-header parser (the scan's container walk and the torch archive reader both use it)."""
    try:
        f.seek(offset + header)
        head = f.read(30)
    except (OSError, ValueError):
        return None
    if len(head) < 30 or head[:4] != LOCAL:
        return None
    return header + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")


def member_bytes(f: IO[bytes], offset: int, length: int, m: ZipMember, bound: int) -> bytes | str:
    """At most `bound + 1` bytes of a member, decompressed (stored, deflate, bzip2, LZMA), or why it cannot be read.
    Corrupt compressed data is a reason, never an exception."""
    start = data_offset(f, offset, length, m)
    if start is None:
        return "no local header at the directory's offset, or data past the end"
    if m.method == 0:
        f.seek(offset + start)
        return f.read(min(m.compressed_size, bound + 1))
    if m.compressed_size > 4 * (bound + 1) + (1 << 20):
        return f"compressed member of {m.compressed_size} bytes"
    f.seek(offset + start)
    raw = f.read(m.compressed_size)
    try:
        if m.method == 8:
            return zlib.decompressobj(-15).decompress(raw, bound + 1)
        if m.method == 12:
            return bz2.BZ2Decompressor().decompress(raw, bound + 1)
        if m.method == 14:
            props_len = int.from_bytes(raw[2:4], "little")
            filt = lzma._decode_filter_properties(lzma.FILTER_LZMA1, raw[4 : 4 + props_len])  # type: ignore[attr-defined]
            dec = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[filt])
            return dec.decompress(raw[4 + props_len :], bound + 1)
    except (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError, MemoryError) as e:
        return f"corrupt compressed data ({type(e).__name__})"
    return f"unsupported compression method {m.method}"
