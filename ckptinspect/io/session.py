"""The per-process storage session: one `Store` per bucket / container / profile, the listing cache, transfer
counters, and the storage events (an object changed, vanished, was denied ...) that become findings.

A CLI run is one session: `configure()` sets the ``--storage-option`` values before the first URL is opened.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptinspect.io import retry
from ckptinspect.io.backend import (AccessDenied, Backend, Listing, ObjectChanged, ObjectInfo, ObjectMissing,
                                         ObjectTruncated, RetriesExhausted, StorageError, StorageUnavailable,
                                         Unreachable)
from ckptinspect.io.stats import TransferStats
from ckptinspect.io.url import Scheme


@dataclass(frozen=True, slots=True)
class StorageEvent:
    """Something storage did that the checkpoint's report must say: `code` is a CK22x finding code."""

    code: str
    url: str
    name: str
    message: str
    details: Mapping[str, object] = field(default_factory=dict)


MAX_LIST_PAGES = 10_000  # 10M entries under one prefix (S3 pages hold 1000): a bound, not a limit anyone meets
SMALL_OBJECT_BYTES = 4 << 20  # whole reads of objects up to this size are kept for the rest of the run ...
SMALL_CACHE_BYTES = 64 << 20  # ... up to this much in total
STREAM_BLOCK = 32 << 20  # `stream` of a backend without a streamed read: ranged GETs of this size

_EVENT_CODE: dict[type[StorageError], str] = {ObjectChanged: "CK220", AccessDenied: "CK221", ObjectTruncated: "CK222",
                                              ObjectMissing: "CK223", RetriesExhausted: "CK224"}


