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
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ckptinspect.errors import CkptInspectError
from ckptinspect.findings import EXIT_FINDINGS, EXIT_OK, FailOnLike, Finding, Status, exceeds, fail_severity
from ckptinspect.model import StrEnum

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ckptinspect.commands.audit.audit import AuditReport, IterationRow, Listing
    from ckptinspect.commands.audit.summary import Summary
    from ckptinspect.commands.coverage.coverage import CoverageReport
    from ckptinspect.commands.values.report import ValuesReport
    from ckptinspect.commands.diff.diff import DiffResult as _Diff
    from ckptinspect.commands.estimate import Estimate
    from ckptinspect.commands.manifest.manifest import WrittenManifest
    from ckptinspect.services.integrity_report import ManifestReport
    from ckptinspect.commands.resume.model import ResumePrediction, Verdict
    from ckptinspect.commands.retain import RetainPlan
    from ckptinspect.services.safety_scan import ScanReport
    from ckptinspect.formats.sniff import SniffReport, SniffState
    from ckptinspect.model import Checkpoint, Format, Kind

def _is_file(label: str) -> bool:
    """Whether the PATH a result is about is one file (SARIF locations are then relative to its dir)."""
    from ckptinspect.io import location

    try:
        return location(label).is_file()
    except (OSError, ValueError, CkptInspectError):
        return False


def _exit(findings: Iterable[Finding], fail_on: FailOnLike) -> int:
    return EXIT_FINDINGS if exceeds(findings, fail_severity(fail_on)) else EXIT_OK


class _Report(Protocol):
    """What a findings-bearing capability report offers: a status, its findings, its JSON body."""

    @property
    def status(self) -> Status: ...

    @property
    def findings(self) -> tuple[Finding, ...]: ...

    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Report)


class _Result:
    """What every result shares: `to_json()` (the envelope around `_body()`, printed as the CLI prints it),
    `to_dict()` (that document parsed, so it equals what a script reads from `-o json`), `findings` (none unless the
    command yields findings) and `exit_code(fail_on)` (1 when a deciding finding is at or above `fail_on`)."""

    __slots__ = ()
    COMMAND: ClassVar[str]
    # The `--output` formats this result renders itself in: `to_text()` (a rich renderable; a plain str is printed as
    # is), `to_json()`, and `to_markdown()` / `to_junit()` / `to_sarif()` / `to_html()` where listed. The CLI asks
    # nothing else.
    OUTPUTS: ClassVar[tuple[str, ...]] = ("text", "json")

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ()

    @property
    def deciding_findings(self) -> tuple[Finding, ...]:
        """The findings the exit code rests on (all of them unless a result says otherwise)."""
        return self.findings

    def _command(self) -> str:
        return self.COMMAND

    def _body(self) -> dict[str, Any]:
        raise NotImplementedError

    def _document(self) -> dict[str, Any]:
        from ckptinspect.render.json_doc import envelope

        return envelope(self._command(), self._body())

    def to_json(self) -> str:
        from ckptinspect.render.json_doc import dumps

        return dumps(self._document())

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.to_json())
        return doc

    def exit_code(self, fail_on: FailOnLike = "error") -> int:
        return _exit(self.deciding_findings, fail_on)

    def to_text(self) -> RenderableType:
        raise NotImplementedError


class _ReportResult(_Result, Generic[R]):
    """A result around a capability report that has a status and findings: `status`, `findings` and the JSON body
    are the report's."""

    __slots__ = ()
    report: R

    @property
    def status(self) -> Status:
        return self.report.status

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings

    def _body(self) -> dict[str, Any]:
        return self.report.to_dict()


# --- results -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SniffResult(_Result):
    """`sniff PATH`: what PATH is (`report`: kind, format, evidence, generation, state). It has no findings."""

    COMMAND = "sniff"
    report: SniffReport

    @property
    def kind(self) -> Kind:
        return self.report.kind

    @property
    def format(self) -> Format | None:
        return self.report.format

    @property
    def state(self) -> SniffState:
        return self.report.state

    def _body(self) -> dict[str, Any]:
        return dict(self.report.to_dict())

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_sniff

        return render_sniff(self.report)


@dataclass(frozen=True, slots=True)
class LsResult(_Result):
    """`ls SAVE_DIR`: every iteration dir (`iterations`: format, status, size, files, tracked) and the save dir's
    findings (tracker, leftovers); `report` is the listing."""

    COMMAND = "ls"
    report: Listing

    @property
    def iterations(self) -> tuple[IterationRow, ...]:
        return self.report.iterations

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings

    def _document(self) -> dict[str, Any]:
        from ckptinspect.render.json_doc import ls_doc

        return ls_doc(self.report)

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_ls

        return render_ls(self.report)


