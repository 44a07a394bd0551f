"""The pickle-safety scan (`ckptinspect scan`) as text and as markdown: the verdict, the pickles that reference
dangerous or unknown globals, then the findings."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.services.safety_scan import ScanReport

MAX_ROWS = 100


def _flagged(r: ScanReport) -> list[tuple[str, str, list[str], list[str]]]:
    """(file, subject, dangerous, unknown) of every pickle referencing a global outside the allowlist."""
    rows = []
    for p in r.pickles:
        dangerous = [q for q, v in sorted(p.globals.items()) if v == "dangerous"]
        unknown = [q for q, v in sorted(p.globals.items()) if v == "unknown"]
        if dangerous or unknown:
            rows.append((p.file, p.subject, dangerous, unknown))
    return rows


def scan_markdown(r: ScanReport) -> str:
    """The scan as markdown (fits a GitHub step summary)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    flagged = _flagged(r)
    lines = [f"## ckptinspect scan: `{r.status.value}`", "", f"- path: `{r.path}`",
             f"- {r.pickles_scanned} pickle(s) scanned, {len(flagged)} with globals outside the allowlist "
             "(nothing was executed)"]
    if flagged:
        lines += ["", "| file | subject | dangerous | unknown |", "|---|---|---|---|"]
        for file, subject, dangerous, unknown in flagged[:MAX_ROWS]:
            lines.append(f"| `{cell(file)}` | `{cell(subject)}` | {cell(', '.join(dangerous))} | "
                         f"{cell(', '.join(unknown))} |")
    if r.findings:
        lines += ["", "| code | severity | subject | message |", "|---|---|---|---|"]
        for f in r.findings[:MAX_ROWS]:
            lines.append(f"| {f.code} | {f.severity.value} | {cell(f.subject or '-')} | {cell(f.message)} |")
    return "\n".join(lines) + "\n"


def render_scan(r: ScanReport) -> RenderableType:
    """Verdict, the pickles that reference dangerous or unknown globals, then the findings."""
    from ckptinspect.render.text import render_findings, status_text

    flagged = _flagged(r)
    head = Text.assemble(("verdict: ", "bold"), status_text(r.status),
                         f"   {r.pickles_scanned} pickle(s) scanned, {len(flagged)} with globals outside the "
                         "allowlist (nothing was executed)")
    parts: list[RenderableType] = [head]
    if flagged:
        t = Table(title="pickles referencing dangerous or unknown globals")
        for col in ("file", "subject", "dangerous", "unknown"):
            t.add_column(col, overflow="fold")
        for file, subject, dangerous, unknown in flagged[:MAX_ROWS]:
            t.add_row(file, subject, Text(", ".join(dangerous), style="bold magenta"),
                      Text(", ".join(unknown), style="yellow"))
        if len(flagged) > MAX_ROWS:
            t.add_row(f"... {len(flagged) - MAX_ROWS} more (use --output json)", "", "", "")
        parts.append(t)
    if r.findings:
        parts.append(render_findings(list(r.findings)))
    return Group(*parts)
