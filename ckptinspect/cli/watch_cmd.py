"""`ckptinspect watch`: follow a live run's save dir (`register(app)` adds it to the typer app).

Thin shell over `ckptinspect.api.watch`: one line per event on stdout, flushed as it happens (`-o jsonl`: one JSON
object a line; text otherwise). The exit code: with `--fail-fast`, that of the first event at or above `--fail-on`
(an `audited` / `stalled` one 1, an `error` one 2); without, once the polls end (`--once`, `--max-polls`,
`--timeout`), the worst such exit seen. 2 for usage errors; Ctrl-C is 130.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptinspect.cli.shell import DebugOpt, FailOnOpt, escape_controls, guarded, location_arg
from ckptinspect.findings import EXIT_OK, FailOn


class WatchOutput(str, enum.Enum):
    TEXT = "text"
    JSONL = "jsonl"


def register(app: typer.Typer) -> None:
    """Add the `watch` command to `app`."""
    app.command("watch")(watch)


def watch(
    path: Annotated[Path, location_arg("a save dir (local path or URL)")],
    interval: Annotated[float, typer.Option("--interval", min=0, help="seconds between polls")] = 10.0,
    stall_after: Annotated[float, typer.Option("--stall-after", min=0, help="report a save unchanged this many "
                                               "seconds while unfinished (CK530)")] = 600.0,
    once: Annotated[bool, typer.Option("--once", help="one poll, then exit")] = False,
    max_polls: Annotated[Optional[int], typer.Option("--max-polls", min=1, help="exit after N polls")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=0, help="exit after this many "
                                                     "seconds")] = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="exit at the first event at or above --fail-on "
                                            "(a broken iteration, a stall with --fail-on warning, an error)")]
    = False,
    hash_files: Annotated[bool, typer.Option("--hash", help="audit with every manifest-listed file's "
                                             "SHA-256")] = False,
    output: Annotated[WatchOutput, typer.Option("--output", "-o", help="text | jsonl")] = WatchOutput.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    debug: DebugOpt = False,
) -> None:
    """Follow a live run: poll SAVE_DIR, audit each iteration once its final marker appears, report stalled saves.

    One line per state change (-o jsonl: one JSON object a line). Reads only; runs until Ctrl-C unless --once,
    --max-polls or --timeout bound it.
    """

    def body() -> int:
        from ckptinspect.api import watch as do_watch
        from ckptinspect.render.watch_lines import event_json, event_text

        events = do_watch(path, interval=interval, stall_after=stall_after, max_polls=1 if once else max_polls,
                          timeout=timeout, hash_files=hash_files)
        label = str(path)
        worst = EXIT_OK
        for event in events:
            line = event_json(event, label) if output is WatchOutput.JSONL else escape_controls(event_text(event))
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            code = event.exit_code(fail_on.severity)
            worst = max(worst, code)
            if fail_fast and code != EXIT_OK:
                return code
        return worst

    guarded(debug, body)
