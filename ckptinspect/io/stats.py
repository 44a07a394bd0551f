"""Transfer counters of one process: requests by operation, bytes received, retries, failures.

`-o json` reports them under the ``storage`` key, so a CI job can assert what an audit cost.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransferReport:
    """A snapshot: requests made (by operation: list, head, get, put), bytes received, retried and failed requests."""

    requests: int
    bytes: int
    retries: int
    failures: int
    by_op: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "bytes_transferred": self.bytes, "retries": self.retries,
                "failed_requests": self.failures, "requests_by_op": dict(self.by_op)}


class TransferStats:
    """Thread-safe counters (manifest verify reads from many threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._bytes = 0
        self._retries = 0
        self._failures = 0

    def request(self, op: str) -> None:
        with self._lock:
            self._requests[op] += 1

    def received(self, n: int) -> None:
        with self._lock:
            self._bytes += n

    def retry(self, op: str) -> None:
        with self._lock:
            self._retries += 1

    def failure(self, op: str) -> None:
        with self._lock:
            self._failures += 1

    def snapshot(self) -> TransferReport:
        with self._lock:
            return TransferReport(sum(self._requests.values()), self._bytes, self._retries, self._failures,
                                  tuple(sorted(self._requests.items())))
