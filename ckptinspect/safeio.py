"""Opening checkpoint files safely: never block on a FIFO or device, never read an unbounded amount of text.

Every reader opens files through `open_regular`: the open itself is non-blocking (a FIFO in place of `.metadata`
would otherwise hang the tool forever), and anything that is not a regular file is refused with an `OSError`.
An object-storage path (`storage.objpath.ObjectPath`) opens as a ranged reader of the object instead; its errors
are `OSError`s too, so the readers report them like local ones.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Sequence
from typing import IO, Any, BinaryIO, cast

from ckptinspect.storage.objpath import ObjectPath


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory: nothing a checkpoint file can be."""


Window = tuple[int, int] | Sequence[tuple[int, int]]


def open_regular(path: str | os.PathLike[str], buffering: int = -1, window: Window | None = None,
                 whole: bool = False) -> BinaryIO:
    """Open a regular file for binary reading (symlinks followed); the one safe open of the package.

    Raises `NotRegularFile` (an `OSError`) for anything but a regular file, `OSError` when it cannot be opened.
    `buffering=0` gives the raw file (for `readinto` loops that bring their own buffer).
    `window`: the (offset, length) range(s) the caller will read (stored items); an object-storage reader
    coalesces them and never prefetches past them. Local files ignore it. `whole`: the caller reads the whole
    file from the start (an object is then fetched in the largest blocks from the first read).
    """
    if isinstance(path, ObjectPath):
        return cast(BinaryIO, path.open_reader(window, whole))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def file_size(f: IO[bytes]) -> int:
    """Size of an open file: `fstat` for a local one, the listed size for an object (seek to the end)."""
    try:
        return os.fstat(f.fileno()).st_size
    except io.UnsupportedOperation:
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
        return end


def file_identity(f: IO[bytes]) -> tuple[int, int] | str:
    """What makes two open files the same file: (device, inode) locally, the URL for an object."""
    try:
        st = os.fstat(f.fileno())
    except io.UnsupportedOperation:
        return str(getattr(f, "name", id(f)))
    return st.st_dev, st.st_ino


def read_small(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a small regular file; `OSError` (EFBIG) when it holds more than `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


class FileSlice(io.RawIOBase):
    """A read-only, seekable window [offset, offset+length) of a file: one stored item inside a `.distcp`."""

    def __init__(self, f: IO[bytes], offset: int, length: int) -> None:
        self._f = f
        self._start = offset
        self._len = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            new = pos
        elif whence == os.SEEK_CUR:
            new = self._pos + pos
        else:
            new = self._len + pos
        self._pos = max(0, min(new, self._len))
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._len - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        buf[: len(data)] = data
        self._pos += len(data)
        return len(data)


def leaves_dir(name: str) -> bool:
    """Whether a stored item's `relative_path` points outside its checkpoint dir (absolute, or through `..`): DCP's
    FileSystemReader opens `path / relative_path` whatever it is (torch 2.13 `filesystem.py` `read_data`)."""
    norm = name.replace("\\", "/")
    return norm.startswith("/") or ".." in norm.split("/")
