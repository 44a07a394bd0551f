"""Parallel prefetch of the small windows a caller is about to read, object by object, in order.

The safety scan of `audit` reads the byte items (rng state, extra state, ...) of every `.distcp`: one coalesced
GET per data file, thousands of them on a large checkpoint. Made one after the other, each waits a round trip;
`ahead()` issues them from a few threads, ahead of the caller, so the caller's reads are served from memory. The
requests are the same ones the caller's readers would make (same object, same range, same listed ETag, through
`Store.read`: counted, retried, checked, failures become the same events), only earlier: the transfer is unchanged,
the wall time is not.

Memory stays bounded: at most `max_bytes` of fetched-but-not-yet-read windows (at least one object's), and a window
larger than `objpath.WHOLE_OBJECT_BYTES` is left to the caller's reader (it streams it in blocks).
"""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from ckptinspect.io.backend import ObjectInfo, StorageError, StorageUnavailable
from ckptinspect.io.objpath import WHOLE_OBJECT_BYTES, ObjectPath, coalesce
from ckptinspect.io.session import Store

WORKERS = 16  # the requests wait on the network, not the CPU
MAX_BYTES = 256 << 20  # fetched windows not yet read by the caller, at most (one object's always allowed)

_Job = tuple[Store, str, ObjectInfo, list[tuple[int, int]]]


def ahead(jobs: Sequence[tuple[Path, Sequence[tuple[int, int]]]]) -> Iterator[int]:
    """Yield the index of each job, in order, once the windows ((offset, length) pairs) of its object are fetched
    (kept by its store for the reader that asks for exactly them). Local paths are yielded at once. Closing the
    generator early drops what was fetched and not read."""
    planned: list[_Job | None] = [_plan(p, w) for p, w in jobs]
    if not any(planned):
        yield from range(len(jobs))
        return
    pool = cf.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ckptinspect-prefetch")
    running: deque[tuple[int, list[cf.Future[None]]]] = deque()
    nxt, held = 0, 0
    try:
        for i, job in enumerate(planned):
            while nxt < len(planned) and (nxt <= i or held + _bytes(planned[nxt]) <= MAX_BYTES):
                todo = planned[nxt]
                if todo is not None:
                    store, key, info, ranges = todo
                    running.append((nxt, [pool.submit(_fetch, store, key, lo, hi, info) for lo, hi in ranges]))
                    held += _bytes(todo)
                nxt += 1
            if running and running[0][0] == i:
                _, futures = running.popleft()
                cf.wait(futures)
            yield i
            if job is not None:
                held -= _bytes(job)
                job[0].drop_prefetched(job[1], job[3], job[2])
    finally:
        for _, futures in running:
            for f in futures:
                f.cancel()
        pool.shutdown(wait=True)
        for job in planned[:nxt]:
            if job is not None:
                job[0].drop_prefetched(job[1], job[3], job[2])


def _plan(path: Path, windows: Sequence[tuple[int, int]]) -> _Job | None:
    """(store, key, listed info, the GET ranges the reader will make) of an object, or None (a local path, a
    missing object, windows too large to hold)."""
    if not isinstance(path, ObjectPath):
        return None
    try:
        info = path.object_info()
    except (OSError, StorageError, StorageUnavailable):  # the reader meets (and reports) the same problem
        return None
    if info is None:
        return None
    ranges = [(lo, hi) for lo, hi in coalesce([(o, o + n) for o, n in windows], info.size)
              if hi - lo <= WHOLE_OBJECT_BYTES]
    return (path.store, path.key, info, ranges) if ranges else None


def _bytes(job: _Job | None) -> int:
    return sum(hi - lo for lo, hi in job[3]) if job is not None else 0


def _fetch(store: Store, key: str, lo: int, hi: int, info: ObjectInfo) -> None:
    try:
        store.prefetch(key, lo, hi, info)
    except OSError:
        pass  # recorded by the store (event, failed read): the reader's own read raises the same error
