"""Storage events of one checkpoint as findings (CK220-CK224), and the retry summary (CK225)."""

from __future__ import annotations

from pathlib import Path

from ckptinspect.findings import Finding
from ckptinspect.storage.objpath import ObjectPath
from ckptinspect.storage.session import session


def storage_findings(path: Path, label: str) -> tuple[Finding, ...]:
    """The CK22x findings of objects under `path` read so far (each reported once). Nothing for a local path."""
    if not isinstance(path, ObjectPath):
        return ()
    out = [Finding(e.code, e.message, e.name, label, {"url": e.url, **e.details})
           for e in session().drain(path.url)]
    snap = session().stats.snapshot()
    if snap.retries and not session().retries_reported:
        session().retries_reported = True
        out.append(Finding("CK225", f"{snap.retries} storage request(s) retried after throttling, 5xx or timeouts "
                           f"({snap.failures} failed for good)", None, label,
                           {"retries": snap.retries, "failed_requests": snap.failures}))
    return tuple(out)
