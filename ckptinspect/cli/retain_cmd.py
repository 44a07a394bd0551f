"""`ckptinspect retain`: a read-only retention plan for a save dir (`register(app)` adds it to the typer app).

Thin shell over `ckptinspect.api.retain`: parse the policy, call it, render (text, `-o json`, or `--print0`: the
delete list's full paths, NUL-separated, for `xargs -0 rm -rf`; the findings at warning and above then go to
stderr). Exits by the findings at or above `--fail-on` (CK520, a broken tracker: 1); 2 for usage errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptinspect.cli.shell import (DebugOpt, FailOnOpt, Output, OutputOpt, emit_result, guarded,
                                   location_arg, only, usage_exit)
from ckptinspect.findings import FailOn, Severity
from ckptinspect.results import RetainResult


def register(app: typer.Typer) -> None:
    """Add the `retain` command to `app`."""
    app.command("retain")(retain)


def retain(
    path: Annotated[Path, location_arg("a save dir (local path or URL)")],
    keep_last: Annotated[int, typer.Option("--keep-last", min=0, help="keep the N newest complete iterations")],
    keep_every: Annotated[Optional[int], typer.Option("--keep-every", min=1, help="keep every iteration divisible "
                                                      "by K")] = None,
    keep: Annotated[Optional[list[str]], typer.Option("--keep", help="keep this iteration (number or dir name; "
                                                      "repeatable)")] = None,
    hash_files: Annotated[bool, typer.Option("--hash", help="an iteration with an integrity manifest counts as "
                                             "complete only once every listed file's SHA-256 matched")] = False,
    print0: Annotated[bool, typer.Option("--print0", help="print only the full paths of the delete list, "
                                         "NUL-separated (for xargs -0 rm -rf)")] = False,
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    debug: DebugOpt = False,
) -> None:
    """Plan which iteration dirs could be deleted, and why each kept one stays. Deletes nothing.

    Never the tracker's target, the newest complete iteration, a save that may still be in flight, a --keep
    milestone; with no complete checkpoint (or an unreadable tracker) nothing.
    """

    def body() -> int:
        from ckptinspect.api import retain as do_retain

        only(output, RetainResult.OUTPUTS)
        if print0 and output is not Output.TEXT:
            usage_exit("--print0 prints the delete list only: it takes no --output")
        r = do_retain(path, keep_last=keep_last, keep_every=keep_every, keep=keep or (), hash_files=hash_files)
        if print0:
            sys.stdout.write(r.to_print0())
            sys.stdout.flush()
            for f in r.findings:
                if f.severity.rank >= Severity.WARNING.rank:
                    sys.stderr.write(f"{f.code} {f.severity.value}: {f.message}\n")
        else:
            emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)
