"""Storage events of one checkpoint as findings: objects (CK220-CK224), the retry summary (CK225), and local files
or dirs that could not be read for access (CK209, noted by `io.local`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ckptinspect.errors import UNREAD_CODE
from ckptinspect.findings import Finding
from ckptinspect.io.local import Unread, take_unread
from ckptinspect.io.objpath import ObjectPath
from ckptinspect.io.session import session


def storage_findings(path: Path, label: str, reported: Iterable[Finding] = ()) -> tuple[Finding, ...]:
    """What storage did under `path` so far, as findings, each reported once: for a local path the CK209 of every
    file or dir noted unread (`io.local.note_unread`) and not already `reported` by a CK209 of its reader; for an
    object path the CK22x of its objects."""
    if not isinstance(path, ObjectPath):
        return unread_findings(path, label, reported)
    out = [Finding(e.code, e.message, e.name, label, {"url": e.url, **e.details})
           for e in session().drain(path.url)]
    snap = session().stats.snapshot()
    if snap.retries and not session().retries_reported:
        session().retries_reported = True
        out.append(Finding("CK225", f"{snap.retries} storage request(s) retried after throttling, 5xx or timeouts "
                           f"({snap.failures} failed for good)", None, label,
                           {"retries": snap.retries, "failed_requests": snap.failures}))
    return tuple(out)


def unread_findings(root: Path, label: str, reported: Iterable[Finding] = ()) -> tuple[Finding, ...]:
    """CK209 for every note at or under the local `root` (taken from the record): subjects relative to `root`."""
    notes = take_unread(root)
    if not notes:
        return ()
    have = [f for f in reported if f.code == UNREAD_CODE]
    out = []
    for n in notes:
        rel = _relative(n, root)
        if any(f.subject == rel or rel in f.message for f in have):
            continue  # the reader reported this failure itself (a `ReadError` raised from it)
        out.append(unread_finding(n, rel, label))
    return tuple(out)


def unread_finding(n: Unread, rel: str, label: str) -> Finding:
    """The one construction of a CK209 from a note."""
    kind = "directory" if n.op in ("list", "enter") else "file"
    shown = label if rel == "." else rel  # the checkpoint dir itself
    return Finding(UNREAD_CODE, f"{shown}: {n.reason}: {n.what}; the {kind} was not read, so the verdict on it is "
                   "missing", None if rel == "." else rel, label,
                   {"file": rel, "op": n.op, "errno": _errno_name(n.errno)})


def _relative(n: Unread, root: Path) -> str:
    top = os.path.normpath(os.path.abspath(root))
    if n.path == top:
        return "."
    return os.path.relpath(n.path, top).replace(os.sep, "/")


def _errno_name(num: int) -> str:
    import errno

    return errno.errorcode.get(num, str(num))
