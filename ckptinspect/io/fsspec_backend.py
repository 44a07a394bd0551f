"""Backend over fsspec: s3fs (``s3://``), gcsfs (``gs://``), adlfs (``az://``, ``abfs://``).

Credentials and endpoints come the way each library finds them (AWS env vars, profiles and ``AWS_ENDPOINT_URL``;
Google application-default credentials; ``AZURE_STORAGE_*``), plus ``--storage-option KEY=VALUE`` passed to the
filesystem constructor. The library's own retries are turned off where it has a switch (s3fs ``retries``, botocore
``max_attempts``, the Azure SDK's retry policy on adlfs's client) so that `retry.call` alone retries, and counts what
it retried.

S3 reads are conditional (``If-Match`` the listed ETag, through s3fs's ranged fetch), and so are Azure reads (the
blob client's download with the SDK's ``etag`` / ``match_condition``, on adlfs's client and loop), so an object
replaced after the listing is seen as `ObjectChanged`. gcsfs reads through ``cat_file``, which has no precondition:
for it a replaced object is only noticed if its size changed.

S3 also streams (`stream`): one ``GetObject`` for the whole object (a ``Range: bytes=N-`` only to resume), its body
read in pieces on s3fs's event loop and handed to the calling thread, so a hashing thread holds one piece, not the
object, and the server sends each byte once (a ranged GET per block costs a request per block, and some servers,
moto among them, read the whole object for every ranged GET). gcsfs and adlfs have no streamed read in their sync
API: the store reads them in consecutive ranged blocks.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ckptinspect.io.backend import Fault, Listing, ObjectInfo, posix_time, s3_list_page
from ckptinspect.io.faults import classify
from ckptinspect.io.url import Scheme

LIST_PAGE_KEYS = 1000  # entries per S3 listing page (the API's maximum)
POOL_CONNECTIONS = 32  # botocore's default is 10: more parallel reads than that would queue for a connection
_PROTOCOL = {Scheme.S3: "s3", Scheme.GS: "gcs", Scheme.GCS: "gcs", Scheme.AZ: "az", Scheme.ABFS: "abfs",
             Scheme.ABFSS: "abfs"}
_AZURE = (Scheme.AZ, Scheme.ABFS, Scheme.ABFSS)


def _mtime(entry: Mapping[str, Any]) -> float | None:
    """The entry's last-modified time: s3fs `LastModified`, adlfs `last_modified`, gcsfs `updated` (or `mtime`)."""
    for name in ("LastModified", "last_modified", "updated", "mtime"):
        if entry.get(name) is not None:
            return posix_time(entry[name])
    return None


def _etag(entry: Mapping[str, Any]) -> str | None:
    for k in ("ETag", "etag", "generation"):
        v = entry.get(k)
        if v not in (None, ""):
            return str(v)
    return None


def _merge(into: dict[str, Any], options: Mapping[str, Any]) -> None:
    """Deep-merge `options` into `into`: ``config_kwargs.read_timeout=5`` keeps the other ``config_kwargs``."""
    for k, v in options.items():
        cur = into.get(k)
        if isinstance(cur, dict) and isinstance(v, Mapping):
            merged = dict(cur)
            _merge(merged, v)
            into[k] = merged
        else:
            into[k] = v


