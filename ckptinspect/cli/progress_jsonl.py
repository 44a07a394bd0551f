"""`--progress jsonl`: progress as JSON lines on stderr, for logs that are not a terminal (Slurm, Kubernetes, CI).

One object per line, at most one `progress` event per interval (`CKPTINSPECT_PROGRESS_INTERVAL` seconds, default
1; the first call is always reported), then one `done` event when the command's long work ends:

    {"event": "progress", "command": "manifest verify", "phase": "sha256", "bytes_done": 1048576,
     "bytes_total": 2391345, "elapsed_s": 0.52, "rate_bytes_per_s": 2016492, "eta_s": 0.67}

`rate_bytes_per_s` is the mean since the work started, `eta_s` the remaining bytes at that rate (null until a rate is
known). The phase is the description the library passes to its progress callback (`sha256`, `deep read`, a
tensor key for `diff --values`); a command with several phases (each its own total: `audit --deep` then hashes the
manifest's files) reports each phase's bytes. The hook may be called from any thread.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ckptinspect.progress import ProgressHook

DEFAULT_INTERVAL = 1.0


def interval() -> float:
    text = os.environ.get("CKPTINSPECT_PROGRESS_INTERVAL", "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 and value == value else DEFAULT_INTERVAL


class JsonlProgress:
    """Accumulates the library's progress calls and writes rate-limited events to `stream`."""

    def __init__(self, command: str, phase: str, stream: Any = None, every: float | None = None) -> None:
        self.command, self.phase = command, phase
        self.stream = stream if stream is not None else sys.stderr
        self.every = interval() if every is None else every
        self.done = 0
        self.total = 0
        self.start = time.monotonic()
        self.last: float | None = None
        self.lock = threading.Lock()

    def __call__(self, advance: int, total: int, desc: str) -> None:
        with self.lock:
            if total != self.total and self.done:
                # another phase (its own total): `audit --deep` reads the stored items, then hashes the manifest's
                # files; bytes, rate and ETA are the phase's
                self.done, self.start = 0, time.monotonic()
            self.done += max(advance, 0)
            self.total = max(total, self.done)
            self.phase = desc or self.phase
            now = time.monotonic()
            if self.last is None or now - self.last >= self.every:
                self.last = now
                self._emit("progress", now)

    def finish(self) -> None:
        with self.lock:
            self._emit("done", time.monotonic())

    def _emit(self, event: str, now: float) -> None:
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 and self.done else None
        eta = (self.total - self.done) / rate if rate else None
        doc = {"event": event, "command": self.command, "phase": self.phase, "bytes_done": self.done,
               "bytes_total": self.total, "elapsed_s": round(elapsed, 3),
               "rate_bytes_per_s": round(rate) if rate is not None else None,
               "eta_s": round(eta, 3) if eta is not None else None}
        try:
            self.stream.write(json.dumps(doc, ensure_ascii=True) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stderr must not fail the command


@contextmanager
def jsonl_progress(command: str, phase: str) -> Iterator[ProgressHook]:
    """A progress hook writing JSON lines to stderr; the `done` event when the block ends (also on an error)."""
    hook = JsonlProgress(command, phase)
    try:
        yield hook
    finally:
        hook.finish()
