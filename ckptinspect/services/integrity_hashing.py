"""Whole-file SHA-256 for the integrity manifests (`manifest.py`): which files can be hashed, and hashing many.

Hashing runs on a thread pool (hashlib and `readinto` release the GIL), biggest files first, each thread reading into
one reused buffer, so memory is bounded by ``workers × 4 MiB``. An object is streamed (one GET per object, its body
hashed as it arrives, ``workers × 1 MiB`` held; see `Store.stream`). Only regular files are opened: a FIFO or device is
reported as not hashable, never a hang.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from ckptinspect.errors import read_code
from ckptinspect.progress import ProgressHook
from ckptinspect.io.local import NotRegularFile, open_regular
from ckptinspect.io.objpath import ObjectPath

ALGORITHM = "sha256"  # the manifest's `algorithm`: the only one hashed here
_CHUNK = 4 * 1024 * 1024
_STREAM_PIECE = 1 << 20  # what one hashing thread holds of a streamed object (16 threads: 16 MiB)


@dataclass(frozen=True, slots=True)
class _Hashed:
    digest: str | None  # None: could not be read
    size: int
    error: str | None
    code: str = "CK402"  # what a failure is: CK402 (missing, not regular, broken), CK209 (not readable here)


_local = threading.local()


def _hash_object(path: ObjectPath, tick: _Ticker | None) -> _Hashed:
    """SHA-256 of an object as listed, streamed: one GET whose body is hashed as it arrives, `_STREAM_PIECE` bytes
    at a time (`Store.stream`: a ranged GET only to resume after a failure, checked against the listed ETag)."""
    h = hashlib.sha256()
    total = 0
    try:
        info = path.object_info()
        if info is None:
            return _Hashed(None, 0, "object missing")
        for piece in path.store.stream(path.key, info, _STREAM_PIECE):
            h.update(piece)
            total += len(piece)
            if tick is not None:
                tick.add(len(piece))
    except OSError as e:
        return _Hashed(None, total, f"{type(e).__name__}: {e.strerror or e}")
    return _Hashed(h.hexdigest(), total, None)


def _hash_file(path: str | ObjectPath, tick: _Ticker | None) -> _Hashed:
    """Whole-file SHA-256 of a regular file through this thread's reused buffer; OSError becomes `error`."""
    if isinstance(path, ObjectPath):
        return _hash_object(path, tick)
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(_CHUNK)
    view = memoryview(buf)
    h = hashlib.sha256()
    total = 0
    try:
        # Non-blocking open: if the entry was swapped for a FIFO after the stat, open must not wait for a writer.
        with open_regular(path, buffering=0) as opened:
            f = cast(io.FileIO, opened)  # buffering=0: the raw file, whose readinto fills our buffer
            _advise_sequential(f.fileno())
            while n := f.readinto(view):
                h.update(view[:n])
                total += n
                if tick is not None:
                    tick.add(n)
    except NotRegularFile:
        return _Hashed(None, 0, "not a regular file")
    except OSError as e:
        return _Hashed(None, total, f"{type(e).__name__}: {e.strerror or e}", read_code(e, "CK402"))
    return _Hashed(h.hexdigest(), total, None)


def _advise_sequential(fd: int) -> None:
    """Ask for aggressive read-ahead; a filesystem that refuses the hint is no reason to fail."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


class _Ticker:
    """Byte counter shared by the workers; the calling thread turns it into progress calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = 0

    def add(self, n: int) -> None:
        with self._lock:
            self._pending += n

    def take(self) -> int:
        with self._lock:
            n, self._pending = self._pending, 0
            return n


def default_workers() -> int:
    """Threads for hashing: the CPUs this process may use, at most 16 (memory stays ≤ 64 MiB of buffers)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(16, cpus))


REMOTE_WORKERS = 16  # object reads wait on the network, not the CPU: more streams than cores


def hash_many(
    jobs: Sequence[tuple[str, str | ObjectPath, int]], workers: int | None, progress: ProgressHook | None, what: str
) -> dict[str, _Hashed]:
    """Hash `(key, path, size)` jobs, biggest first (longest-processing-time), reporting progress from this thread."""
    if not jobs:
        return {}
    ordered = sorted(jobs, key=lambda j: (-j[2], j[0]))
    total = sum(j[2] for j in ordered)
    tick = _Ticker() if progress is not None else None
    remote = any(isinstance(j[1], ObjectPath) for j in ordered)
    nthreads = max(1, min(workers or (REMOTE_WORKERS if remote else default_workers()), len(ordered)))
    with cf.ThreadPoolExecutor(max_workers=nthreads, thread_name_prefix="ckptinspect-sha256") as pool:
        futures = {pool.submit(_hash_file, path, tick): key for key, path, _ in ordered}
        pending: set[cf.Future[_Hashed]] = set(futures)
        while pending:
            _, pending = cf.wait(pending, timeout=0.1, return_when=cf.FIRST_COMPLETED)
            if progress is not None and tick is not None and (n := tick.take()):
                progress(n, total, what)
    return {futures[f]: f.result() for f in futures}


def stat_entry(path: str | ObjectPath) -> tuple[int | None, str | None]:
    """(size, None) for a regular file (symlinks followed), else (None, why it cannot be hashed)."""
    size, why, _ = stat_entry_code(path)
    return size, why


def stat_entry_code(path: str | ObjectPath) -> tuple[int | None, str | None, str]:
    """`stat_entry` and the finding code of a failure: CK402, or CK209 when a dir above it cannot be entered."""
    if isinstance(path, ObjectPath):
        info = path.object_info()
        if info is None:
            return None, "is a directory" if path.is_dir() else "object missing", "CK402"
        return info.size, None, "CK402"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, "broken symlink" if os.path.islink(path) else "file missing", "CK402"
    except OSError as e:  # ELOOP, EACCES on a parent, ENAMETOOLONG ...
        return None, f"unreadable ({type(e).__name__}: {e.strerror or e})", read_code(e, "CK402")
    if stat.S_ISDIR(st.st_mode):
        return None, "is a directory", "CK402"
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file (FIFO, socket or device)", "CK402"
    return st.st_size, None, "CK402"
