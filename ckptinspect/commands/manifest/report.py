"""Reading verification reports back: `merge_reports` combines the JSON documents of N shard runs (`manifest
verify --shard K/N`) into one verdict. The report types are `ckptinspect.services.integrity_report`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptinspect.services.integrity_report import FileResult, ManifestReport
from ckptinspect.findings import CODES, Finding, status_of


# --- merging shard reports -------------------------------------------------------------------------------------------


def _finding_from(d: Any) -> Finding | None:
    if not isinstance(d, Mapping) or d.get("code") not in CODES or not isinstance(d.get("message"), str):
        return None
    subject, path, details = d.get("subject"), d.get("path"), d.get("details")
    return Finding(str(d["code"]), d["message"], subject if isinstance(subject, str) else None,
                   path if isinstance(path, str) else None, dict(details) if isinstance(details, Mapping) else {})


def _file_from(d: Any) -> FileResult | None:
    if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not isinstance(d.get("expected"), str):
        return None
    actual, size = d.get("actual"), d.get("size")
    return FileResult(d["name"], d["expected"], actual if isinstance(actual, str) else None,
                      size if isinstance(size, int) else None, d.get("ok") is True)


def merge_reports(reports: Sequence[Mapping[str, Any]]) -> ManifestReport:
    """One verdict from the `to_dict()` reports of the N shard runs (`--shard K/N`), or of one full run.

    Reports that cannot be combined are CK404 findings, never exceptions: a shard K of N absent or present twice,
    shard counts N that differ, reports of different manifests, a report that is not a report.
    """
    findings: list[Finding] = []
    seen: set[tuple[str, str | None, str]] = set()
    files: list[FileResult] = []
    checked = hashed = 0
    shards: dict[tuple[int, int], int] = {}
    counts: set[int] = set()
    manifests: set[tuple[Any, Any]] = set()

    labels = {r.get("path") for r in reports if isinstance(r, Mapping)}
    label = labels.pop() if len(labels) == 1 else None
    where = label if isinstance(label, str) else None

    def problem(message: str, **details: Any) -> None:
        findings.append(Finding("CK404", message, None, where, details))

    for i, rep in enumerate(reports):
        fc, bh = (rep.get("files_checked"), rep.get("bytes_hashed")) if isinstance(rep, Mapping) else (None, None)
        if not isinstance(fc, int) or not isinstance(bh, int) or not isinstance(rep.get("findings"), list):
            problem(f"report #{i} is not a manifest verify report", report=i)
            continue
        raw_shard = rep.get("shard")
        k, n = (raw_shard[0], raw_shard[1]) if isinstance(raw_shard, (list, tuple)) and len(raw_shard) == 2 else (0, 1)
        if not (isinstance(k, int) and isinstance(n, int) and 0 <= k < n):
            problem(f"report #{i} has an invalid shard {raw_shard!r}", report=i)
            continue
        if (k, n) in shards:
            problem(f"shard {k}/{n} reported more than once (reports #{shards[k, n]} and #{i})", shard=[k, n])
            continue
        shards[k, n] = i
        counts.add(n)
        manifests.add((rep.get("manifest"), rep.get("manifest_sha256")))
        checked, hashed = checked + fc, hashed + bh
        for fd in rep["findings"]:
            f = _finding_from(fd)
            if f is None:
                problem(f"report #{i} holds an unreadable finding", report=i, finding=repr(fd)[:200])
            elif (f.code, f.subject, f.message) not in seen:
                seen.add((f.code, f.subject, f.message))
                findings.append(f)
        files += [r for r in map(_file_from, rep.get("files") or ()) if r is not None]
    if not shards:
        problem("no shard reports to merge")
    elif len(counts) > 1:
        problem(f"shard reports disagree on the shard count: {sorted(counts)}", counts=sorted(counts))
    else:
        n = counts.pop()
        missing = [k for k in range(n) if (k, n) not in shards]
        for k in missing:
            problem(f"shard {k}/{n} report missing: its files were not verified", shard=[k, n])
    digests = {m[1] for m in manifests}
    if len(digests) > 1:
        problem("shard reports verified different manifests", manifests=sorted(str(m) for m in manifests))
    paths = {m[0] for m in manifests}
    mpath = paths.pop() if len(paths) == 1 else None
    mdigest = digests.pop() if len(digests) == 1 else None
    return ManifestReport(status_of(findings), tuple(findings), checked, hashed,
                          mpath if isinstance(mpath, str) else None, tuple(files), None,
                          mdigest if isinstance(mdigest, str) else None, where)
