"""Markdown renderings (fits a GitHub step summary)."""

from __future__ import annotations

from ckptinspect.commands.audit.audit import AuditReport
from ckptinspect.findings import CODES
from ckptinspect.render.text import human_bytes, verdict_counts

_ICON = {"complete": "✅", "incomplete": "⚠️", "corrupt": "❌", "unsafe": "☠️", "unrecognized": "❓"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def audit_markdown(r: AuditReport) -> str:
    lines = [f"## ckptinspect audit: {_ICON.get(r.status.value, '')} `{r.status.value}`", ""]
    lines.append(f"- path: `{r.path}` ({r.kind.value})")
    if r.format:
        lines.append(f"- format: `{r.format.value}`, iteration {r.iteration}")
    lines.append(f"- findings: {verdict_counts(r)}")
    if r.summary is not None:
        s = r.summary
        lines.append(f"- content: {s.tensors} tensors, {s.chunks} chunks, {s.objects} objects, {s.files} files,"
                     f" {human_bytes(s.bytes)}")
    if r.save_dir is not None:
        lines += ["", "| iteration | status | audit | codes |", "|---|---|---|---|"]
        for a in r.checkpoints:
            mark = " (resume)" if r.picked is a else ""
            lines.append(f"| `{a.name}`{mark} | {a.status.value} | {'full' if a.full else 'cheap'} |"
                         f" {' '.join(sorted({f.code for f in a.findings}))} |")
    if r.findings:
        lines += ["", "| code | severity | subject | message |", "|---|---|---|---|"]
        for f in sorted(r.findings, key=lambda f: (-f.severity.rank, f.code))[:200]:
            lines.append(f"| {f.code} | {f.severity.value} | {_cell(f.subject or '-')} | {_cell(f.message)} |")
        if len(r.findings) > 200:
            lines.append(f"| … | | | {len(r.findings) - 200} more |")
        lines += ["", "<details><summary>codes</summary>", ""]
        for code in sorted({f.code for f in r.findings}):
            lines.append(f"- **{code}** {CODES[code].title}")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
