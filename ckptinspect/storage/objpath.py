"""`ObjectPath`: an object-storage location that the readers use as a `pathlib.Path`, and its ranged reader.

The readers ask a checkpoint dir the questions of a local disk (`exists`, `is_file`, `is_dir`, `iterdir`, `/`,
`name`, `parent`) and open files through `formats._io.open_regular`. An `ObjectPath` answers the questions from one
cached listing per prefix (sizes and ETags included), and opens objects as an `ObjectReader`: a seekable, read-only
file whose reads are ranged GETs, never past the window asked for (one stored item inside a ``.distcp``), coalesced
into growing blocks for sequential reads (a ``.metadata`` pickle) and fetched whole when small (``common.pt``).

The location is encoded in the path itself (``/<scheme>:<authority>/<key>``) so that every path pathlib derives
(``p / "x"``, ``p.parent``) on Python 3.10-3.13 is again an `ObjectPath` of the same store, with no state to carry.
`str()` gives the URL. Using one as a local path (`os.fspath`) is a bug, and raises `TypeError` rather than
silently reading a local file of that name.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator, Iterator
from pathlib import PosixPath
from typing import Any

from ckptinspect.storage.backend import ObjectInfo, ObjectMissing
from ckptinspect.storage.session import Store, session
from ckptinspect.storage.url import Scheme

WHOLE_OBJECT_BYTES = 8 << 20  # objects (or windows) up to this size are fetched with one GET on first read
FIRST_BLOCK = 1 << 20  # a large object's first read fetches this much; each sequential read ×4 ...
MAX_BLOCK = 32 << 20  # ... up to this block: memory stays bounded whatever the object size
RANDOM_BLOCK = 256 << 10  # a read after a seek elsewhere fetches at least this much


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
        return Scheme(scheme), authority, "/".join(parts[2:])

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

    def open_reader(self, window: tuple[int, int] | None = None) -> ObjectReader:
        """A seekable reader of the whole object; `window` (offset, length) bounds what reads may prefetch."""
        info = self.object_info()
        if info is None:
            raise ObjectMissing(f"{self.url}: no such object", self.key)
        lo, hi = (0, info.size) if window is None else (max(0, window[0]), max(0, window[0] + window[1]))
        return ObjectReader(self.store, self.key, info, lo, min(hi, info.size))


class ObjectReader(io.RawIOBase):
    """Read-only, seekable file over one object; reads are ranged GETs checked against the listing (size, ETag).

    Positions are object offsets, `size` the listed size. Reads inside the window [lo, hi) are coalesced into
    blocks that never cross the window's end (a stored item's bytes, not the tensor data after it); a read
    outside the window fetches exactly what it asks for.
    """

    def __init__(self, store: Store, key: str, info: ObjectInfo, lo: int, hi: int) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._info = info
        self._lo, self._hi = lo, max(lo, hi)
        self.size = info.size
        self._pos = 0
        self._buf = b""
        self._buf_at = 0  # object offset of _buf[0]
        self._block = FIRST_BLOCK
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
        if not (self._lo <= pos < self._hi):
            return pos, end
        if self._hi - self._lo <= WHOLE_OBJECT_BYTES:
            return self._lo, max(self._hi, end)
        if self._buf and pos == self._buf_at + len(self._buf):
            self._block = min(MAX_BLOCK, self._block * 4)
        elif self._buf:
            self._block = RANDOM_BLOCK
        return pos, max(end, min(self._hi, pos + self._block))

    def _fill(self, want: int) -> None:
        if self._buf_at <= self._pos and self._pos + want <= self._buf_at + len(self._buf):
            return
        lo, hi = self._range(want)
        keep = b""
        if self._buf_at <= lo < self._buf_at + len(self._buf):  # reuse the buffered head of the new range
            keep = self._buf[lo - self._buf_at:hi - self._buf_at]
        data = self._store.read(self._key, lo + len(keep), hi, self._info) if lo + len(keep) < hi else b""
        self._buf, self._buf_at = keep + data, lo

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

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)
