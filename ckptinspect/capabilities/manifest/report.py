"""What verifying an integrity manifest returns (`FileResult`, `ManifestReport`), its JSON form, and reading that
JSON back: `merge_reports` combines the reports of N shard runs (`manifest verify --shard K/N`) into one verdict,
`sizes_from_report` takes the sizes of the files an earlier run found matching.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptinspect.capabilities.manifest.hashing import ALGORITHM
from ckptinspect.findings import CODES, Finding, Status, status_of


@dataclass(frozen=True, slots=True)
class FileResult:
    """The verdict on one manifest entry.

    name: the manifest key (a basename, or a relative POSIX path in a recursive manifest).
    expected: the digest the manifest lists.
    actual: the digest computed, or None when the file was not (fully) read.
    size: bytes on disk, or None when missing / not a regular file.
    ok: True when `actual == expected` (False when it was not hashed: `actual` is None).
    """

    name: str
    expected: str
    actual: str | None
    size: int | None
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "expected": self.expected, "actual": self.actual, "size": self.size, "ok": self.ok}


@dataclass(frozen=True, slots=True)
class ManifestReport:
    """Result of verifying one manifest (or one shard of it, or several merged shard reports).

    status: the status the findings imply (`complete` when everything verified or there is no manifest).
    findings: CK400–CK404 (and CK405 once it is in the code table), in the order they were found.
    files_checked: manifest entries judged by this run (missing ones included).
    bytes_hashed: bytes read through SHA-256.
    manifest_path: the manifest verified, None after a merge of reports that disagree.
    manifest_sha256: digest of the manifest's bytes, so shard reports can prove they verified the same manifest.
    files: per-entry results in manifest order.
    shard: ``(K, N)`` when only shard K of N was verified, None for a full run.
    path: the checkpoint as the user named it (the findings' `path`).
    """

    status: Status
    findings: tuple[Finding, ...]
    files_checked: int
    bytes_hashed: int
    manifest_path: str | None
    files: tuple[FileResult, ...] = ()
    shard: tuple[int, int] | None = None
    manifest_sha256: str | None = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The `manifest verify` JSON keys of docs/contract.md plus extras (`manifest`, `shard`, `files`, ...)."""
        return {
            "status": self.status.value,
            "findings": [f.to_dict() for f in self.findings],
            "files_checked": self.files_checked,
            "bytes_hashed": self.bytes_hashed,
            "path": self.path,
            "manifest": self.manifest_path,
            "manifest_sha256": self.manifest_sha256,
            "algorithm": ALGORITHM,
            "shard": list(self.shard) if self.shard is not None else None,
            "files": [r.to_dict() for r in self.files],
        }


def sizes_from_report(report: Mapping[str, Any]) -> dict[str, int]:
    """Sizes of the files an earlier `ManifestReport.to_dict()` found matching, for `verify_manifest(known_sizes=)`."""
    out: dict[str, int] = {}
    for r in report.get("files") or ():
        if isinstance(r, Mapping) and r.get("ok") is True and isinstance(r.get("size"), int):
            out[str(r.get("name"))] = int(r["size"])
    return out


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
