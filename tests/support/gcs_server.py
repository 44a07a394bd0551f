"""A real GCS JSON API server on the loopback interface for the `gs://` tests: `gcp-storage-emulator` (in memory,
port 0 = a free port on 127.0.0.1), reached by the real gcsfs client the way users reach an emulator
(``STORAGE_EMULATOR_HOST``; gcsfs then sends no credentials).

gcsfs ≥2025.x first asks the gRPC storage-control API whether a bucket is hierarchical (HNS / zonal); the emulator
speaks only the JSON API, so that probe would time out (60 s per bucket) before gcsfs falls back to the plain
JSON filesystem it uses anyway. ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (read when gcsfs is imported) skips the
probe.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from s3_server import free_port, scoped_env, upload_tree

GCS_BUCKET = "ckpts"
_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


@dataclass(frozen=True)
class GcsServer:
    endpoint: str
    bucket: str
    fs: Any  # gcsfs.GCSFileSystem

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=GCS_BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with scoped_env(("STORAGE_EMULATOR_HOST", *_ENV)):
        os.environ.update(STORAGE_EMULATOR_HOST=endpoint, **_ENV)
        import fsspec

        fs = fsspec.filesystem("gcs", skip_instance_cache=True, use_listings_cache=False)
        try:
            yield GcsServer(endpoint, GCS_BUCKET, fs)
        finally:
            server.stop()


def upload_gcs(server: GcsServer, root: Path, prefix: str) -> None:
    """Upload the tree `root` under `prefix/` (symlinks followed, as a copy tool would)."""
    upload_tree(server.fs, server.bucket, root, prefix)