@dataclass(frozen=True, slots=True)
class InfoResult(_Result):
    """`info CKPT`: the checkpoint as read (`checkpoint`: format, iteration, topology, tensors, objects, files, args)
    with its byte `summary`, and the findings of the reader itself (`ckptinspect.audit` runs the checks)."""

    COMMAND = "info"
    checkpoint: Checkpoint
    summary: Summary

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.checkpoint.findings

    def _document(self) -> dict[str, Any]:
        from ckptinspect.render.json_doc import info_doc

        return info_doc(self.checkpoint, self.summary)

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_info

        return render_info(self.checkpoint, self.summary)


@dataclass(frozen=True, slots=True)
class AuditResult(_Result):
    """`audit PATH`: `status`, every finding, and `report` (per-checkpoint audits, save dir, summary)."""

    COMMAND = "audit"
    OUTPUTS = ("text", "json", "markdown", "junit", "sarif", "html")
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

    def _document(self) -> dict[str, Any]:
        from ckptinspect.render.json_doc import audit_doc

        return audit_doc(self.report)

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_audit

        return render_audit(self.report)

    def to_markdown(self) -> str:
        from ckptinspect.render.markdown import audit_markdown

        return audit_markdown(self.report)

    def to_junit(self) -> str:
        from ckptinspect.render.junit import findings_junit

        return findings_junit(self.report.path, list(self.deciding_findings))

    def to_sarif(self) -> str:
        """The SARIF 2.1.0 log `ckptinspect audit -o sarif` prints (leftover iterations' findings informational)."""
        from ckptinspect.render.sarif import sarif_document, sarif_text

        r = self.report
        props = {"kind": r.kind.value, "format": r.format.value if r.format else None, "iteration": r.iteration,
                 "picked": r.picked.name if r.save_dir is not None and r.picked else None}
        return sarif_text(sarif_document("audit", r.path, r.status, r.findings,
                                         deciding={id(f) for f in self.deciding_findings},
                                         root_is_file=_is_file(r.path), properties=props))

    def to_html(self) -> str:
        """The self-contained HTML report `ckptinspect audit -o html` prints (render/html.py)."""
        from ckptinspect.render.html import audit_html

        return audit_html(self.report)


class DiffVerdict(StrEnum):
    """`DiffResult.verdict`."""

    BLOCKING = "blocking"  # a resume or comparison would break
    DIFFERENT = "different"  # differences, none blocking
    IDENTICAL = "identical"


@dataclass(frozen=True, slots=True)
class DiffResult(_Result):
    """`diff A B`: `blocking` (a resume or comparison would break), and `report` (args, tensors, objects, values)."""

    COMMAND = "diff"
    OUTPUTS = ("text", "json", "html")
    report: _Diff

    @property
    def blocking(self) -> bool:
        return self.report.blocking

    @property
    def identical(self) -> bool:
        return self.report.identical

    @property
    def verdict(self) -> DiffVerdict:
        return DiffVerdict.BLOCKING if self.blocking else DiffVerdict.IDENTICAL if self.identical \
            else DiffVerdict.DIFFERENT

    def _body(self) -> dict[str, Any]:
        return self.report.to_dict()

    def exit_code(self, fail_on: FailOnLike = "error") -> int:
        """1 for a blocking difference (0 with `fail_on="never"`), as `ckptinspect diff`."""
        return EXIT_FINDINGS if self.blocking and fail_severity(fail_on) is not None else EXIT_OK

    def to_text(self) -> RenderableType:
        from ckptinspect.render.diff_text import render_diff

        return render_diff(self.report)

    def to_html(self) -> str:
        """The self-contained HTML report `ckptinspect diff A B -o html` prints (render/html.py)."""
        from ckptinspect.render.html import diff_html

        return diff_html(self.report)


@dataclass(frozen=True, slots=True)
class ResumeResult(_Result):
    """`resume CKPT --tp N --pp N ...`: `verdict` (ok / lossy / fails) and `report` (components, rules, vocab)."""

    COMMAND = "resume"
    report: ResumePrediction

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict

    def _body(self) -> dict[str, Any]:
        return self.report.to_dict()

    def exit_code(self, fail_on: FailOnLike = "error") -> int:
        """1 when the resume fails (0 with `fail_on="never"`), as `ckptinspect resume`."""
        from ckptinspect.commands.resume.model import Verdict

        fails = self.report.verdict is Verdict.FAILS
        return EXIT_FINDINGS if fails and fail_severity(fail_on) is not None else EXIT_OK

    def to_text(self, explain: bool = False) -> RenderableType:
        """The verdict and the components; with `explain`, the rule table applied (`resume --explain`)."""
        from ckptinspect.render.resume_text import render_resume

        return render_resume(self.report, explain)


