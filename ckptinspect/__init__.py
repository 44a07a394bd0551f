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

from typing import TYPE_CHECKING, Any

from ckptinspect._version import __version__
from ckptinspect.api import (
    audit,
    coverage,
    diff,
    estimate,
    info,
    ls,
    merge_manifest_reports,
    merge_values_reports,
    read,
    resume,
    retain,
    scan,
    sniff,
    values,
    verify_manifest,
    watch,
    write_manifest,
)
from ckptinspect.errors import BrokenSaveDir, CkptInspectError, LimitExceeded, ReadError, StorageError, UsageError
from ckptinspect.findings import FailOn, FailOnLike, Finding, Severity, Status
from ckptinspect.model import (
    Checkpoint,
    Chunk,
    FileInfo,
    FileRole,
    Format,
    Kind,
    ObjectItem,
    ShardedBackend,
    Stack,
    StoredItem,
    Tensor,
    Topology,
)
from ckptinspect.model.chunk_table import ChunkTable
from ckptinspect.results import (
    AuditResult,
    CoverageResult,
    DiffResult,
    EstimateResult,
    InfoResult,
    LsResult,
    ManifestResult,
    ResumeResult,
    RetainResult,
    ScanResult,
    SniffResult,
    ValuesResult,
    WrittenManifestResult,
)

if TYPE_CHECKING:
    from ckptinspect.commands.estimate.describe import GptDescription
    from ckptinspect.commands.resume.model import Outcome, Verdict
    from ckptinspect.formats.sniff import SniffState

# Imported on first use (`ckptinspect.Verdict`): each pulls in a layer that `import ckptinspect` should not pay for.
_LAZY = {"GptDescription": "ckptinspect.commands.estimate.describe", "Verdict": "ckptinspect.commands.resume.model",
         "Outcome": "ckptinspect.commands.resume.model", "SniffState": "ckptinspect.formats.sniff"}


def __getattr__(name: str) -> Any:
    """`GptDescription` (the model description `estimate` takes) and the verdict enums of `resume` and `sniff` are
    imported on first use: they pull in the estimate arithmetic, the resume rules and the readers."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ckptinspect' has no attribute {name!r}")


__all__ = [
    "__version__",
    # one function per command
    "sniff", "read", "ls", "info", "audit", "diff", "resume", "coverage", "verify_manifest", "write_manifest",
    "merge_manifest_reports", "scan", "estimate", "retain", "values", "merge_values_reports",
    "watch",
    # values
    "Status", "Severity", "Finding", "FailOn", "FailOnLike", "GptDescription",
    # verdict enums: a sniff's state, a resume's verdict and each component's outcome
    "SniffState", "Verdict", "Outcome",
    # the neutral model `read()` returns
    "Checkpoint", "Tensor", "Chunk", "ChunkTable", "StoredItem", "ObjectItem", "FileInfo", "FileRole", "Topology",
    "Format", "Kind", "Stack", "ShardedBackend",
    # results
    "SniffResult", "LsResult", "InfoResult", "AuditResult", "DiffResult", "ResumeResult", "CoverageResult",
    "ManifestResult", "WrittenManifestResult", "ScanResult", "EstimateResult", "RetainResult",
    "ValuesResult",
    # errors
    "CkptInspectError", "UsageError", "BrokenSaveDir", "ReadError", "LimitExceeded", "StorageError",
]
