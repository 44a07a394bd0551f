"""Pre-1.6 `torch.save` tar files, read without torch and never extracted: every pickle the loader would unpickle.

`torch.load` still takes them: torch/serialization.py (torch 2.13) `_legacy_load`'s inner `legacy_load`, for a real
file read from offset 0, opens ``tarfile.open(fileobj=f, mode="r:", format=PAX_FORMAT)`` and unpickles, with the plain
unpickler (``weights_only=True`` refuses the format, so only ``weights_only=False`` gets here):
- member ``storages``: a pickle (their count), then per storage a pickle ``(key, location, storage_type)`` followed
  by an int64 element count and that many elements of the storage type's size, then a pickle of the views;
- member ``tensors``: a pickle (their count), then per tensor a pickle ``(key, storage_id, type)`` followed by an
  int32 ndim, 4 padding bytes, ndim int64 sizes, ndim int64 strides and an int64 storage offset;
- member ``pickle``: the object (persistent ids: the keys above).
`tar_walks` reads the members with Python's `tarfile` (the reader torch uses, so the same member names and headers)
through `extractfile` (a view of the archive's bytes: nothing is written to disk), follows that layout and walks
every pickle; the count and element-size values it needs are read with the allowlisting unpickler once the walk
found the pickle inert. Bounded: member headers, records per member, the size of each header pickle.
"""

from __future__ import annotations

import io
import tarfile
from typing import IO, Any

from ckptinspect.model import dtype_size
from ckptinspect.pickling.candidates import Walked, blob_walks
from ckptinspect.pickling.engine import walk_segment
from ckptinspect.pickling.unpickle import PREWALK_MAX_BYTES, load_pickle
from ckptinspect.pickling.report import PickleReport
from ckptinspect.pickling.walk import MAX_OPS, MAX_STACK, PickleWalk, is_pickle_start, walk_pickle, walk_stream
from ckptinspect.pickling.walkstate import Source, Stop
from ckptinspect.io.local import FileSlice

MEMBERS = ("storages", "tensors", "pickle")  # what `legacy_load` reads, in its order
MAX_TAR_MEMBERS = 10_000  # member headers read (torch's tar files have four members)
MAX_RECORDS = 10_000_000  # storages or tensors listed in one member
MAX_HEADER_PICKLE = 1 << 20  # a count / per-record pickle, read to learn the layout
MAX_NDIM = 64
TAR_HEAD_WALK = 1 << 20  # bytes of a tar file also walked as a pickle when it starts like one (torch's fallback)


def tar_walks(f: IO[bytes], offset: int, length: int) -> tuple[list[Walked], str | None] | None:
    """(the pickles walked, why the archive could not be read through) for a tar file at [offset, +length) of `f`;
    None when `tarfile` does not open it (not a tar: `torch.load` then reads the file as a pickle stream)."""
    view = io.BufferedReader(FileSlice(f, offset, length))
    try:
        tar = tarfile.open(fileobj=view, mode="r:", format=tarfile.PAX_FORMAT)
    except Exception:  # noqa: BLE001 - whatever tarfile refuses is no tar to torch either
        return None
    out: list[Walked] = []
    problem: str | None = None
    members: list[tarfile.TarInfo] = []
    with tar:
        try:
            while True:
                if len(members) >= MAX_TAR_MEMBERS:
                    out.append(Walked("tar", None, length, f"more than {MAX_TAR_MEMBERS} members", limit=True))
                    break
                info = tar.next()
                if info is None:
                    break
                members.append(info)
        except Exception as e:  # noqa: BLE001 - a truncated or malformed header ends the listing; torch fails there
            problem = f"tar archive unreadable after {len(members)} member(s): {_short(e)}"
        # Of duplicate names torch's `getmember` takes the last; every one is walked.
        for info in members:
            if info.name not in MEMBERS:
                continue
            if not info.isreg():
                out.append(Walked(info.name, None, info.size, f"a {_kind(info)} member, not a regular file"))
                continue
            if info.offset_data + info.size > length:
                out.append(Walked(info.name, None, info.size, f"member data [{info.offset_data}, "
                                  f"+{info.size}) past the end of the archive ({length} bytes)"))
                continue
            member = tar.extractfile(info)
            if member is None:
                continue
            with member:
                if info.name == "pickle":
                    out.extend(_main_pickle(member, info.size))
                else:
                    out.extend(_records(member, info.name, info.size))
    view.seek(0)
    head = view.read(2)
    if is_pickle_start(head):
        # A header that is also a pickle: when the listing above fails (a TarError), `_legacy_load` falls back to
        # unpickling the file from its first byte. Reported when it would run something.
        view.seek(0)
        n = min(length, TAR_HEAD_WALK)
        walk = walk_stream(view, n)
        if walk.unsafe:
            out.append(Walked("tar header as a pickle", walk, n))
    return out, problem


