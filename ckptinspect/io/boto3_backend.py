"""Backend for ``s3://`` over boto3 (the `[s3]` extra), the client S3 users already have.

Why not s3fs: s3fs needs aiobotocore, and every aiobotocore release pins botocore to a few patch releases
(aiobotocore 3.10.0: ``botocore>=1.43.115,<1.43.118``), so `pip install 'ckptinspect[s3]' boto3` was
`ResolutionImpossible` whenever boto3 was newer than aiobotocore (boto3 1.44.x: no aiobotocore release allows
botocore 1.44), and s3fs's ``[boto3]`` extra is gone. boto3 itself has no such pin. s3fs is still used when it is
installed and boto3 is not (`session._make_backend`).

The requests are the ones the s3fs path made: ListObjectsV2 one page (1000 keys) per request, HeadObject only for a
path nobody listed, GetObject with ``Range`` and ``If-Match`` the listed ETag (a replaced object answers 412 ->
`ObjectChanged`), a streamed GetObject for `manifest verify` (one request per object, ``Range: bytes=N-`` only to
resume), PutObject for `manifest write --out`. botocore's own retries are off (one attempt): `retry.call` alone
retries, and counts what it retried.

Credentials and endpoints come the ecosystem's way (AWS env vars and profiles, ``AWS_ENDPOINT_URL``), and
``--storage-option`` takes s3fs's option names, so the options users pass keep their meaning: ``key``, ``secret``,
``token``, ``profile``, ``endpoint_url``, ``anon``, ``requester_pays``, ``use_ssl``, ``client_kwargs.*`` (boto3
client arguments: ``endpoint_url``, ``region_name``, ``verify``, ...) and ``config_kwargs.*`` (botocore ``Config``:
``read_timeout``, ``connect_timeout``, ...). Another name is a configuration error (exit 2).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from ckptinspect.io.backend import Fault, Listing, ObjectInfo, posix_time, s3_list_page
from ckptinspect.io.faults import classify

LIST_PAGE_KEYS = 1000  # entries per S3 listing page (the API's maximum)
STREAM_PIECE = 256 << 10  # a streamed body is handed over in pieces of this size (the caller's chunk if smaller)
POOL_CONNECTIONS = 32  # botocore's default is 10: more parallel reads than that would queue for a connection
_IGNORED = frozenset({"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "default_block_size",
                      "default_fill_cache", "default_cache_type", "cache_regions"})  # s3fs / fsspec caching only


def _etag(entry: Mapping[str, Any]) -> str | None:
    v = entry.get("ETag")
    return str(v) if v not in (None, "") else None


class Boto3Backend:
    """One bucket through a boto3 S3 client."""

    def __init__(self, bucket: str, options: Mapping[str, Any]) -> None:
        boto3: Any = importlib.import_module("boto3")
        botocore_config: Any = importlib.import_module("botocore.config")
        self.root = bucket
        opts = dict(options)
        unknown = sorted(set(opts) - _IGNORED - {"key", "secret", "token", "profile", "endpoint_url", "anon",
                                                 "requester_pays", "use_ssl", "client_kwargs", "config_kwargs"})
        if unknown:
            raise TypeError(f"unknown s3 storage option(s) {', '.join(unknown)}")
        config: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"},  # one attempt
                                  "connect_timeout": 10, "read_timeout": 60,
                                  # one connection per stream: 16 hashing threads, 16 prefetch threads of a scan
                                  "max_pool_connections": POOL_CONNECTIONS}
        extra_config = opts.get("config_kwargs") or {}
        if not isinstance(extra_config, Mapping):
            raise TypeError("config_kwargs: expected keys (config_kwargs.read_timeout=5)")
        config.update(extra_config)
        if opts.get("anon") is True:
            config["signature_version"] = importlib.import_module("botocore").UNSIGNED
        client_kwargs: dict[str, Any] = {}
        if opts.get("endpoint_url") is not None:
            client_kwargs["endpoint_url"] = str(opts["endpoint_url"])
        if opts.get("use_ssl") is not None:
            client_kwargs["use_ssl"] = bool(opts["use_ssl"])
        more = opts.get("client_kwargs") or {}
        if not isinstance(more, Mapping):
            raise TypeError("client_kwargs: expected keys (client_kwargs.region_name=x)")
        client_kwargs.update(more)
        session = boto3.session.Session(
            aws_access_key_id=opts.get("key"), aws_secret_access_key=opts.get("secret"),
            aws_session_token=opts.get("token"), profile_name=opts.get("profile"))
        self.client: Any = session.client("s3", config=botocore_config.Config(**config), **client_kwargs)
        self._extra: dict[str, Any] = {"RequestPayer": "requester"} if opts.get("requester_pays") else {}

    def list_page(self, key: str, token: str | None) -> tuple[Listing, str | None]:
        """One page (ListObjectsV2, up to 1000 entries) of the delimiter listing of ``key/``, and the next token."""
        kwargs: dict[str, Any] = {"Bucket": self.root, "Prefix": f"{key}/" if key else "", "Delimiter": "/",
                                  "MaxKeys": LIST_PAGE_KEYS, **self._extra}
        if token is not None:
            kwargs["ContinuationToken"] = token
        page: Mapping[str, Any] = self.client.list_objects_v2(**kwargs)
        prefix = kwargs["Prefix"]
        return s3_list_page(page, prefix)

    def list_dir(self, key: str) -> Listing:
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        token: str | None = None
        while True:
            page, token = self.list_page(key, token)
            files.update(page.files)
            dirs |= page.dirs
            if token is None:
                return Listing(files, frozenset(dirs))

    def head(self, key: str) -> ObjectInfo | None:
        if not key:
            return None  # the bucket itself is a dir
        try:
            e = self.client.head_object(Bucket=self.root, Key=key, **self._extra)
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError; 404 means "no such object"
            if classify(exc) is Fault.MISSING:
                return None
            raise
        return ObjectInfo(key.rsplit("/", 1)[-1], int(e.get("ContentLength") or 0), _etag(e),
                          posix_time(e.get("LastModified")))

    def read(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        if end <= start:
            return b""
        kwargs: dict[str, Any] = {"Bucket": self.root, "Key": key, "Range": f"bytes={start}-{end - 1}",
                                  **self._extra}
        if etag is not None:
            kwargs["IfMatch"] = etag  # a replaced object answers 412, not the new object's bytes
        body = self.client.get_object(**kwargs)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    @property
    def streams(self) -> bool:
        return True

    def stream(self, key: str, start: int, etag: str | None, chunk: int) -> Iterator[bytes]:
        """The object from `start` to its end: one GetObject (If-Match the listed ETag), its body read `chunk`
        bytes at a time. Closing the generator early drops the connection."""
        kwargs: dict[str, Any] = {"Bucket": self.root, "Key": key, **self._extra}
        if etag is not None:
            kwargs["IfMatch"] = etag
        if start > 0:
            kwargs["Range"] = f"bytes={start}-"
        body = self.client.get_object(**kwargs)["Body"]
        piece = min(chunk, STREAM_PIECE)
        try:
            while True:
                part = body.read(piece)  # what arrived before a failure was yielded: the resume starts after it
                if not part:
                    return
                yield part
        finally:
            body.close()

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.root, Key=key, Body=data, **self._extra)

    def classify(self, exc: BaseException) -> Fault:
        return classify(exc)
