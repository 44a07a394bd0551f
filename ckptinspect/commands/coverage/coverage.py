"""`coverage CKPT [KEY...]`: per-tensor chunk coverage of one checkpoint, and the chunk-grid picture of one tensor.

The arithmetic is the coverage check's (`checks/coverage.py`); this module selects the tensors, filters the findings
(`--select` / `--ignore`, as `audit` does) and derives the status from what is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ckptinspect.commands.coverage.picture import ChunkPicture, chunk_picture
from ckptinspect.checks.coverage import TensorCoverage, findings_for, tensor_coverage
from ckptinspect.errors import UsageError
from ckptinspect.findings import Finding, Status, filter_findings, status_of
from ckptinspect.model import Checkpoint


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Coverage of the selected tensors; `picture` when exactly one tensor is covered.

    findings: the reader's findings on the checkpoint, then the coverage findings (CK301-CK304), filtered.
    """

    path: str
    tensors: tuple[TensorCoverage, ...]
    findings: tuple[Finding, ...]
    picture: ChunkPicture | None
    status: Status

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "tensors": [c.to_dict() for c in self.tensors],
            "findings": [f.to_dict() for f in self.findings], "status": self.status.value,
            **({"picture": self.picture.to_dict()} if self.picture is not None else {}),
        }


def coverage(ckpt: Checkpoint, keys: Iterable[str] = (), select: Iterable[str] = (),
             ignore: Iterable[str] = ()) -> CoverageReport:
    """Coverage of `keys` (every tensor when empty). Raises `UsageError` for a key the checkpoint does not hold."""
    wanted = list(keys)
    tensors = list(ckpt.tensors)
    if wanted:
        by_key = {t.key: t for t in tensors}
        missing = [k for k in wanted if k not in by_key]
        if missing:
            raise UsageError(f"no tensor named {missing[0]!r} in {ckpt.path} ({len(tensors)} tensors; see `info`)")
        tensors = [by_key[k] for k in wanted]
    covs = tuple(tensor_coverage(t) for t in tensors)
    findings = list(ckpt.findings) + [f for c in covs for f in findings_for(c, ckpt.path)]
    kept = tuple(filter_findings(findings, select, ignore))
    picture = chunk_picture(tensors[0]) if len(tensors) == 1 else None
    return CoverageReport(ckpt.path, covs, kept, picture, status_of(kept))
