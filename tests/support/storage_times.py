"""What every object-storage backend's listing must carry: the objects' last-modified times."""

from __future__ import annotations


def mtimes_near_now(url: str) -> None:
    """The objects under `url` carry their last-modified times (the age rule of `formats/inflight.py` reads them
    for a save being uploaded) and the prefix carries the newest of them."""
    import time

    from ckptinspect.formats.inflight import newest_mtime
    from ckptinspect.io import location

    prefix = location(url)
    times = [c.last_modified() for c in prefix.iterdir() if c.is_file()]
    assert times and all(t is not None and abs(time.time() - t) < 300 for t in times), times
    assert newest_mtime(prefix) == max(t for t in times if t is not None)
    assert prefix.last_modified() is None  # a prefix has no time of its own

