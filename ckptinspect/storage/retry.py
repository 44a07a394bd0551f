"""Bounded retries with exponential backoff and jitter for transient storage faults (throttling, 5xx, timeouts).

Every attempt and every retry is counted in the session's `TransferStats`; a fault that is not transient is raised
at once as the matching `StorageError`, never retried (a 403 or a 404 does not get better by asking again).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ckptinspect.storage.backend import ERRORS, Backend, Fault, RetriesExhausted, StorageError
from ckptinspect.storage.stats import TransferStats

T = TypeVar("T")
log = logging.getLogger("ckptinspect.storage")

ATTEMPTS = 5  # first try + 4 retries
BASE_DELAY_S = 0.1
MAX_DELAY_S = 2.0


def attempts() -> int:
    """`CKPTINSPECT_STORAGE_ATTEMPTS` overrides the number of attempts (1..20)."""
    raw = os.environ.get("CKPTINSPECT_STORAGE_ATTEMPTS", "")
    return max(1, min(20, int(raw))) if raw.isdigit() else ATTEMPTS


def call(backend: Backend, stats: TransferStats, op: str, key: str, fn: Callable[[], T]) -> T:
    """Run one backend request with retries. Raises a `StorageError` subclass when it finally fails."""
    tries = attempts()
    for i in range(tries):
        stats.request(op)
        log.debug("%s %s (attempt %d)", op, key or "/", i + 1)
        try:
            return fn()
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001 - the backend's classify decides what each client error means
            fault = backend.classify(e)
            if fault is Fault.TRANSIENT and i + 1 < tries:
                stats.retry(op)
                delay = min(MAX_DELAY_S, BASE_DELAY_S * (2 ** i))
                time.sleep(delay * (0.5 + random.random() / 2))
                continue
            what = f"{op} {key or '/'}: {_describe(e)}"
            if fault is Fault.TRANSIENT:
                stats.failure(op)
                raise RetriesExhausted(f"{what} (gave up after {tries} attempts)", key) from e
            raise ERRORS[fault](what, key) from e
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _describe(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if len(text) < 300 else text[:300] + "..."
