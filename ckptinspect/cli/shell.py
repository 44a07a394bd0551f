"""CLI plumbing: output formats, `--fail-on`, consoles, progress bars, and the one error → exit code table."""

from __future__ import annotations

import enum
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from ckptinspect.progress import ProgressHook
from ckptinspect.errors import BrokenSaveDir, CkptInspectError, UsageError
from ckptinspect.findings import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, FailOn, Finding


class Output(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    JUNIT = "junit"
    SARIF = "sarif"  # audit, scan, manifest verify / merge
    CSV = "csv"  # values
    HTML = "html"  # audit, diff


class ProgressMode(str, enum.Enum):
    """`--progress`: how long work reports progress on stderr."""

    AUTO = "auto"  # a bar on a terminal (text output); JSON lines without a terminal (logs: Slurm, CI)
    BAR = "bar"
    JSONL = "jsonl"
    NONE = "none"



OutputOpt = Annotated[Output, typer.Option("--output", "-o",
                                           help="text | json | markdown | junit | sarif | html | csv")]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="exit 1 on findings at or above: error | warning | never")]
SelectOpt = Annotated[list[str] | None, typer.Option("--select", help="only findings whose code starts with this")]
IgnoreOpt = Annotated[list[str] | None, typer.Option("--ignore", help="drop findings whose code starts with this")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks of internal errors")]
ProgressOpt = Annotated[ProgressMode, typer.Option(
    "--progress", help="progress of long work on stderr: auto (a bar on a terminal, JSON lines otherwise) | bar | "
                       "jsonl | none")]


def parse_location(text: str) -> Path:
    """A PATH argument: a local path, or a URL (s3:// gs:// az:// abfs:// msc:// file://) as an object path."""
    from ckptinspect.io import location

    try:
        return location(text)
    except UsageError as e:
        raise typer.BadParameter(str(e)) from e


def location_arg(help_text: str) -> typer.models.ArgumentInfo:
    return typer.Argument(help=help_text, parser=parse_location)  # type: ignore[no-any-return]


PathArg = Annotated[Path, location_arg("a save dir or one checkpoint (local path or s3:// gs:// az:// msc:// URL)")]


def console(stderr: bool = False) -> Console:
    """A console for command output; fixed width when not a terminal (`CKPTINSPECT_WIDTH` overrides)."""
    width_env = os.environ.get("CKPTINSPECT_WIDTH")
    stream = sys.stderr if stderr else sys.stdout
    width = int(width_env) if width_env and width_env.isdigit() else (None if stream.isatty() else 160)
    return SafeConsole(file=stream, width=width, soft_wrap=False, highlight=False)


# C0 / C1 control characters (an ESC sequence in a tensor key could rewrite the verdict line on a terminal) and lone
# surrogates (a non-UTF-8 file name; unprintable), shown escaped. Newlines and tabs are layout.
_UNSAFE_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def escape_controls(text: str) -> str:
    return _UNSAFE_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                             else f"\\u{ord(m.group()):04x}", text)


class SafeConsole(Console):
    """A console that never lets checkpoint content drive the terminal: strings are not rich markup, and every
    text segment is written with its control characters escaped (rich passes ESC and CSI through as is)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["markup"] = False
        return super().render_str(escape_controls(text), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and seg.text and _UNSAFE_CHARS.search(seg.text):
                yield Segment(escape_controls(seg.text), seg.style, seg.control)
            else:
                yield seg


def emit_text(renderable: RenderableType) -> None:
    console().print(renderable)


def emit_raw(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def usage_exit(message: str) -> NoReturn:
    console(stderr=True).print(Text.assemble(("error:", "red"), " ", message))
    raise typer.Exit(EXIT_USAGE)


def json_reports(paths: Sequence[Path]) -> list[Any]:
    """The JSON documents of `manifest merge` / `values-merge` arguments; a file that is not one is exit 2."""
    docs = []
    for p in paths:
        try:
            docs.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            usage_exit(f"{p}: not a readable JSON report ({e})")
    return docs


T = TypeVar("T")


def guarded(debug: bool, body: Callable[[], int], json_command: str | None = None,
            sarif_command: str | None = None) -> NoReturn:
    """Run a command body; map its outcome to the exit codes of docs/contract.md (the one error table).

    `json_command` / `sarif_command`: the command's name when it writes JSON / SARIF, so a broken save dir still
    yields a document of that format.
    """
    try:
        code = body()
    except typer.Exit:
        raise
    except UsageError as e:
        usage_exit(str(e))
    except BrokenSaveDir as e:
        _broken(e, json_command, sarif_command)
        code = EXIT_FINDINGS
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


def _broken(e: BrokenSaveDir, json_command: str | None, sarif_command: str | None = None) -> None:
    """A save dir with nothing to pick: findings, exit 1 (a broken checkpoint is never a usage error)."""
    findings = [f for f in e.findings if isinstance(f, Finding)]
    if sarif_command is not None:
        from ckptinspect.render.sarif import broken_save_dir_sarif

        emit_raw(broken_save_dir_sarif(sarif_command, findings))
    elif json_command is not None:
        from ckptinspect.render.json_doc import broken_save_dir_json

        emit_raw(broken_save_dir_json(json_command, findings))
    else:
        err = console(stderr=True)
        err.print(Text(str(e), style="red"))
        for f in findings:
            err.print(f"  {f.code} {f.severity.value}: {f.message}", markup=False)


@contextmanager
def progress_bar(enabled: bool, description: str, mode: ProgressMode = ProgressMode.AUTO, long: bool = True,
                 command: str = "") -> Iterator[ProgressHook | None]:
    """The progress hook of a command's long work, or None.

    enabled: a bar is wanted on a terminal (text output). long: the work is long (hashing, `--deep`, `--values`).
    `auto`: a rich bar on stderr (bytes, rate, ETA) when stderr is a terminal and `enabled`; JSON lines
    (`cli/progress_jsonl.py`) when stderr is not a terminal and the work is long; else nothing.
    """
    tty = sys.stderr.isatty()
    if mode is ProgressMode.NONE or (mode is ProgressMode.AUTO and not long):
        yield None
        return
    if mode is ProgressMode.JSONL or (mode is ProgressMode.AUTO and not tty):
        from ckptinspect.cli.progress_jsonl import jsonl_progress

        with jsonl_progress(command, description) as jsonl:
            yield jsonl
        return
    if mode is ProgressMode.AUTO and not enabled:
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


def only(output: Output, allowed: tuple[str, ...]) -> None:
    """Exit 2 before any work when the command's result does not render in `output` (`allowed`: its `OUTPUTS`)."""
    if output.value not in allowed:
        usage_exit(f"--output {output.value} is not available for this command (use {' | '.join(allowed)})")


def emit_result(result: Any, output: Output, **text_options: Any) -> None:
    """Print `result` in `output`: every command renders through this one door (the result renders itself:
    `to_text(**text_options)`, `to_json()`, `to_markdown()`, `to_junit()`, `to_sarif()`, `to_html()`)."""
    if output is Output.TEXT:
        out = result.to_text(**text_options)
        if isinstance(out, str):
            emit_raw(out)
        else:
            emit_text(out)
    else:
        emit_raw(getattr(result, f"to_{output.value}")())


def json_command(output: Output, command: str) -> str | None:
    return command if output is Output.JSON else None


def sarif_command(output: Output, command: str) -> str | None:
    return command if output is Output.SARIF else None
