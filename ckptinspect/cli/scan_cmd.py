"""`ckptinspect scan PATH`: the pickle-safety scan command (`register(app)` adds it to the typer app).

Thin shell over `ckptinspect.commands.scan.scan.scan_path`: parse options, scan, render (text / json / markdown /
junit / sarif: the result renders itself, `render/scan.py`), exit code from `--fail-on`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ckptinspect.cli.shell import (
    DebugOpt,
    FailOnOpt,
    IgnoreOpt,
    Output,
    OutputOpt,
    SelectOpt,
    emit_result,
    guarded,
    only,
    parse_location,
)
from ckptinspect.findings import FailOn
from ckptinspect.results import ScanResult

MAX_ROWS = 100


def register(app: typer.Typer) -> None:
    """Add the `scan` command to `app`."""
    app.command("scan")(scan)


def scan(
    path: Annotated[Path, typer.Argument(help="a save dir, one checkpoint, or one pickle file (a path or a URL)",
                                         parser=parse_location)],
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Pickle-safety scan of every pickle the checkpoint holds (.metadata, common.pt, .distcp items, .pt files)."""

    def body() -> int:
        from ckptinspect.api import scan as do_scan

        only(output, ScanResult.OUTPUTS)
        r = do_scan(path, select=select or (), ignore=ignore or ())
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)
