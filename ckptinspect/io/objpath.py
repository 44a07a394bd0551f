"""`ObjectPath`: an object-storage location that the readers use as a `pathlib.Path`, and its ranged reader.

The readers ask a checkpoint dir the questions of a local disk (`exists`, `is_file`, `is_dir`, `iterdir`, `/`,
`name`, `parent`) and open files through `io.local.open_regular`. An `ObjectPath` answers the questions from one
cached listing per prefix (sizes and ETags included), and opens objects as an `ObjectReader`: a seekable, read-only
file whose reads are ranged GETs, never past the window asked for (one stored item inside a ``.distcp``), coalesced
into growing blocks for sequential reads (a ``.metadata`` pickle) and fetched whole when small (``common.pt``).

The location is encoded in the path itself (``/<scheme>:<authority>/<key>``) so that every path pathlib derives
(``p / "x"``, ``p.parent``) on Python 3.10-3.13 is again an `ObjectPath` of the same store, with no state to carry.
`str()` gives the URL. Using one as a local path (`os.fspath`) is a bug, and raises `TypeError` rather than
silently reading a local file of that name.
"""

from __future__ import annotations

import bisect
import io
import os
from collections.abc import Generator, Iterator, Sequence
from pathlib import PosixPath
from typing import Any

from ckptinspect.io.backend import ObjectInfo, ObjectMissing
from ckptinspect.io.session import Store, session
from ckptinspect.io.url import Scheme

WHOLE_OBJECT_BYTES = 8 << 20  # objects (or windows) up to this size are fetched with one GET on first read
FIRST_BLOCK = 1 << 20  # a large object's first read fetches this much; each sequential read ×4 ...
MAX_BLOCK = 32 << 20  # ... up to this block: memory stays bounded whatever the object size
RANDOM_BLOCK = 256 << 10  # a read after a seek elsewhere fetches at least this much
KEEP_BYTES = 512 << 20  # blocks of one open object kept for re-reads (the walk-then-load of a .metadata), at most
COALESCE_GAP = 64 << 10  # windows this close are read with one GET (the gap's bytes cost less than a request)


class ObjectPath(PosixPath):
    """A key in a bucket / container / MSC profile, as a `Path`."""

    @classmethod
    def of(cls, scheme: Scheme, authority: str, key: str) -> ObjectPath:
        return cls("/", f"{scheme.value}:{authority}", *[s for s in key.split("/") if s])

    @property
    def _loc(self) -> tuple[Scheme, str, str]:
        parts = self.parts
        if len(parts) < 2 or ":" not in parts[1]:
            raise TypeError(f"{PosixPath.__str__(self)} is not an object-storage path")
        scheme, _, authority = parts[1].partition(":")
        return Scheme(scheme), authority, _lexical_key(parts[2:])

    @property
    def store(self) -> Store:
        scheme, authority, _ = self._loc
        return session().store(scheme, authority)

    @property
    def key(self) -> str:
        return self._loc[2]

    @property
    def url(self) -> str:
        scheme, authority, key = self._loc
        return f"{scheme.value}://{authority}/{key}" if key else f"{scheme.value}://{authority}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self.url} is an object-storage location, not a local path")

    # --- the Path questions the readers ask -------------------------------------------------------------------

    def object_info(self) -> ObjectInfo | None:
        return self.store.info(self.key) if self.key else None

    def last_modified(self) -> float | None:
        """The object's last-modified time (POSIX seconds, the server's clock) when the listing gave one; None for
        a prefix or a backend without times."""
        info = self.object_info()
        return info.mtime if info is not None else None

    def exists(self, *, follow_symlinks: bool = True) -> bool:
        return self.is_dir() or self.object_info() is not None

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self.object_info() is not None

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self.store.is_dir(self.key)

    def is_symlink(self) -> bool:
        return False

    def iterdir(self) -> Generator[ObjectPath, None, None]:
        listing = self.store.listing(self.key)
        for name in sorted(set(listing.files) | listing.dirs):
            yield self / name

    def resolve(self, strict: bool = False) -> ObjectPath:
        return self

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        raise TypeError(f"{self.url}: stat() of an object; use object_info()")

    def walk_files(self, recursive: bool, max_depth: int = 8) -> Iterator[tuple[str, int]]:
        """(relative name, size) of the objects under this prefix (sub-prefixes only when `recursive`)."""
        yield from self._walk("", recursive, 0, max_depth)

    def _walk(self, rel: str, recursive: bool, depth: int, max_depth: int) -> Iterator[tuple[str, int]]:
        key = f"{self.key}/{rel}" if rel else self.key
        listing = self.store.listing(key.strip("/"))
        for name, info in listing.files.items():
            yield (f"{rel}/{name}" if rel else name), info.size
        if recursive and depth < max_depth:
            for d in sorted(listing.dirs):
                yield from self._walk(f"{rel}/{d}" if rel else d, recursive, depth + 1, max_depth)

    def open_reader(self, window: Sequence[tuple[int, int]] | tuple[int, int] | None = None,
                    whole: bool = False, keep: bool = True) -> ObjectReader:
        """A seekable reader of the whole object. `window`: the (offset, length) range(s) the caller will read;
        reads inside them are coalesced and never prefetch past them (None: the whole object is one window).
        `whole`: the caller reads all of it from the start (a `.metadata`), so blocks are `MAX_BLOCK` from the
        first read on (a 95 MB `.metadata` in 3 GETs, not 6 growing ones). `keep`: blocks are kept for a second
        pass (up to `KEEP_BYTES`); a single pass (hashing) keeps none, so it holds one block at a time."""
        info = self.object_info()
        if info is None:
            raise ObjectMissing(f"{self.url}: no such object", self.key)
        if window is None:
            ranges = [(0, info.size)]
        elif isinstance(window, tuple) and len(window) == 2 and isinstance(window[0], int):
            ranges = [(window[0], window[0] + window[1])]
        else:
            ranges = [(int(o), int(o) + int(n)) for o, n in window]
        first = MAX_BLOCK if whole else FIRST_BLOCK
        return ObjectReader(self.store, self.key, info, coalesce(ranges, info.size), first,
                            KEEP_BYTES if keep else 0)


