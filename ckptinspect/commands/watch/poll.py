"""The I/O side of `watch`: one poll of a save dir as a `Snapshot`, the metadata-level audit behind `classify`, and
the polling loop (`follow`) that feeds the state machine (`state.py`) and yields its events.

A poll lists the save dir (`read_save_dir`: tracker and iteration dirs) and, for every iteration dir that is not
settled complete, its entries (and those of its sub-dirs, one level: a legacy save writes into `mp_rank_*/`): the
signature is a digest of their names and sizes and of the newest modification time (`formats/inflight.py`). On
object storage each poll starts from fresh listings (the storage session is reset with its options, so nothing
cached by the previous poll hides a new object): one listing of the save dir's prefix plus one per unsettled
iteration. Nothing is written anywhere.

`classify` audits one iteration as `audit --all` does (metadata level, the integrity manifest checked) and keeps
only its status and codes. An iteration that is not complete is *in flight* when its status is that of an
unfinished save (`incomplete`, or `unrecognized` for a dir just created) and the tracker names no later iteration
(the clock-free witness of the age rule: a finalize that will never run); otherwise it is settled as broken.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.pickling.unpickle import release_frozen
from ckptinspect.commands.audit.audit import AuditOptions, audit_checkpoint
from ckptinspect.commands.watch.state import Event, EventKind, Seen, Snapshot, Verdict, Watcher
from ckptinspect.errors import CkptInspectError, UsageError
from ckptinspect.findings import Status
from ckptinspect.formats.inflight import age_of, newest_mtime
from ckptinspect.formats.resolve import access_guard
from ckptinspect.formats.savedir import SaveDir, SaveStyle, join_label, read_save_dir
from ckptinspect.formats.sniff import path_kind
from ckptinspect.io.local import require_path, unread_scope
from ckptinspect.io.objpath import ObjectPath
from ckptinspect.model import Kind

MAX_ENTRIES = 4096  # entries of one iteration dir (and its sub-dirs) that go into its signature
_UNFINISHED = (Status.INCOMPLETE, Status.UNRECOGNIZED)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """`interval`: seconds between polls; `stall_after`: seconds an in-flight save may stay unchanged; `max_polls` /
    `timeout` (seconds): stop after that many polls / that long (None: never); `hash`: as `audit --hash`."""

    interval: float = 10.0
    stall_after: float = 600.0
    max_polls: int | None = None
    timeout: float | None = None
    hash: bool = False


def check_save_dir(path: Path, label: str) -> None:
    """Raise `UsageError` when `path` does not exist, cannot be read, or is one checkpoint (not a save dir)."""
    require_path(path, label)
    with unread_scope(), access_guard(path, label):
        if not path.is_dir():
            raise UsageError(f"{label}: not a dir: watch follows the iteration dirs of a save dir")
        if any(True for _ in path.iterdir()) and path_kind(path) is Kind.CHECKPOINT:
            raise UsageError(f"{label}: one checkpoint, not a save dir: watch follows the iteration dirs of a "
                             "save dir (point it at the dir holding them)")


class Poller:
    """Reads snapshots of one save dir and classifies its iterations (the `classify` the machine calls)."""

    def __init__(self, path: Path, label: str, opts: WatchOptions) -> None:
        self.path, self.label, self.opts = path, label, opts
        self._save: SaveDir | None = None

    def snapshot(self, now: float, settled: Callable[[str], bool]) -> Snapshot:
        """One poll at time `now`; `settled(name)`: the iteration needs no signature (settled complete)."""
        if isinstance(self.path, ObjectPath):
            from ckptinspect.io.session import reset, session

            reset(dict(session().options))  # fresh listings: what the previous poll cached may be stale
        if not self.path.is_dir():  # gone or unreachable: an error event, no state change (no removals)
            raise FileNotFoundError("the save dir is not there (or not a dir) on this poll")
        with unread_scope():
            save = read_save_dir(self.path)
        self._save = save
        t = save.tracker
        seen = tuple(Seen(it.name, it.iteration, "" if settled(it.name) else signature(it.path))
                     for it in save.iterations)
        return Snapshot(now, t.raw if t.exists else None, seen)

    def classify(self, name: str) -> Verdict:
        assert self._save is not None
        save = self._save
        it = next(i for i in save.iterations if i.name == name)
        a = audit_checkpoint(it.path, join_label(self.label, it.name), AuditOptions(hash=self.opts.hash), True,
                             save.style is SaveStyle.MEGATRON, it.name)
        codes, status = tuple(sorted({f.code for f in a.findings})), a.status
        del a
        release_frozen()  # the audit's frozen leftovers (`pickling.unpickle.release_frozen`): a long watch stays flat
        if status not in _UNFINISHED:
            return Verdict(status, codes, False)
        t = save.tracker
        tracked = t.iteration if t.exists and t.error is None else None
        age = age_of(it.path, it.iteration if isinstance(it.iteration, int) else None, tracked=tracked)
        return Verdict(status, codes, not age.superseded)


def signature(path: Path) -> str:
    """A digest of the entries of iteration dir `path` (names and sizes, one level of sub-dirs) and of its newest
    modification time: it changes when a save writes, renames or removes a file."""
    h = hashlib.blake2b(digest_size=12)
    n = 0
    try:
        for child in sorted(path.iterdir(), key=lambda p: p.name):
            n += 1
            if n > MAX_ENTRIES:
                break
            if child.is_dir():
                h.update(f"{child.name}/\0".encode())
                for sub in sorted(child.iterdir(), key=lambda p: p.name)[:MAX_ENTRIES]:
                    h.update(f"{child.name}/{sub.name}\0{_size(sub)}\0".encode())
            else:
                h.update(f"{child.name}\0{_size(child)}\0".encode())
    except OSError as e:
        h.update(f"error {e.errno}".encode())
    h.update(repr(newest_mtime(path)).encode())
    return h.hexdigest()


def _size(p: Path) -> str:
    """A file's size (an object's size and ETag: a rewritten object of the same size changes it too); -1 for a
    dir, -2 for what cannot be stat'ed."""
    if isinstance(p, ObjectPath):
        info = p.object_info()
        return "-1" if info is None else f"{info.size}:{info.etag}"
    try:
        st = os.stat(p)
    except OSError:
        return "-2"
    return str(st.st_size) if stat.S_ISREG(st.st_mode) else "-1"


def follow(path: Path, label: str, opts: WatchOptions, clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[Event]:
    """Poll the save dir `path` until `max_polls` / `timeout` (forever when both are None) and yield every event.
    A poll that cannot read the save dir yields one `error` event (the next poll tries again)."""
    check_save_dir(path, label)
    poller = Poller(path, label, opts)
    machine = Watcher(poller.classify, opts.stall_after)
    start = time.monotonic()
    polls = 0
    while True:
        now = clock()
        try:
            snap = poller.snapshot(now, machine.done)
            events = machine.observe(snap)
        except (OSError, CkptInspectError) as e:
            events = [Event(EventKind.ERROR, now, message=f"{label}: {e}")]
        yield from events
        polls += 1
        if opts.max_polls is not None and polls >= opts.max_polls:
            return
        if opts.timeout is not None and time.monotonic() - start + opts.interval > opts.timeout:
            return
        sleep(opts.interval)