def _main_pickle(member: IO[bytes], size: int) -> list[Walked]:
    if size <= PREWALK_MAX_BYTES:
        data = member.read(size)
        walk = walk_pickle(data)
        return [Walked("pickle", walk, len(data)), *blob_walks(data, walk, "pickle", 1)]
    return [Walked("pickle", walk_stream(member, size), size)]


def _records(member: IO[bytes], name: str, size: int) -> list[Walked]:
    """The pickles of `storages` / `tensors`, in `legacy_load`'s order, up to the first one that is not inert or
    whose value does not give the layout (then the rest cannot be followed; that is reported)."""
    out: list[Walked] = []
    pos = 0

    def header(what: str) -> tuple[Any, bool]:
        nonlocal pos
        walk, end = _walk_one(member, pos, size)
        out.append(Walked(f"{name}@{pos}", walk, (end or size) - pos))
        if end is None or walk.unsafe or not walk.complete:
            return None, False
        if end - pos > MAX_HEADER_PICKLE:
            out.append(Walked(f"{name}@{pos}", None, end - pos, f"{what} pickle of {end - pos} bytes", limit=True))
            return None, False
        member.seek(pos)
        data = member.read(end - pos)
        pos = end
        try:
            return load_pickle(data, PickleReport(), prewalked=True), True
        except Exception as e:  # noqa: BLE001 - an inert pickle that does not load: the layout ends here
            out.append(Walked(f"{name}@{end}", None, 0, f"{what} unreadable: {_short(e)}"))
            return None, False

    count, ok = header("record count")
    if not ok:
        return out
    if type(count) is not int or not 0 <= count <= MAX_RECORDS:
        out.append(Walked(f"{name}@{pos}", None, 0, f"record count {count!r} is not an int in [0, {MAX_RECORDS}]",
                          limit=isinstance(count, int)))
        return out
    for _ in range(count):
        args, ok = header("record")
        if not ok:
            return out
        skip = _payload(member, name, args, pos)
        if isinstance(skip, str):
            out.append(Walked(f"{name}@{pos}", None, 0, skip))
            return out
        pos += skip
        if pos > size:
            out.append(Walked(f"{name}@{pos}", None, 0, f"record data past the end of the member ({size} bytes)"))
            return out
    if name == "storages":
        header("storage views")
    return out


def _payload(member: IO[bytes], name: str, args: Any, pos: int) -> int | str:
    """Bytes after a record's pickle: a storage's count and elements, a tensor's ndim, sizes, strides, offset."""
    if not isinstance(args, tuple) or len(args) != 3:
        return f"record {args!r:.80} is not a 3-tuple"
    member.seek(pos)
    if name == "storages":
        elem = dtype_size(str(args[2])) if isinstance(args[2], str) else None
        if elem is None:
            return f"storage type {args[2]!r:.80} of unknown element size"
        raw = member.read(8)
        if len(raw) < 8:
            return "storage element count truncated"
        n = int.from_bytes(raw, "little", signed=True)
        return 8 + n * elem if n >= 0 else f"negative storage element count {n}"
    raw = member.read(8)
    if len(raw) < 8:
        return "tensor ndim truncated"
    ndim = int.from_bytes(raw[:4], "little", signed=True)
    if not 0 <= ndim <= MAX_NDIM:
        return f"tensor ndim {ndim} outside [0, {MAX_NDIM}]"
    return 8 + 16 * ndim + 8


def _walk_one(member: IO[bytes], pos: int, size: int) -> tuple[PickleWalk, int | None]:
    """Walk the one pickle at `pos` of the member (as `pickle.load(f)` reads one); (walk, offset after its STOP)."""
    walk = PickleWalk()
    member.seek(pos)
    src = Source(None, member, size - pos)
    walk.segments = 1
    try:
        end = walk_segment(src, 0, walk, MAX_OPS, MAX_STACK)
    except Stop as stop:
        if stop.limit:
            walk.limit = str(stop)
        else:
            walk.error = str(stop)
        walk.error_offset = pos + stop.offset
        return walk, None
    if walk.max_memo_index > walk.ops:
        walk.limit = f"memo index {walk.max_memo_index} is beyond anything {walk.ops} opcodes can have memoized"
    return walk, pos + src.base + end


def _kind(info: tarfile.TarInfo) -> str:
    return "link" if info.issym() or info.islnk() else "directory" if info.isdir() else "special"


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 200 else text[:200] + "..."

