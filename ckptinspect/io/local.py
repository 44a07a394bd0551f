"""Opening checkpoint files safely: never block on a FIFO or device, never read an unbounded amount of text; and
the record of what could not be read for access reasons.

Every reader opens files through `open_regular`: the open itself is non-blocking (a FIFO in place of `.metadata`
would otherwise hang the tool forever), and anything that is not a regular file is refused with an `OSError`.
An object-storage path (`storage.objpath.ObjectPath`) opens as a ranged reader of the object instead; its errors
are `OSError`s too, so the readers report them like local ones.

Unread files (docs/contract.md CK209): a local file or dir that exists but cannot be opened, listed or entered for
lack of permission, or for an I/O error, is noted here by the function that met it (`open_regular`, `probe_dir`,
`probe_readable`, the listing helpers of `formats/files.py`) — whatever the caller then does with the error, a
silent skip included. `storage.findings.storage_findings` turns the notes under a checkpoint into CK209 findings
(status `incomplete`: the verdict on those bytes is missing), so no reader or check has to remember to. Notes live
inside `unread_scope()` (opened by every command's library function); the outermost scope forgets them at exit.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, cast

from ckptinspect.errors import UsageError, access_failure

from ckptinspect.io.objpath import ObjectPath


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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        note_unread(path, e, "open")
        raise
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


# --- unread files: permission denied, I/O errors ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unread:
    """One local path that exists but could not be read.

    path: absolute, normalised (no symlink resolution: the path the reader used).
    op: "open" (a file), "list" (a dir's entries), "enter" (a dir's children: no search permission).
    errno: the error number (EACCES, EPERM, EIO).
    """

    path: str
    op: str
    errno: int

    @property
    def reason(self) -> str:
        return _REASONS.get(self.errno, os.strerror(self.errno).lower())

    @property
    def what(self) -> str:
        return {"open": "cannot open it for reading", "list": "cannot list its entries",
                "enter": "cannot reach the files inside it"}.get(self.op, self.op)


_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted", errno.EIO: "I/O error"}


class _UnreadLog:
    """The notes of the running command (a process-wide record: hashing threads note into it too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.notes: dict[str, Unread] = {}
        self.taken: dict[str, Unread] = {}  # reported already in this command: met again later, not noted again
        self.depth = 0


_LOG = _UnreadLog()


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.abspath(os.fspath(path)))


def note_unread(path: str | os.PathLike[str], e: BaseException, op: str) -> Unread | None:
    """Record that `path` could not be read (`op`), when `e` is an access failure (anything else is not noted), and
    return the note (also when this command reported the path already, so it is not recorded twice)."""
    if isinstance(path, ObjectPath) or not access_failure(e):
        return None
    key = _key(path)
    note = Unread(key, op, cast(OSError, e).errno or errno.EACCES)
    with _LOG.lock:
        if key not in _LOG.taken:
            return _LOG.notes.setdefault(key, note)
    return note



def note_failed_open(e: OSError, fallback: str | os.PathLike[str]) -> None:
    """A reader met an access failure `e` where it did not expect one: note the path it names (`fallback` when it
    names none) as unopened, unless the dir above it cannot be listed or entered (then that dir is noted by the
    probe: it is what failed)."""
    where = e.filename if isinstance(e.filename, str) else os.fspath(fallback)
    if probe_dir(os.path.dirname(where) or ".") is None:
        note_unread(where, e, "open")

@contextmanager
def unread_scope() -> Iterator[None]:
    """The extent of one command: notes taken inside it are there for `take_unread`; the outermost scope starts
    and ends with none (so a long-lived process never reports a note of an earlier command)."""
    with _LOG.lock:
        if _LOG.depth == 0:
            _LOG.notes.clear()
            _LOG.taken.clear()
        _LOG.depth += 1
    try:
        yield
    finally:
        with _LOG.lock:
            _LOG.depth -= 1
            if _LOG.depth == 0:
                _LOG.notes.clear()
                _LOG.taken.clear()


