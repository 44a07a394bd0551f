"""What verifying an integrity manifest returns (`FileResult`, `ManifestReport`) and its JSON form;
`sizes_from_report` takes the sizes of the files an earlier run found matching (from that JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.services.integrity_hashing import ALGORITHM
from ckptinspect.findings import Finding, Status


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