def _lexical_key(segments: Sequence[str]) -> str:
    """The key `segments` name, with ``..`` resolved lexically as a local disk resolves it in a real dir: a DCP
    `relative_path` of ``../outside/x`` names ``outside/x`` next to the checkpoint prefix, not a key with a literal
    ``..`` segment; above the bucket / profile root it stays at the root, like ``/..`` on a disk."""
    if ".." not in segments:
        return "/".join(segments)
    out: list[str] = []
    for seg in segments:
        if seg == "..":
            if out:
                out.pop()
        else:
            out.append(seg)
    return "/".join(out)


def coalesce(ranges: Sequence[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Sorted, clipped [lo, hi) ranges, neighbours closer than `COALESCE_GAP` merged (one GET instead of two, at
    the price of the gap's bytes) while a merged range stays within `MAX_BLOCK`."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((max(0, lo), min(size, hi)) for lo, hi in ranges):
        if hi <= lo:
            continue
        if out and lo - out[-1][1] <= COALESCE_GAP and max(hi, out[-1][1]) - out[-1][0] <= MAX_BLOCK:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        elif out and lo < out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


class ObjectReader(io.RawIOBase):
    """Read-only, seekable file over one object; reads are ranged GETs checked against the listing (size, ETag).

    Reads return what was asked for (like a buffered file; `peek` and `readline` work from the buffer), so callers
    use it directly: a `BufferedReader` on top would ask for a whole buffer past the window's end.

    Positions are object offsets, `size` the listed size. A read inside one of the windows is served by one GET of
    the whole window when it is small, else by blocks that grow on sequential reads and never cross the window's
    end (a stored item's bytes, not the tensor data after it). A read outside every window fetches exactly what it
    asks for.
    """

    def __init__(self, store: Store, key: str, info: ObjectInfo, windows: list[tuple[int, int]],
                 first_block: int = FIRST_BLOCK, keep_bytes: int = KEEP_BYTES) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._info = info
        self._windows = windows
        self._starts = [w[0] for w in windows]
        self.size = info.size
        self._pos = 0
        self._buf = b""
        self._buf_at = 0  # object offset of _buf[0]
        self._block = first_block
        self._kept: list[tuple[int, bytes]] = []
        self._kept_bytes = 0
        self._keep_max = keep_bytes
        self.name = store.url(key)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def _range(self, want: int) -> tuple[int, int]:
        """The object range to fetch so that [pos, pos+want) is buffered."""
        pos, end = self._pos, min(self.size, self._pos + want)
        i = bisect.bisect_right(self._starts, pos) - 1
        if i < 0 or pos >= self._windows[i][1]:
            return pos, end
        lo, hi = self._windows[i]
        if hi - lo <= WHOLE_OBJECT_BYTES:
            return lo, hi
        if self._buf and pos == self._buf_at + len(self._buf):
            self._block = min(MAX_BLOCK, self._block * 4)
        elif self._buf:
            self._block = RANDOM_BLOCK
        return pos, min(hi, max(end, pos + self._block))

    def _fill(self, want: int) -> None:
        if self._buf_at <= self._pos and self._pos + want <= self._buf_at + len(self._buf):
            return
        for at, block in self._kept:  # a second pass (the pickle walk, then the load) costs no second transfer
            if at <= self._pos < at + len(block):
                self._buf, self._buf_at = block, at
                return
        lo, hi = self._range(want)
        keep = b""
        if self._buf_at <= lo < self._buf_at + len(self._buf):  # reuse the buffered head of the new range
            keep = self._buf[lo - self._buf_at:hi - self._buf_at]
        data = self._store.read(self._key, lo + len(keep), hi, self._info) if lo + len(keep) < hi else b""
        self._buf, self._buf_at = keep + data, lo
        if data and self._kept_bytes + len(data) <= self._keep_max:
            self._kept.append((lo + len(keep), data))
            self._kept_bytes += len(data)

    def read(self, size: int | None = -1) -> bytes:
        if self._pos >= self.size:
            return b""
        n = self.size - self._pos if size is None or size < 0 else min(size, self.size - self._pos)
        out = bytearray()
        while n > 0:
            self._fill(min(n, MAX_BLOCK))
            off = self._pos - self._buf_at
            chunk = self._buf[off:off + n]
            if not chunk:
                break
            out += chunk
            self._pos += len(chunk)
            n -= len(chunk)
        return bytes(out)

    def peek(self, size: int = 0) -> bytes:
        """The buffered bytes from the current position (at least one unless at the end), without moving."""
        if self._pos >= self.size:
            return b""
        self._fill(max(1, size))
        return self._buf[self._pos - self._buf_at:]

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)
