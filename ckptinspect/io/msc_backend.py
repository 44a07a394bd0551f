"""Backend over NVIDIA's multi-storage-client for ``msc://profile/path`` (what Megatron's ``--save msc://...`` uses).

The profile comes from MSC's own configuration (``MSC_CONFIG``, ``~/.msc_config.yaml``, ...), credentials from the
profile's provider. Reads use `StorageClient.read(path, byte_range=Range(offset, size))`, MSC's native ranged read
(its fsspec shim's ``cat_file`` ignores start/end and reads whole objects). MSC has no conditional read: a replaced
object is only noticed if its size changed.

MSC 1.3's public API has no streamed read of an object (``read`` returns the whole object or range as bytes;
``download_file`` into a file object holds objects up to its 64 MiB multipart threshold in memory and splits larger
ones into parallel 32 MiB ranged GETs): `streams` is False, and the store reads whole objects for `manifest verify`
in consecutive ranged blocks (the same bounded blocks MSC's own ``RemoteFileReader`` makes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ckptinspect.io.backend import Fault, Listing, ObjectInfo, posix_time
from ckptinspect.io.faults import classify


def _mtime(meta: Any) -> float | None:
    """An MSC `ObjectMetadata`'s last-modified time (None where the provider gives none)."""
    return posix_time(getattr(meta, "last_modified", None))


class MscBackend:
    """One MSC profile."""

    def __init__(self, profile: str) -> None:
        import importlib

        msc: Any = importlib.import_module("multistorageclient")
        self.profile = profile
        # One StorageClient per profile, from MSC's own config (MSC_CONFIG, ~/.msc_config.yaml); unknown → raises.
        self.client: Any = msc.StorageClient(msc.StorageClientConfig.from_file(profile=profile))

    def list_dir(self, key: str) -> Listing:
        prefix = f"{key}/" if key else ""
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        for m in self.client.list(prefix, include_directories=True):
            name = str(m.key).rstrip("/")
            base = name[len(prefix):] if name.startswith(prefix) else name.rsplit("/", 1)[-1]
            if not base or "/" in base:
                continue
            if getattr(m, "type", "file") == "directory":
                dirs.add(base)
            else:
                files[base] = ObjectInfo(base, int(m.content_length), m.etag, _mtime(m))
        return Listing(files, frozenset(dirs))

    def list_page(self, key: str, token: str | None) -> tuple[Listing, str | None]:
        """The whole listing as one page: MSC's `list` paginates inside the client (so it counts as one request)."""
        return self.list_dir(key), None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            m = self.client.info(key)
        except FileNotFoundError:
            return None
        if getattr(m, "type", "file") == "directory":
            return None
        return ObjectInfo(key.rsplit("/", 1)[-1], int(m.content_length), m.etag, _mtime(m))

    def read(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        from multistorageclient.types import Range

        if end <= start:
            return b""
        return bytes(self.client.read(key, byte_range=Range(offset=start, size=end - start)))

    @property
    def streams(self) -> bool:
        return False

    def stream(self, key: str, start: int, etag: str | None, chunk: int) -> Iterator[bytes]:
        raise NotImplementedError("msc:// has no streamed read (`streams` is False): read in ranged blocks")

    def write(self, key: str, data: bytes) -> None:
        self.client.write(key, data)

    def classify(self, exc: BaseException) -> Fault:
        return classify(exc)