class FsspecBackend:
    """One bucket (s3, gs) or container (az, abfs) through an fsspec filesystem. `root` is the bucket or container
    (for ``abfs://container@account...`` the container alone)."""

    def __init__(self, scheme: Scheme, authority: str, options: Mapping[str, Any]) -> None:
        fsspec: Any = importlib.import_module("fsspec")
        self.scheme = scheme
        self.root = authority
        kwargs: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
        if scheme in (Scheme.ABFS, Scheme.ABFSS) and "@" in authority:
            self.root, account = _abfs_authority(authority)
            if account is not None:
                kwargs["account_name"] = account  # what fsspec.open() takes from such a URL; options override it
        if scheme is Scheme.S3:
            config = {"retries": {"total_max_attempts": 1, "mode": "standard"},  # botocore: one attempt
                      "connect_timeout": 10, "read_timeout": 60,
                      # one connection per stream: 16 hashing threads, and the 16 prefetch threads of a scan
                      "max_pool_connections": POOL_CONNECTIONS}
            kwargs.update(config_kwargs=config)
        _merge(kwargs, options)
        self.fs: Any = fsspec.filesystem(_PROTOCOL[scheme], **kwargs)
        if scheme is Scheme.S3:
            self.fs.retries = 1  # s3fs's own retry loop (a class attribute): one attempt, `retry.call` retries
        elif scheme in _AZURE:
            _one_azure_attempt(self.fs)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def list_page(self, key: str, token: str | None) -> tuple[Listing, str | None]:
        """One page of the listing of ``key/`` and the token of the next page (None: last page). S3 is listed
        page by page (ListObjectsV2, up to 1000 entries a page) so every request is counted and retried alone;
        gcsfs and adlfs list in one call (their pagination is inside the client)."""
        if self.scheme is not Scheme.S3:
            return self.list_dir(key), None
        kwargs: dict[str, Any] = {"Bucket": self.root, "Prefix": f"{key}/" if key else "", "Delimiter": "/",
                                  "MaxKeys": LIST_PAGE_KEYS}
        if token is not None:
            kwargs["ContinuationToken"] = token
        page: Mapping[str, Any] = self.fs.call_s3("list_objects_v2", **kwargs)
        prefix = kwargs["Prefix"]
        return s3_list_page(page, prefix)

    def list_dir(self, key: str) -> Listing:
        path = self._path(key)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return Listing()
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        for e in entries:
            name = str(e.get("name", "")).rstrip("/")
            if name == path.rstrip("/"):
                continue  # `ls` of an object's own key lists the object: not a dir
            base = name.rsplit("/", 1)[-1]
            if not base:
                continue
            if e.get("type") == "directory":
                dirs.add(base)
            else:
                files[base] = ObjectInfo(base, int(e.get("size") or 0), _etag(e), _mtime(e))
        return Listing(files, frozenset(dirs))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            e = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        if e.get("type") == "directory":
            return None
        return ObjectInfo(key.rsplit("/", 1)[-1], int(e.get("size") or 0), _etag(e), _mtime(e))

    def read(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        if end <= start:
            return b""
        if self.scheme is Scheme.S3 and etag is not None:
            # If-Match: a replaced object answers 412, not the new object's bytes (s3fs's own ranged fetch).
            fetch: Any = importlib.import_module("s3fs.core")._fetch_range
            data = fetch(self.fs, self.root, key, None, start, end, req_kw={"IfMatch": etag})
        elif self.scheme in _AZURE and etag is not None:
            # adlfs's cat_file takes no precondition: the blob client's download, If-Match the listed ETag.
            asyn: Any = importlib.import_module("fsspec.asyn")
            data = asyn.sync(self.fs.loop, _azure_read, self.fs, self._path(key), start, end, etag)
        else:
            data = self.fs.cat_file(self._path(key), start=start, end=end)
        return bytes(data)

    @property
    def streams(self) -> bool:
        return self.scheme is Scheme.S3

    def stream(self, key: str, start: int, etag: str | None, chunk: int) -> Iterator[bytes]:
        """The object from `start` to its end: one GetObject (If-Match the listed ETag), the body read on s3fs's
        loop `chunk` bytes at a time (yielded as the parts aiohttp buffered, each smaller). Closing the generator
        early drops the connection."""
        if self.scheme is not Scheme.S3:
            raise NotImplementedError(f"{self.scheme.value}:// has no streamed read here (`streams` is False)")
        asyn: Any = importlib.import_module("fsspec.asyn")
        kwargs: dict[str, Any] = {"Bucket": self.root, "Key": key}
        if etag is not None:
            kwargs["IfMatch"] = etag
        if start > 0:
            kwargs["Range"] = f"bytes={start}-"
        body = self.fs.call_s3("get_object", **kwargs)["Body"]
        try:
            while True:
                parts, error = asyn.sync(self.fs.loop, _read_parts, body, chunk)
                yield from parts  # what arrived before a failure counts: the retry resumes after it
                if error is not None:
                    raise error
                if not parts:
                    return
        finally:
            asyn.sync(self.fs.loop, _close, body)

    def write(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)

    def classify(self, exc: BaseException) -> Fault:
        return classify(exc)


def _abfs_authority(authority: str) -> tuple[str, str | None]:
    """``container@account.dfs.core.windows.net`` (the form Azure's tools print) → (container, account). The
    account is taken from the host as adlfs's ``_get_kwargs_from_urls`` takes it (``*.dfs`` / ``*.blob`` under
    ``core.windows.net``); without it, adlfs would need ``AZURE_STORAGE_ACCOUNT_NAME`` although the URL names
    the account. Paths are then ``container/key``, which is how adlfs names what it lists."""
    container, _, host = authority.partition("@")
    m = re.fullmatch(r"([^.]+)\.(?:dfs|blob)\.core\.windows\.net", host.lower())
    return container, (m.group(1) if m else None)


def _one_azure_attempt(fs: Any) -> None:
    """Turn off the Azure SDK's own retries on adlfs's service client (the container and blob clients it derives
    share its policies): `retry.call` alone retries, and counts what it retried. adlfs builds the client without
    passing retry options, and azure-storage-blob's default (`ExponentialRetry`: 3 retries after 15, 18 and 24 s)
    made every request to an unreachable or failing endpoint take a minute, five minutes with `retry.call`'s
    attempts. The policy objects are reached through the client's pipeline, which has no public accessor."""
    pipeline = getattr(getattr(fs, "service_client", None), "_pipeline", None)
    for policy in getattr(pipeline, "_impl_policies", ()):
        if hasattr(policy, "total_retries") and hasattr(policy, "retry_to_secondary"):  # StorageRetryPolicy
            for attr in ("total_retries", "connect_retries", "read_retries", "status_retries"):
                setattr(policy, attr, 0)


async def _azure_read(fs: Any, path: str, start: int, end: int, etag: str) -> bytes:
    """Bytes [start, end) of a blob, If-Match `etag` (a rewritten blob answers 412 -> `ObjectChanged`): adlfs's
    own ``_cat_file`` with the SDK's precondition (``etag`` + ``MatchConditions.IfNotModified``) added."""
    conditions: Any = importlib.import_module("azure.core").MatchConditions
    container, blob, _ = fs.split_path(path)
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        stream = await client.download_blob(offset=start, length=end - start, etag=etag,
                                            match_condition=conditions.IfNotModified)
        data: bytes = await stream.readall()
        return data


async def _read_parts(body: Any, size: int) -> tuple[list[bytes], Exception | None]:
    """The next parts of a streaming body, `size` bytes in all at most (none at its end), and the error that
    stopped it early, if any. The aiohttp stream answers what it has buffered (~64-256 KiB a read): the parts are
    gathered on the loop and cross to the caller's thread together, one hand-over per `size` bytes, without being
    copied into one."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        try:
            part = await body.read(size - got)
        except Exception as e:  # noqa: BLE001 - raised by the caller after the parts that arrived before it
            return parts, e
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts, None


async def _close(body: Any) -> None:
    """Release the body's connection on the loop that owns it (to the pool once read to the end, else closed)."""
    body.close()
