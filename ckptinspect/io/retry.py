"""Bounded retries with exponential backoff and jitter for transient storage faults (throttling, 5xx, timeouts).

Every attempt and every retry is counted in the session's `TransferStats`; a fault that is not transient is raised
at once as the matching `StorageError`, never retried (a 403 or a 404 does not get better by asking again).
`call` retries one request; `resumable` retries a streamed read of a whole object, resuming each retry from the
first byte not yet received.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ckptinspect.io.backend import (ERRORS, Backend, Fault, ObjectChanged, ObjectTruncated, RetriesExhausted,
                                         StorageError)
from ckptinspect.io.stats import TransferStats

T = TypeVar("T")
log = logging.getLogger("ckptinspect.io")

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


def resumable(backend: Backend, stats: TransferStats, key: str, size: int,
              open_at: Callable[[int], Iterator[bytes]]) -> Iterator[bytes]:
    """The `size` bytes of one object, in the pieces `open_at(start)` yields (one request from `start` to the end).

    A transient fault, of the request or in the middle of its body (a dropped connection, a read timeout, a 503),
    is retried like `call` retries (same attempts, same backoff, counted the same way): the retry asks for the
    bytes from the first one not yet received on, so nothing is received twice. `attempts()` bounds the requests
    for the whole object (the first and every resumption), as it bounds them for one `call`. A body that ends
    before `size` bytes is `ObjectTruncated`; one that goes on past it, or a retry that finds another object (412
    on the conditional read), is `ObjectChanged`. Raises like `call`.
    """
    tries = attempts()
    pos = 0
    for i in range(tries):
        stats.request("get")
        log.debug("get %s from %d (attempt %d)", key, pos, i + 1)
        pieces = open_at(pos)
        try:
            for data in pieces:
                if pos + len(data) > size:
                    raise ObjectChanged(f"get {key}: more bytes than the {size} listed: the object was rewritten "
                                        "after the listing", key)
                stats.received(len(data))
                pos += len(data)
                yield data
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001 - the backend's classify decides what each client error means
            fault = backend.classify(e)
            if fault is Fault.TRANSIENT and pos >= size:
                return  # every listed byte arrived; the connection failed after them (the end was not seen)
            if fault is Fault.TRANSIENT and i + 1 < tries:
                stats.retry("get")
                delay = min(MAX_DELAY_S, BASE_DELAY_S * (2 ** i))
                time.sleep(delay * (0.5 + random.random() / 2))
                continue
            what = f"get {key} [{pos}, {size}): {_describe(e)}"
            if fault is Fault.TRANSIENT:
                stats.failure("get")
                raise RetriesExhausted(f"{what} (gave up after {tries} attempts)", key) from e
            raise ERRORS[fault](what, key) from e
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()
        if pos < size:
            raise ObjectTruncated(f"get {key}: the body ended after {pos} bytes, {size} listed", key)
        return
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _describe(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if len(text) < 300 else text[:300] + "..."
