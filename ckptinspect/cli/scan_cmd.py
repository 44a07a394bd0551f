"""`ckptinspect scan PATH`: the pickle-safety scan command (`register(app)` adds it to the typer app).

Thin shell over `ckptinspect.scan.scan_path`: parse options, scan, render (text / json / junit), exit code from
`--fail-on`. The text rendering lives here because it is this command's alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.cli.shell import (
    DebugOpt,
    FailOn,
    FailOnOpt,
    IgnoreOpt,
    Output,
    OutputOpt,
    SelectOpt,
    emit_raw,
    emit_text,
    exit_for,
    guarded,
    usage_exit,
)
from ckptinspect.scan import ScanReport

MAX_ROWS = 100


def register(app: typer.Typer) -> None:
    """Add the `scan` command to `app`."""
    app.command("scan")(scan)


def scan(
    path: Annotated[Path, typer.Argument(help="a save dir, one checkpoint, or one pickle file")],
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Pickle-safety scan of every pickle the checkpoint holds (.metadata, common.pt, .distcp items, .pt files)."""

    def body() -> int:
        from ckptinspect.scan import scan_path

        if output not in (Output.TEXT, Output.JSON, Output.JUNIT):
            usage_exit(f"--output {output.value} is not available for this command (use text | json | junit)")
        if not (path.exists() or path.is_symlink()):
            usage_exit(f"{path}: no such file or directory")
        report = scan_path(path, str(path), tuple(select or ()), tuple(ignore or ()))
        if output is Output.JSON:
            from ckptinspect.render.json_doc import dumps, envelope

            emit_raw(dumps(envelope("scan", report.to_dict())))
        elif output is Output.JUNIT:
            from ckptinspect.render.junit import findings_junit

            emit_raw(findings_junit(f"scan {report.path}", list(report.findings)))
        else:
            emit_text(render_scan(report))
        return exit_for(list(report.findings), fail_on)

    guarded(debug, body)


def render_scan(r: ScanReport) -> RenderableType:
    """Verdict, the pickles that reference dangerous or unknown globals, then the findings."""
    from ckptinspect.render.text import render_findings, status_text

    flagged = [p for p in r.pickles if any(v != "allowed" for v in p.globals.values())]
    head = Text.assemble(("verdict: ", "bold"), status_text(r.status),
                         f"   {r.pickles_scanned} pickle(s) scanned, {len(flagged)} with globals outside the "
                         "allowlist (nothing was executed)")
    parts: list[RenderableType] = [head]
    if flagged:
        t = Table(title="pickles referencing dangerous or unknown globals")
        for col in ("file", "subject", "dangerous", "unknown"):
            t.add_column(col, overflow="fold")
        for p in flagged[:MAX_ROWS]:
            dangerous = [q for q, v in sorted(p.globals.items()) if v == "dangerous"]
            unknown = [q for q, v in sorted(p.globals.items()) if v == "unknown"]
            t.add_row(p.file, p.subject, Text(", ".join(dangerous), style="bold magenta"),
                      Text(", ".join(unknown), style="yellow"))
        if len(flagged) > MAX_ROWS:
            t.add_row(f"... {len(flagged) - MAX_ROWS} more (use --output json)", "", "", "")
        parts.append(t)
    if r.findings:
        parts.append(render_findings(list(r.findings)))
    return Group(*parts)
