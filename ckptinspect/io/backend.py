"""The interface every object-storage backend implements, the values it returns; the errors it raises live in
`ckptinspect.errors` with the rest of the exception tree (named here too).

A backend is called by `session.Store` only, always through `retry.call`, in this order:

1. `list_page(key, token)`: one page of the objects and sub-prefixes directly under ``key/`` (a delimiter
   listing) and the next page's token (None after the last); `list_dir(key)` is all pages in one call;
2. `head(key)`: one object's size and ETag, or None when it does not exist (only for a path nobody listed);
3. `read(key, start, end, etag)`: the bytes [start, end) of one object; with `etag`, a backend that can make the
   read conditional raises `ObjectChanged` when the object is no longer the one listed;
   `stream(key, start, etag, chunk)` (only when `streams` is True): the object from byte `start` to its end, as
   ONE request whose body is iterated in pieces of at most `chunk` bytes (`manifest verify` hashes whole objects
   this way; `start` > 0 only to resume after a failure). The request is made on the first `next()`, and every
   error, of the request or mid-body, is raised from `next()`: the caller retries and resumes (`retry.resumable`);
4. `write(key, data)`: only `manifest write --out URL` writes, and only when asked;
5. `classify(exc)`: what an exception of the underlying client means (retry it, or which error it is).

Storage errors derive from `OSError`, so the readers turn a failed read into the same findings as a failed local
read (``.metadata unreadable: ...``), and `StorageUnavailable` (a `UsageError`, exit 2) is raised when the location
itself cannot be reached or authenticated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckptinspect.errors import ERRORS as ERRORS
from ckptinspect.errors import AccessDenied as AccessDenied
from ckptinspect.errors import Fault as Fault
from ckptinspect.errors import ObjectChanged as ObjectChanged
from ckptinspect.errors import ObjectMissing as ObjectMissing
from ckptinspect.errors import ObjectTruncated as ObjectTruncated
from ckptinspect.errors import RetriesExhausted as RetriesExhausted
from ckptinspect.errors import StorageError as StorageError
from ckptinspect.errors import StorageUnavailable as StorageUnavailable
from ckptinspect.errors import Unreachable as Unreachable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as a listing or a HEAD saw it.

    name: the last segment of the key.
    size: bytes.
    etag: the ETag (S3, Azure) or generation (GCS) as the server returned it; None when the backend has none.
    mtime: the last-modified time (POSIX seconds, the server's clock) when the backend gave one: the age rule of
    `formats/inflight.py` reads it for a save being uploaded; an object itself appears whole, never mid-write.
    """

    name: str
    size: int
    etag: str | None
    mtime: float | None = None


def posix_time(value: object) -> float | None:
    """A listing's last-modified value as POSIX seconds: a `datetime` (boto3, s3fs, adlfs, MSC), an ISO-8601 string
    (gcsfs' `updated`) or a number; None for anything else (never an error: the time only informs the age rule)."""
    from datetime import datetime, timezone

    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        try:
            return value.timestamp()
        except (OverflowError, OSError, ValueError):
            return None
    return None


@dataclass(frozen=True, slots=True)
class Listing:
    """What is directly under one prefix: objects by name, sub-prefix names."""

    files: dict[str, ObjectInfo] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not self.files and not self.dirs


def s3_list_page(page: Mapping[str, Any], prefix: str) -> tuple[Listing, str | None]:
    """One S3 `ListObjectsV2` response page (delimiter `/`) as the objects and sub-prefixes directly under `prefix`,
    and the continuation token of the next page (None on the last): the same for every S3 client."""
    files: dict[str, ObjectInfo] = {}
    dirs: set[str] = set()
    for e in page.get("Contents", ()):
        base = str(e.get("Key", ""))[len(prefix):]
        if base and "/" not in base:
            etag = e.get("ETag")
            files[base] = ObjectInfo(base, int(e.get("Size") or 0), str(etag) if etag not in (None, "") else None,
                                     posix_time(e.get("LastModified")))
    for e in page.get("CommonPrefixes", ()):
        base = str(e.get("Prefix", ""))[len(prefix):].rstrip("/")
        if base and "/" not in base:
            dirs.add(base)
    nxt = page.get("NextContinuationToken") if page.get("IsTruncated") else None
    return Listing(files, frozenset(dirs)), (str(nxt) if nxt else None)


class Backend(Protocol):
    """One bucket / container / MSC profile. Keys are relative to it, '/'-separated, no leading slash."""

    def list_dir(self, key: str) -> Listing: ...

    def list_page(self, key: str, token: str | None) -> tuple[Listing, str | None]: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def read(self, key: str, start: int, end: int, etag: str | None) -> bytes: ...

    @property
    def streams(self) -> bool:
        """True when `stream` makes one request per object (else the store reads consecutive ranged blocks)."""
        ...

    def stream(self, key: str, start: int, etag: str | None, chunk: int) -> Iterator[bytes]: ...

    def write(self, key: str, data: bytes) -> None: ...

    def classify(self, exc: BaseException) -> Fault: ...