class Store:
    """One bucket / container / MSC profile: cached listings, counted requests, reads checked against the listing."""

    def __init__(self, scheme: Scheme, authority: str, backend: Backend, session: Session) -> None:
        self.scheme = scheme
        self.authority = authority
        self.backend = backend
        self._session = session
        self._lock = threading.Lock()
        self._listings: dict[str, Listing] = {}
        self._heads: dict[str, ObjectInfo | None] = {}
        self._prefetched: dict[tuple[str, int, int, str | None], bytes] = {}  # `prefetch`: read once, then dropped
        self._unlistable: set[str] = set()  # prefixes whose listing was refused: their keys are asked one by one
        self._small: dict[str, tuple[str | None, bytes]] = {}
        self._small_bytes = 0
        # reads that failed for good (after the retries): a second reader of the same bytes (sniff, then the
        # reader) gets the same error at once instead of hammering a failing object again
        self._failed: dict[tuple[str, int, int, str | None], StorageError] = {}

    def url(self, key: str) -> str:
        return f"{self.scheme.value}://{self.authority}/{key}" if key else f"{self.scheme.value}://{self.authority}"

    def _unavailable(self, e: StorageError, key: str) -> StorageUnavailable:
        return StorageUnavailable(f"{self.url(key)}: cannot list or reach the location: {e}")

    def listing(self, key: str) -> Listing:
        """What is directly under ``key/`` (one listing per prefix per run)."""
        with self._lock:
            hit = self._listings.get(key)
        if hit is not None:
            return hit
        try:
            got = self._list_pages(key)
        except (AccessDenied, Unreachable, RetriesExhausted, StorageError) as e:
            if isinstance(e, ObjectMissing):
                got = Listing()
            else:
                raise self._unavailable(e, key) from e
        with self._lock:
            self._listings[key] = got
        return got

    def _list_pages(self, key: str) -> Listing:
        """Every page of the listing of ``key/``, each page one counted (and retried) request."""
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        token: str | None = None
        for _ in range(MAX_LIST_PAGES):
            tok = token
            page, token = retry.call(self.backend, self._session.stats, "list", key,
                                     lambda: self.backend.list_page(key, tok))
            files.update(page.files)
            dirs.update(page.dirs)
            if token is None:
                return Listing(files, frozenset(dirs))
        raise StorageError(f"{self.url(key)}: more than {MAX_LIST_PAGES} listing pages", key)

    def _parent_listing(self, key: str) -> tuple[Listing | None, str]:
        """The listing of `key`'s parent: one delimiter listing answers every question about `key` and its
        siblings (is it an object, its size and ETag, is it a prefix), where asking about `key` alone costs a HEAD
        and a listing of ``key/`` (a reader that looks for ``latest_train_state.pt`` beside a checkpoint). A
        parent the grandparent's cached listing shows not to be a prefix has nothing under it: not listed."""
        parent, _, name = key.rpartition("/")
        if not key:
            return None, name
        with self._lock:
            hit = self._listings.get(parent)
            grand, _, pname = parent.rpartition("/")
            above = self._listings.get(grand) if parent else None
        if hit is None and (above is None or pname in above.dirs) and parent not in self._unlistable:
            try:
                hit = self.listing(parent)
            except StorageUnavailable:  # a policy that allows listing the checkpoint's prefix only: ask the key
                with self._lock:
                    self._unlistable.add(parent)
        return hit, name

    def info(self, key: str) -> ObjectInfo | None:
        """The object at `key` (None when there is none): from the parent's listing when it was listed, else HEAD."""
        parent, name = self._parent_listing(key)
        if parent is not None:
            return parent.files.get(name)
        with self._lock:
            own = self._listings.get(key)
            if own is not None and not own.empty:
                return None  # a prefix with objects under it: a dir
            if key in self._heads:
                return self._heads[key]
        try:
            got = retry.call(self.backend, self._session.stats, "head", key, lambda: self.backend.head(key))
        except ObjectMissing:
            got = None
        except StorageError as e:
            raise self._unavailable(e, key) from e
        with self._lock:
            self._heads[key] = got
        return got

    def is_dir(self, key: str) -> bool:
        parent, name = self._parent_listing(key)
        if parent is not None:
            return name in parent.dirs
        return not self.listing(key).empty

    def prefetch(self, key: str, start: int, end: int, info: ObjectInfo) -> None:
        """Read [start, end) now (`prefetch.ahead`, from a worker thread) and keep it for the one `read` of exactly
        that range that follows: the same request, made earlier."""
        data = self.read(key, start, end, info)
        with self._lock:
            self._prefetched[(key, start, end, info.etag)] = data

    def drop_prefetched(self, key: str, ranges: list[tuple[int, int]], info: ObjectInfo) -> None:
        """Forget prefetched ranges nobody read (an item the scan skipped)."""
        with self._lock:
            for lo, hi in ranges:
                self._prefetched.pop((key, lo, hi, info.etag), None)

    def read(self, key: str, start: int, end: int, info: ObjectInfo) -> bytes:
        """Bytes [start, end) of the object as listed; a short answer is `ObjectTruncated`, all of them events."""
        with self._lock:
            early = self._prefetched.pop((key, start, end, info.etag), None)
        if early is not None:
            return early
        whole = start == 0 and end == info.size and info.size <= SMALL_OBJECT_BYTES
        if whole:
            with self._lock:
                hit = self._small.get(key)
            if hit is not None and hit[0] == info.etag:
                return hit[1]
        failed = self._failed.get((key, start, end, info.etag))
        if failed is not None:
            raise failed
        stats = self._session.stats
        try:
            data = retry.call(self.backend, stats, "get", f"{key} [{start}, {end})",
                              lambda: self.backend.read(key, start, end, info.etag))
            stats.received(len(data))
            if len(data) != end - start:
                raise ObjectTruncated(f"get {key} [{start}, {end}): {len(data)} bytes received, "
                                      f"{end - start} expected (listed size {info.size})", key)
        except StorageError as e:
            self._session.record(self._event(e, key, info))
            with self._lock:
                self._failed[(key, start, end, info.etag)] = e
            raise
        if whole:  # metadata.json, the tracker, common.pt: sniff and reader both read them
            with self._lock:
                if self._small_bytes + len(data) <= SMALL_CACHE_BYTES:
                    self._small[key] = (info.etag, data)
                    self._small_bytes += len(data)
        return data

    def stream(self, key: str, info: ObjectInfo, chunk: int) -> Iterator[bytes]:
        """The whole object as listed, in pieces of at most `chunk` bytes, for a single pass (hashing).

        A backend that streams makes ONE request (`Backend.stream`; a ranged one from the first missing byte only to
        resume after a transient failure, `retry.resumable`), so what is held is one piece, whatever the object's
        size. Any other backend is read in consecutive ranged GETs of `STREAM_BLOCK` bytes (`read`). Either way the
        bytes are checked against the listing (size; ETag where reads are conditional), and a failure becomes the
        same storage event as a failed `read`. A streamed object is not cached (a block read may be, as by `read`)."""
        if not self.backend.streams:
            for lo in range(0, info.size, STREAM_BLOCK):
                block = self.read(key, lo, min(info.size, lo + STREAM_BLOCK), info)
                for at in range(0, len(block), chunk):
                    yield block[at:at + chunk]
            return
        try:
            yield from retry.resumable(self.backend, self._session.stats, key, info.size,
                                       lambda start: self.backend.stream(key, start, info.etag, chunk))
        except StorageError as e:
            self._session.record(self._event(e, key, info))
            raise

    def _event(self, e: StorageError, key: str, info: ObjectInfo) -> StorageEvent:
        code = next((c for t, c in _EVENT_CODE.items() if isinstance(e, t)), "CK224")
        messages = {
            "CK220": "object changed between listing and read (ETag differs): it was rewritten during the audit",
            "CK221": "object listed but access to its bytes is denied",
            "CK222": "object returned fewer bytes than its listed size",
            "CK223": "object listed but gone when read",
            "CK224": "object could not be read (transient errors persisted after retries)",
        }
        return StorageEvent(code, self.url(key), key.rsplit("/", 1)[-1], f"{key.rsplit('/', 1)[-1]}: "
                            f"{messages[code]} ({e})", {"etag": info.etag, "size": info.size})

    def write(self, key: str, data: bytes) -> None:
        retry.call(self.backend, self._session.stats, "put", key, lambda: self.backend.write(key, data))
        with self._lock:
            self._listings.pop(key.rpartition("/")[0], None)
            self._heads.pop(key, None)


