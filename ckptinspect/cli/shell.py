"""CLI plumbing: output formats, `--fail-on`, consoles, progress bars, and the one error → exit code table."""

from __future__ import annotations

import enum
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.console import Console, RenderableType

from ckptinspect.checks import ProgressHook
from ckptinspect.errors import CkptInspectError, UsageError
from ckptinspect.findings import Finding, Severity, exceeds


class Output(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    JUNIT = "junit"


class FailOn(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NEVER = "never"

    @property
    def severity(self) -> Severity | None:
        return {"error": Severity.ERROR, "warning": Severity.WARNING, "never": None}[self.value]


EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="text | json | markdown | junit")]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="exit 1 on findings at or above: error | warning | never")]
SelectOpt = Annotated[list[str] | None, typer.Option("--select", help="only findings whose code starts with this")]
IgnoreOpt = Annotated[list[str] | None, typer.Option("--ignore", help="drop findings whose code starts with this")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks of internal errors")]


def console(stderr: bool = False) -> Console:
    """A console for command output; fixed width when not a terminal (`CKPTINSPECT_WIDTH` overrides)."""
    width_env = os.environ.get("CKPTINSPECT_WIDTH")
    stream = sys.stderr if stderr else sys.stdout
    width = int(width_env) if width_env and width_env.isdigit() else (None if stream.isatty() else 160)
    return Console(file=stream, width=width, soft_wrap=False, highlight=False)


def emit_text(renderable: RenderableType) -> None:
    console().print(renderable)


def emit_raw(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def exit_for(findings: list[Finding], fail_on: FailOn) -> int:
    return EXIT_FINDINGS if exceeds(findings, fail_on.severity) else EXIT_OK


def usage_exit(message: str) -> NoReturn:
    console(stderr=True).print(f"[red]error:[/red] {message}", markup=True)
    raise typer.Exit(EXIT_USAGE)


T = TypeVar("T")


def guarded(debug: bool, body: Callable[[], int]) -> NoReturn:
    """Run a command body; map its outcome to the exit codes of CONTRACT.md (the one error table)."""
    try:
        code = body()
    except typer.Exit:
        raise
    except UsageError as e:
        usage_exit(str(e))
    except BrokenPipeError:
        code = EXIT_OK
    except KeyboardInterrupt:
        code = 130
    except (CkptInspectError, Exception) as e:  # noqa: BLE001 - the internal-error row of the table
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"ckptinspect: internal error: {type(e).__name__}: {e}"
                         + ("" if debug else " (run with --debug for the traceback)") + "\n")
        code = EXIT_INTERNAL
    raise typer.Exit(code)


@contextmanager
def progress_bar(enabled: bool, description: str) -> Iterator[ProgressHook | None]:
    """A rich progress bar on stderr (bytes, rate, ETA) when stderr is a terminal and `enabled`; else None."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def hook(advance: int, total: int, desc: str) -> None:
            bar.update(task, advance=advance, total=total, description=desc)

        yield hook