def take_unread(root: str | os.PathLike[str]) -> list[Unread]:
    """The notes at or under `root`, removed from the record, sorted by path. Each path is reported once per
    command: one taken is not noted again when a later check meets it too (the open of a data file the reader
    could not read, retried by the safety scan)."""
    if isinstance(root, ObjectPath):
        return []
    top = _key(root)
    with _LOG.lock:
        mine = sorted(k for k in _LOG.notes if k == top or k.startswith(top.rstrip(os.sep) + os.sep))
        out = [_LOG.notes.pop(k) for k in mine]
        _LOG.taken.update((n.path, n) for n in out)
        return out


def probe_dir(path: str | os.PathLike[str]) -> Unread | None:
    """Whether the local dir `path` can be listed and entered (the two things a reader does with a checkpoint dir);
    the failure, noted, when not. A path that is not a dir, or does not exist, is not this function's business."""
    if isinstance(path, ObjectPath):
        return None
    try:
        with os.scandir(path):
            pass
    except (NotADirectoryError, FileNotFoundError):
        return None
    except OSError as e:
        return note_unread(path, e, "list")
    try:
        os.stat(os.path.join(path, "."))  # "dir/." is looked up inside dir: that needs search (x) permission
    except OSError as e:
        return note_unread(path, e, "enter")
    return None


def probe_readable(path: str | os.PathLike[str]) -> bool:
    """Whether the local file `path` can be opened for reading (opened and closed, nothing read); a failure for
    access is noted. True for anything else (missing, not a regular file: other checks report those), and objects."""
    return isinstance(path, ObjectPath) or _open_probe(path) is None


def _open_probe(path: str | os.PathLike[str]) -> Unread | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return note_unread(path, e, "open")
    os.close(fd)
    return None


def noted(path: str | os.PathLike[str]) -> Unread | None:
    """The note on exactly `path` (left in the record, or reported already in this command), or None (always for an
    object): whether this command found `path` unreadable."""
    if isinstance(path, ObjectPath):
        return None
    key = _key(path)
    with _LOG.lock:
        return _LOG.notes.get(key) or _LOG.taken.get(key)


def forget(path: str | os.PathLike[str]) -> None:
    """Drop the note on exactly `path` (its caller reported it another way)."""
    if isinstance(path, ObjectPath):
        return
    with _LOG.lock:
        _LOG.notes.pop(_key(path), None)


def entry_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the PATH a user named cannot be read at all, as the end of an error message ("permission denied (cannot
    list its entries)"), or None: readable, or not there (the caller says "no such file or directory"). A dir must
    be listable and enterable, a file openable."""
    if isinstance(path, ObjectPath):
        return None
    try:
        st = os.stat(path)
    except OSError as e:
        if not access_failure(e):
            return None
        return f"{_REASONS.get(e.errno or 0, 'permission denied')} (a directory above it cannot be entered)"
    if stat.S_ISDIR(st.st_mode):
        found = probe_dir(path)
    elif stat.S_ISREG(st.st_mode):
        found = _open_probe(path)
    else:
        return None
    if found is None:
        return None
    forget(path)
    return f"{found.reason} ({found.what})"


def require_path(path: str | os.PathLike[str], label: str) -> None:
    """The check every command makes on the PATH it was given: `UsageError` (exit 2) naming it when it does not
    exist or cannot be read at all ("run/: permission denied (cannot list its entries)"). Anything inside it that
    cannot be read is a CK209 finding, not an error: the PATH was right, part of what it holds is out of reach."""
    why = entry_problem(path)
    if why is not None:
        raise UsageError(f"{label}: {why}")
    p = path if isinstance(path, ObjectPath) else os.fspath(path)
    if isinstance(p, ObjectPath):
        if not p.exists():
            raise UsageError(f"{label}: no such file or directory")
    elif not os.path.lexists(p):
        raise UsageError(f"{label}: no such file or directory")