class Session:
    """All stores of this process, their counters and events."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self.stats = TransferStats()
        self._stores: dict[tuple[Scheme, str], Store] = {}
        self._events: list[StorageEvent] = []
        self._lock = threading.Lock()
        self.retries_reported = False

    @property
    def used(self) -> bool:
        return bool(self._stores)

    def store(self, scheme: Scheme, authority: str) -> Store:
        with self._lock:
            hit = self._stores.get((scheme, authority))
        if hit is not None:
            return hit
        backend = _make_backend(scheme, authority, self.options)
        st = Store(scheme, authority, backend, self)
        with self._lock:
            return self._stores.setdefault((scheme, authority), st)

    def record(self, event: StorageEvent) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self, url_prefix: str) -> list[StorageEvent]:
        """The events of objects under `url_prefix`, removed from the session (each is reported once)."""
        prefix = url_prefix.rstrip("/") + "/"
        with self._lock:
            mine = [e for e in self._events if e.url.startswith(prefix) or e.url == url_prefix]
            self._events = [e for e in self._events if e not in mine]
        return mine


def _make_backend(scheme: Scheme, authority: str, options: Mapping[str, Any]) -> Backend:
    try:
        if scheme is Scheme.MSC:
            from ckptinspect.io.msc_backend import MscBackend

            return MscBackend(authority)
        if scheme is Scheme.S3:
            from ckptinspect.io.url import installed

            if installed("boto3") or not installed("s3fs"):
                from ckptinspect.io.boto3_backend import Boto3Backend

                return Boto3Backend(authority, options)
        from ckptinspect.io.fsspec_backend import FsspecBackend

        return FsspecBackend(scheme, authority, options)
    except ImportError as e:
        raise StorageUnavailable(f"{scheme.value}://{authority}: backend unavailable ({e}); "
                                 f"pip install 'ckptinspect[{scheme.extra}]'") from e
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        # Bad --storage-option names or values, an unknown MSC profile, an unreadable MSC config.
        raise StorageUnavailable(f"{scheme.value}://{authority}: cannot configure the storage client: "
                                 f"{type(e).__name__}: {e}") from e


_SESSION = Session()


def session() -> Session:
    return _SESSION


def reset(options: Mapping[str, Any] | None = None) -> Session:
    """Start a fresh session (one per CLI invocation): no cached listings, zeroed counters, these options."""
    global _SESSION
    _SESSION = Session()
    _SESSION.options.update(options or {})
    return _SESSION


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--storage-option``: true/false/null and integers are typed, JSON objects parsed,
    ``client_kwargs.endpoint_url=...`` nests."""
    import json

    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--storage-option {text!r}: expected KEY=VALUE")
    value: Any = raw
    low = raw.lower()
    if low in ("true", "false"):
        value = low == "true"
    elif low in ("null", "none"):
        value = None
    elif raw.lstrip("-").isdigit():
        value = int(raw)
    elif raw.startswith("{"):
        value = json.loads(raw)
    return key, value


def nest(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``a.b=1`` → ``{"a": {"b": 1}}`` (fsspec's ``client_kwargs`` / ``config_kwargs`` take dicts)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        cur = out
        *heads, last = key.split(".")
        for h in heads:
            nxt = cur.setdefault(h, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"--storage-option {key}: {h} is both a value and a group")
            cur = nxt
        cur[last] = value
    return out
