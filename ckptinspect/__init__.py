"""ckptinspect: inspect and validate distributed training checkpoints offline.

Reads Megatron-LM / Megatron-Core (`torch_dist`, legacy per-rank `torch`) and plain PyTorch DCP checkpoints into one
neutral model without torch, without a process group, and without executing code from the checkpoint.

The public API is `__all__`: one function per command (`ckptinspect.api`), each returning a frozen result
(`ckptinspect.results`) whose `to_dict()` is the command's `-o json` document and whose `exit_code()` is the CLI's::

    import ckptinspect

    r = ckptinspect.audit("/ckpts/run42")
    if r.exit_code(fail_on="error"):
        raise SystemExit(f"not promoting: {r.status.value}")

Importing `ckptinspect` is cheap and never imports torch: each function imports what it needs when called.
"""

from __future__ import annotations

from ckptinspect._version import __version__
from ckptinspect.api import (
    audit,
    coverage,
    diff,
    merge_manifest_reports,
    read,
    resume,
    scan,
    sniff,
    verify_manifest,
    write_manifest,
)
from ckptinspect.errors import BrokenSaveDir, CkptInspectError, UsageError
from ckptinspect.findings import Finding, Severity, Status
from ckptinspect.results import (
    AuditResult,
    CoverageResult,
    DiffResult,
    FailOn,
    ManifestResult,
    ResumeResult,
    ScanResult,
    SniffResult,
    WrittenManifestResult,
)

__all__ = [
    "__version__",
    # one function per command
    "sniff", "read", "audit", "diff", "resume", "coverage", "verify_manifest", "write_manifest",
    "merge_manifest_reports", "scan",
    # values
    "Status", "Severity", "Finding", "FailOn",
    # results
    "SniffResult", "AuditResult", "DiffResult", "ResumeResult", "CoverageResult", "ManifestResult",
    "WrittenManifestResult", "ScanResult",
    # errors
    "CkptInspectError", "UsageError", "BrokenSaveDir",
]
