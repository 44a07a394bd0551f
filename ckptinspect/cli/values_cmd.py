"""`ckptinspect values CKPT` and `values-merge REPORT...`: the value scan (`register(app)` adds both).

Thin shell over `ckptinspect.api.values` / `merge_values_reports`: parse options, scan, render (text / json / csv:
the result renders itself, `render/values_text.py`), exit code from `--fail-on`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptinspect.cli.shell import (
    DebugOpt,
    FailOnOpt,
    IgnoreOpt,
    Output,
    OutputOpt,
    PathArg,
    ProgressMode,
    ProgressOpt,
    SelectOpt,
    emit_result,
    guarded,
    json_command,
    json_reports,
    only,
    progress_bar,
    usage_exit,
)
from ckptinspect.findings import FailOn
from ckptinspect.results import ValuesResult


def register(app: typer.Typer) -> None:
    """Add `values` and `values-merge` to `app`."""
    app.command("values")(values)
    app.command("values-merge")(values_merge)


def values(
    path: PathArg,
    shard: Annotated[Optional[str], typer.Option("--shard", help="K/N: scan the K-th (0-based) of N slices; "
                                                 "`values-merge` combines the slices' -o json reports")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", help="scanning processes (default: the cores, "
                                                   "above 64 MiB of tensors)")] = None,
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    progress: ProgressOpt = ProgressMode.AUTO,
    debug: DebugOpt = False,
) -> None:
    """Read every stored tensor chunk: per tensor NaN / Inf / zeros / subnormals, min, max, mean, std, L2 and a
    shard-invariant fingerprint; findings for NaN, Inf, garbage, impossible or missing optimizer state."""

    def body() -> int:
        from ckptinspect.api import values as do_values
        from ckptinspect.services.integrity_verify import parse_shard

        only(output, ValuesResult.OUTPUTS)
        if workers is not None and workers < 1:
            usage_exit("--workers must be at least 1")
        shard_t = parse_shard(shard, "--shard")
        with progress_bar(output is Output.TEXT, "values", progress, command="values") as hook:
            r = do_values(path, shard=shard_t, workers=workers, select=select or (), ignore=ignore or (),
                          progress=hook)
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body, json_command(output, "values"))


def values_merge(
    reports: Annotated[list[Path], typer.Argument(help="JSON reports of `values --shard K/N -o json`, every K")],
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Combine the JSON reports of a sliced value scan into the scan of the whole checkpoint."""

    def body() -> int:
        from ckptinspect.api import merge_values_reports

        only(output, ValuesResult.OUTPUTS)
        docs = json_reports(reports)
        r = merge_values_reports(docs, select=select or (), ignore=ignore or ())
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)
