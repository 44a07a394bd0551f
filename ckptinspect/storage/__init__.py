"""Object storage under the readers: `s3://`, `gs://`, `az://` / `abfs://`, `msc://` and `file://` locations.

The readers speak `pathlib.Path`. A URL becomes an `ObjectPath` (a `Path` whose directory questions are answered
from one cached listing per prefix and whose files open as ranged readers), so the parsing code of every reader is
the same for a bucket as for a disk. Local paths stay plain `Path` objects: nothing changes for them.

Modules: `url.py` (which backend a URL needs, and the extra that installs it), `backend.py` (the interface every
backend implements, object info, the storage errors), `fsspec_backend.py` (s3fs / gcsfs / adlfs),
`msc_backend.py` (multi-storage-client), `retry.py` (bounded retries with backoff), `session.py` (per-process
stores, listing cache, transfer counters, events that become findings), `objpath.py` (the `Path` and the reader).
"""

from __future__ import annotations

from ckptinspect.storage.url import is_url, location

__all__ = ["is_url", "location"]
