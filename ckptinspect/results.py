"""The results of the public API (`ckptinspect.api`): frozen, one per command.

Each has `.findings`, `.status` (or `.verdict`), `.to_json()` — the document `ckptinspect CMD -o json` prints, byte
for byte — `.to_dict()` (that document parsed) and `.exit_code(fail_on="error")` — the CLI's exit code. The
detailed result of the capability is `.report` (audit: per-checkpoint audits, save dir, summary; diff: args,
tensors, values; ...). The renderers are imported when a method needs them, so importing this module is cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

from ckptinspect.findings import Finding, Severity, Status, exceeds

if TYPE_CHECKING:
    from ckptinspect.capabilities.audit.audit import AuditReport
    from ckptinspect.capabilities.coverage.coverage import CoverageReport
    from ckptinspect.capabilities.diff.diff import DiffResult as _Diff
    from ckptinspect.capabilities.manifest.manifest import WrittenManifest
    from ckptinspect.checks.integrity_report import ManifestReport
    from ckptinspect.capabilities.resume.model import ResumePrediction, Verdict
    from ckptinspect.checks.safety_scan import ScanReport
    from ckptinspect.formats.sniff import SniffReport
    from ckptinspect.model import Format, Kind

FailOn = Union[Literal["error", "warning", "never"], Severity, None]
"""`--fail-on`: a severity name, a `Severity`, or "never" / None (exit 0 whatever the findings)."""

EXIT_OK, EXIT_FINDINGS = 0, 1


def fail_severity(fail_on: FailOn) -> Severity | None:
    """The severity at or above which findings fail (None = never); raises ValueError for an unknown name."""
    if fail_on is None or isinstance(fail_on, Severity):
        return fail_on
    if fail_on == "never":
        return None
    if fail_on in ("error", "warning", "info"):
        return Severity(fail_on)
    raise ValueError(f"fail_on={fail_on!r}: expected 'error', 'warning' or 'never'")


def _exit(findings: Iterable[Finding], fail_on: FailOn) -> int:
    return EXIT_FINDINGS if exceeds(findings, fail_severity(fail_on)) else EXIT_OK


def _doc(command: str, body: dict[str, Any]) -> str:
    from ckptinspect.render.json_doc import dumps, envelope

    return dumps(envelope(command, body))


class _Document:
    """`to_dict()` from `to_json()`: the parsed document, so it equals what a script reads from `-o json`."""

    __slots__ = ()

    def to_json(self) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.to_json())
        return doc


# --- results -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SniffResult(_Document):
    """`sniff PATH`: what PATH is (`report`: kind, format, evidence, generation, state). It has no findings."""

    report: SniffReport

    @property
    def kind(self) -> Kind:
        return self.report.kind

    @property
    def format(self) -> Format | None:
        return self.report.format

    @property
    def state(self) -> str:
        return self.report.state

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ()

    def to_json(self) -> str:
        return _doc("sniff", dict(self.report.to_dict()))

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return EXIT_OK


@dataclass(frozen=True, slots=True)
class AuditResult(_Document):
    """`audit PATH`: `status`, every finding, and `report` (per-checkpoint audits, save dir, summary)."""

    report: AuditReport

    @property
    def status(self) -> Status:
        return self.report.status

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Every finding: the save dir's, the picked checkpoint's, and the leftovers' (flattened)."""
        return self.report.findings

    @property
    def deciding_findings(self) -> tuple[Finding, ...]:
        """The findings the status and the exit code rest on (not those of leftover iterations)."""
        return self.report.gating_findings

    def to_json(self) -> str:
        from ckptinspect.render.json_doc import audit_doc, dumps

        return dumps(audit_doc(self.report))

    def to_markdown(self) -> str:
        from ckptinspect.render.markdown import audit_markdown

        return audit_markdown(self.report)

    def to_junit(self) -> str:
        from ckptinspect.render.junit import findings_junit

        return findings_junit(self.report.path, list(self.deciding_findings))

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return _exit(self.deciding_findings, fail_on)


@dataclass(frozen=True, slots=True)
class DiffResult(_Document):
    """`diff A B`: `blocking` (a resume or comparison would break), and `report` (args, tensors, objects, values)."""

    report: _Diff

    @property
    def blocking(self) -> bool:
        return self.report.blocking

    @property
    def identical(self) -> bool:
        return self.report.identical

    @property
    def verdict(self) -> str:
        """"blocking", "different" or "identical"."""
        return "blocking" if self.blocking else "identical" if self.identical else "different"

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ()

    def to_json(self) -> str:
        return _doc("diff", self.report.to_dict())

    def exit_code(self, fail_on: FailOn = "error") -> int:
        """1 for a blocking difference (0 with `fail_on="never"`), as `ckptinspect diff`."""
        return EXIT_FINDINGS if self.blocking and fail_severity(fail_on) is not None else EXIT_OK


@dataclass(frozen=True, slots=True)
class ResumeResult(_Document):
    """`resume CKPT --tp N --pp N ...`: `verdict` (ok / lossy / fails) and `report` (components, rules, vocab)."""

    report: ResumePrediction

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ()

    def to_json(self) -> str:
        return _doc("resume", self.report.to_dict())

    def exit_code(self, fail_on: FailOn = "error") -> int:
        """1 when the resume fails (0 with `fail_on="never"`), as `ckptinspect resume`."""
        from ckptinspect.capabilities.resume.model import Verdict

        fails = self.report.verdict is Verdict.FAILS
        return EXIT_FINDINGS if fails and fail_severity(fail_on) is not None else EXIT_OK


@dataclass(frozen=True, slots=True)
class ManifestResult(_Document):
    """`manifest verify` (or `merge`): `status`, findings, and `report` (files checked, bytes hashed, per file)."""

    report: ManifestReport
    command: str = "manifest verify"

    @property
    def status(self) -> Status:
        return self.report.status

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings

    def to_json(self) -> str:
        return _doc(self.command, self.report.to_dict())

    def to_junit(self) -> str:
        from ckptinspect.render.junit import findings_junit

        return findings_junit(self.command, list(self.findings))

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return _exit(self.findings, fail_on)


@dataclass(frozen=True, slots=True)
class WrittenManifestResult(_Document):
    """`manifest write`: where the manifest went and what it lists (`written`)."""

    written: WrittenManifest
    path: str

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ()

    def to_json(self) -> str:
        w = self.written
        return _doc("manifest write", {"path": self.path, "manifest": w.path, "files": dict(w.files),
                                       "bytes_hashed": w.bytes_hashed})

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return EXIT_OK


@dataclass(frozen=True, slots=True)
class ScanResult(_Document):
    """`scan PATH`: `status`, findings, and `report` (every pickle found, with its globals)."""

    report: ScanReport

    @property
    def status(self) -> Status:
        return self.report.status

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings

    def to_json(self) -> str:
        return _doc("scan", self.report.to_dict())

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return _exit(self.findings, fail_on)


@dataclass(frozen=True, slots=True)
class CoverageResult(_Document):
    """`coverage CKPT [KEY...]`: `status`, findings, and `report` (per-tensor coverage, the picture of one tensor)."""

    report: CoverageReport

    @property
    def status(self) -> Status:
        return self.report.status

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings

    def to_json(self) -> str:
        return _doc("coverage", self.report.to_dict())

    def exit_code(self, fail_on: FailOn = "error") -> int:
        return _exit(self.findings, fail_on)
