"""pytest plugin (entry point `pytest11`): release gates for checkpoints inside a test suite.

    def test_release_checkpoint(ckpt_audit):
        r = ckpt_audit("/ckpts/run42")            # an AuditResult (ckptinspect.audit)
        assert r.status is ckptinspect.Status.COMPLETE

    from ckptinspect.pytest_plugin import assert_checkpoint

    def test_promote():
        assert_checkpoint("/ckpts/run42", fail_on="warning")   # fails listing the findings like the text report

Registered with pytest by the package's `pytest11` entry point. Loading it imports only `ckptinspect.api` (no
readers, no torch); the audit runs when a test asks for it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ckptinspect.api import PathLike, audit
from ckptinspect.findings import FailOnLike, fail_severity
from ckptinspect.results import AuditResult


class CheckpointFailed(AssertionError):
    """`assert_checkpoint` failed: the message lists the findings at or above `fail_on`."""

    def __init__(self, message: str, result: AuditResult) -> None:
        super().__init__(message)
        self.result = result


def failure_message(result: AuditResult, fail_on: FailOnLike = "error", width: int = 120) -> str:
    """The verdict line and the findings table of the text report, as plain text."""
    from rich.console import Console

    from ckptinspect.render.text import render_findings

    sev = fail_severity(fail_on)
    failing = [f for f in result.deciding_findings if sev is not None and f.severity.rank >= sev.rank]
    console = Console(width=width, no_color=True, highlight=False, record=True, file=io.StringIO())
    console.print(render_findings(failing))
    return (f"checkpoint {result.report.path}: {result.status.value}, {len(failing)} finding(s) at or above "
            f"{sev.value if sev else 'never'}\n" + console.export_text())


def assert_checkpoint(path: PathLike, fail_on: FailOnLike = "error", *, deep: bool = False,
                      all_iterations: bool = False, manifest: PathLike | None = None, select: Sequence[str] = (),
                      ignore: Sequence[str] = ()) -> AuditResult:
    """Audit `path`; raise `CheckpointFailed` (an AssertionError) when `ckptinspect audit` would exit 1."""
    result = audit(path, deep=deep, all_iterations=all_iterations, manifest=manifest, select=select, ignore=ignore)
    if result.exit_code(fail_on):
        raise CheckpointFailed(failure_message(result, fail_on), result)
    return result


@pytest.fixture
def ckpt_audit() -> Callable[..., AuditResult]:
    """`ckpt_audit(path, **audit_options) -> AuditResult`: `ckptinspect.audit`, for tests that inspect the result."""

    def run(path: PathLike, **options: Any) -> AuditResult:
        return audit(path, **options)

    return run


@pytest.fixture
def ckpt_assert() -> Callable[..., AuditResult]:
    """`ckpt_assert(path, fail_on="error", **audit_options)`: `assert_checkpoint` as a fixture."""
    return assert_checkpoint