@dataclass(frozen=True, slots=True)
class ManifestResult(_ReportResult["ManifestReport"]):
    """`manifest verify` (or `merge`): `status`, findings, and `report` (files checked, bytes hashed, per file)."""

    COMMAND = "manifest verify"
    report: ManifestReport
    command: str = "manifest verify"
    OUTPUTS = ("text", "json", "junit", "sarif")

    def _command(self) -> str:
        return self.command

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_manifest_report

        return render_manifest_report(self.report)

    def to_junit(self) -> str:
        from ckptinspect.render.junit import findings_junit

        return findings_junit(self.command, list(self.findings))

    def to_sarif(self) -> str:
        """The SARIF 2.1.0 log `ckptinspect manifest verify -o sarif` prints."""
        from ckptinspect.render.sarif import sarif_document, sarif_text

        r = self.report
        root = r.path or next((f.path for f in r.findings if f.path), None) or (r.manifest_path or ".")
        props = {"manifest": r.manifest_path, "files_checked": r.files_checked, "bytes_hashed": r.bytes_hashed,
                 "shard": list(r.shard) if r.shard else None}
        return sarif_text(sarif_document(self.command, root, r.status, r.findings, root_is_file=_is_file(root),
                                         properties=props))


@dataclass(frozen=True, slots=True)
class WrittenManifestResult(_Result):
    """`manifest write`: where the manifest went and what it lists (`written`)."""

    COMMAND = "manifest write"
    written: WrittenManifest
    path: str

    def _body(self) -> dict[str, Any]:
        w = self.written
        return {"path": self.path, "manifest": w.path, "files": dict(w.files), "bytes_hashed": w.bytes_hashed}

    def to_text(self) -> RenderableType:
        w = self.written
        return f"wrote {w.path}: {len(w.files)} file(s), {w.bytes_hashed} bytes hashed"


@dataclass(frozen=True, slots=True)
class ScanResult(_ReportResult["ScanReport"]):
    """`scan PATH`: `status`, findings, and `report` (every pickle found, with its globals)."""

    COMMAND = "scan"
    report: ScanReport
    OUTPUTS = ("text", "json", "markdown", "junit", "sarif")

    def to_text(self) -> RenderableType:
        from ckptinspect.render.scan import render_scan

        return render_scan(self.report)

    def to_markdown(self) -> str:
        from ckptinspect.render.scan import scan_markdown

        return scan_markdown(self.report)

    def to_junit(self) -> str:
        from ckptinspect.render.junit import findings_junit

        return findings_junit(f"scan {self.report.path}", list(self.report.findings))

    def to_sarif(self) -> str:
        """The SARIF 2.1.0 log `ckptinspect scan -o sarif` prints (a pickle's file is relative to the scanned PATH)."""
        from ckptinspect.render.sarif import FileBase, sarif_document, sarif_text

        r = self.report
        return sarif_text(sarif_document("scan", r.path, r.status, r.findings, root_is_file=_is_file(r.path),
                                         file_base=FileBase.ROOT, properties={"pickles_scanned": r.pickles_scanned}))


@dataclass(frozen=True, slots=True)
class CoverageResult(_ReportResult["CoverageReport"]):
    """`coverage CKPT [KEY...]`: `status`, findings, and `report` (per-tensor coverage, the picture of one tensor)."""

    COMMAND = "coverage"
    report: CoverageReport

    def to_text(self) -> RenderableType:
        from ckptinspect.render.text import render_coverage

        return render_coverage(self.report)


@dataclass(frozen=True, slots=True)
class ValuesResult(_ReportResult["ValuesReport"]):
    """`values CKPT`: `status`, findings (the reader's, then CK901-CK911), and `report` (per tensor: statistics,
    fingerprint, first offending elements; `tensors` in JSON)."""

    COMMAND = "values"
    report: ValuesReport
    OUTPUTS = ("text", "json", "csv")

    def to_text(self) -> RenderableType:
        from ckptinspect.render.values_text import render_values

        return render_values(self.report)

    def to_csv(self) -> str:
        from ckptinspect.render.values_text import values_csv

        return values_csv(self.report)


@dataclass(frozen=True, slots=True)
class EstimateResult(_Result):
    """`estimate ...`: what a save will cost (`estimate`: size by component, bytes per rank, files, stall seconds,
    async host memory). It has no findings: the exit code is 0."""

    COMMAND = "estimate"
    estimate: Estimate

    def _body(self) -> dict[str, Any]:
        return self.estimate.to_dict()

    def to_text(self) -> RenderableType:
        from ckptinspect.render.estimate_text import render_estimate

        return render_estimate(self.estimate)


@dataclass(frozen=True, slots=True)
class RetainResult(_ReportResult["RetainPlan"]):
    """`retain SAVE_DIR --keep-last N ...`: a read-only retention plan (`report`: `delete`, `delete_paths`, `keep`
    with each kept iteration's reasons); `status` and findings: the save dir's own (tracker) and CK520-CK523.
    Nothing is deleted."""

    COMMAND = "retain"
    report: RetainPlan

    @property
    def delete(self) -> tuple[str, ...]:
        return self.report.delete

    def to_print0(self) -> str:
        """The full paths of the delete list, each followed by NUL (`--print0`, for `xargs -0 rm -rf`)."""
        return "".join(p + "\0" for p in self.report.delete_paths)

    def to_text(self) -> RenderableType:
        from ckptinspect.render.retain_text import render_retain

        return render_retain(self.report)
