"""Every byte the readers take: safe local reads, and object storage under the same `pathlib.Path` interface.

This package knows nothing of pickles or formats. The readers speak `pathlib.Path`: a local path stays a plain
`Path`; a URL (`s3://`, `gs://`, `az://` / `abfs://`, `msc://`, `file://`) becomes an `ObjectPath` whose directory
questions are answered from one cached listing per prefix and whose files open as ranged readers, so every reader
parses a bucket as it parses a disk.

- `local.py`: safe local opens (never block on a FIFO or a device, bounded reads, access failures noted for CK209);
  also the door an `ObjectPath` opens through.
- `url.py`: which backend a URL needs, and the extra that installs it.
- `backend.py`: the interface every backend implements, object info, the storage errors.
- `boto3_backend.py` (S3 over boto3), `fsspec_backend.py` (s3fs / gcsfs / adlfs), `msc_backend.py`
  (multi-storage-client): the backends.
- `faults.py`: client exceptions classified into `Fault`s; `retry.py`: bounded retries with backoff.
- `session.py`: per-process stores, listing cache, events that become findings; `stats.py`: transfer counters.
- `objpath.py`: the `Path` and the ranged reader; `prefetch.py`: parallel prefetch of small windows.
- `findings.py`: storage events (CK220-CK225) and unread local paths (CK209) as findings.
"""

from __future__ import annotations

from ckptinspect.io.url import is_url, location

__all__ = ["is_url", "location"]
