"""`ckptinspect` commands. Each parses options, calls one public API function (`ckptinspect.api`), renders the result,
and returns the result's own exit code: the CLI and the Python API cannot disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptinspect._version import __version__
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
    emit_raw,
    emit_result,
    guarded,
    json_command,
    location_arg,
    only,
    progress_bar,
    usage_exit,
)
from ckptinspect.findings import EXIT_OK, FailOn
from ckptinspect.results import AuditResult, CoverageResult, DiffResult, InfoResult, LsResult, ResumeResult, SniffResult

app = typer.Typer(
    name="ckptinspect",
    help="Inspect and validate Megatron-LM / PyTorch DCP checkpoints offline: no GPU, no torch, no code execution.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _version(value: bool) -> None:
    if value:
        emit_raw(f"ckptinspect {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="print the version and exit")] = None,
    storage_option: Annotated[Optional[list[str]], typer.Option(
        "--storage-option", metavar="KEY=VALUE",
        help="fsspec option for s3:// gs:// az:// URLs (repeatable; a.b=v nests: client_kwargs.endpoint_url=...)")]
    = None,
) -> None:
    """ckptinspect: is this checkpoint whole, and what will a resume restore?"""
    from ckptinspect.io.session import nest, parse_option, reset

    try:
        reset(nest([parse_option(o) for o in storage_option or ()]))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--storage-option") from e


@app.command()
def sniff(path: PathArg, output: OutputOpt = Output.TEXT, debug: DebugOpt = False) -> None:
    """Say what PATH is: save dir or checkpoint, its format, the evidence, the producer generation."""

    def body() -> int:
        from ckptinspect.api import sniff as do_sniff

        only(output, SniffResult.OUTPUTS)
        r = do_sniff(path)
        emit_result(r, output)
        return r.exit_code()

    guarded(debug, body)


@app.command("ls")
def ls_cmd(
    path: Annotated[Path, location_arg("a save dir (local path or URL)")],
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    debug: DebugOpt = False,
) -> None:
    """Every iteration dir: format, status, size, file count, which one the tracker names."""

    def body() -> int:
        from ckptinspect.api import ls as do_ls

        only(output, LsResult.OUTPUTS)
        r = do_ls(path)
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)


@app.command()
def info(
    path: PathArg,
    output: OutputOpt = Output.TEXT,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="write the tensor table to this CSV file")] = None,
    fail_on: FailOnOpt = FailOn.ERROR,
    debug: DebugOpt = False,
) -> None:
    """Summary (format, iteration, topology, optimizer sharding, bytes) and the tensor / object table."""

    def body() -> int:
        from ckptinspect.api import info as do_info

        only(output, InfoResult.OUTPUTS)
        r = do_info(path)
        if csv is not None:
            from ckptinspect.render.frames import write_tensor_csv

            write_tensor_csv(r.checkpoint, csv)
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body, json_command(output, "info"))


@app.command()
def audit(
    path: PathArg,
    deep: Annotated[bool, typer.Option("--deep", help="read every stored item (archive, payload size); implies "
                                       "--hash")] = False,
    hash_files: Annotated[bool, typer.Option("--hash", help="hash every file the integrity manifest lists (without "
                                             "it the manifest is checked at metadata level: files present, unlisted, "
                                             "stale)")] = False,
    all_iterations: Annotated[bool, typer.Option("--all", help="fully audit every iteration of a save dir")] = False,
    manifest: Annotated[Optional[Path], typer.Option("--manifest", help="verify this manifest file")] = None,
    values: Annotated[bool, typer.Option("--values", help="also scan every tensor's values (NaN, Inf, garbage, "
                                         "optimizer state; as `ckptinspect values`)")] = False,
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    progress: ProgressOpt = ProgressMode.AUTO,
    debug: DebugOpt = False,
) -> None:
    """Run every check; print the verdict; exit 1 on findings at or above --fail-on.

    Metadata-level by default: no file is hashed and no tensor bytes are read (--hash hashes what the manifest
    lists, --deep also reads every stored item).
    """

    def body() -> int:
        from ckptinspect.api import audit as do_audit

        only(output, AuditResult.OUTPUTS)
        long = deep or hash_files or values
        with progress_bar(output is Output.TEXT and long, "deep read", progress, long=long, command="audit") as hook:
            r = do_audit(path, deep=deep, hash_files=hash_files, all_iterations=all_iterations, manifest=manifest,
                         values=values,
                         select=select or (), ignore=ignore or (), progress=hook)
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)


@app.command()
def coverage(
    path: PathArg,
    keys: Annotated[Optional[list[str]], typer.Argument(help="tensor keys (default: all)")] = None,
    svg: Annotated[Optional[Path], typer.Option("--svg", help="write the chunk-grid picture of one tensor")] = None,
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Per-tensor coverage; for one tensor, a picture of its chunk grid with gaps and overlaps marked."""

    def body() -> int:
        from ckptinspect.api import coverage as do_coverage

        only(output, CoverageResult.OUTPUTS)
        r = do_coverage(path, keys or (), select=select or (), ignore=ignore or ())
        picture = r.report.picture
        if svg is not None:
            if picture is None:
                usage_exit("--svg needs exactly one KEY")
            from ckptinspect.render.svg import picture_svg

            svg.write_text(picture_svg(picture), encoding="utf-8")
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body, json_command(output, "coverage"))


@app.command()
def diff(
    a: Annotated[Path, location_arg("checkpoint or save dir A (local path or URL)")],
    b: Annotated[Path, location_arg("checkpoint or save dir B (local path or URL)")],
    values: Annotated[bool, typer.Option("--values", help="also compare tensor contents (equal value fingerprints "
                                         "first, then chunk by chunk)")] = False,
    atol: Annotated[float, typer.Option("--atol", help="with --values: |a-b| <= atol + rtol*|b| is equal")] = 0.0,
    rtol: Annotated[float, typer.Option("--rtol", help="with --values: relative tolerance (see --atol)")] = 0.0,
    ignore_keys: Annotated[Optional[list[str]], typer.Option("--ignore", metavar="KEY_GLOB",
                                                             help="leave tensor keys matching this glob out on both "
                                                             "sides (repeatable), e.g. '*._extra_state'")] = None,
    output: OutputOpt = Output.TEXT,
    progress: ProgressOpt = ProgressMode.AUTO,
    debug: DebugOpt = False,
) -> None:
    """Args diff (classified, blocking or not) and tensor diff (keys, shapes, dtypes, layouts; values)."""

    def body() -> int:
        from ckptinspect.api import diff as do_diff

        only(output, DiffResult.OUTPUTS)
        with progress_bar(output is Output.TEXT and values, "values", progress, long=values,
                          command="diff") as hook:
            r = do_diff(a, b, values=values, progress=hook, atol=atol, rtol=rtol, ignore=ignore_keys or ())
        emit_result(r, output)
        return r.exit_code()

    guarded(debug, body, json_command(output, "diff"))


@app.command()
def resume(
    path: PathArg,
    tp: Annotated[int, typer.Option("--tp", help="target tensor-parallel size")],
    pp: Annotated[int, typer.Option("--pp", help="target pipeline-parallel size")],
    dp: Annotated[Optional[int], typer.Option("--dp", help="target data-parallel size")] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="target expert-parallel size")] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="target context-parallel size")] = None,
    etp: Annotated[Optional[int], typer.Option("--etp", help="target expert tensor-parallel size")] = None,
    vpp: Annotated[Optional[int], typer.Option(
        "--vpp", help="target virtual pipeline stages per PP rank (1 = no interleaving)")] = None,
    make_vocab_size_divisible_by: Annotated[Optional[int], typer.Option(
        "--make-vocab-size-divisible-by", help="target --make-vocab-size-divisible-by")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(
        "--vocab-size", help="tokenizer vocabulary size, when the checkpoint's args lack it")] = None,
    finetune: Annotated[bool, typer.Option("--finetune", help="resume as Megatron --finetune")] = False,
    no_load_optim: Annotated[bool, typer.Option("--no-load-optim")] = False,
    no_load_rng: Annotated[bool, typer.Option("--no-load-rng")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="print the rule table applied")] = False,
    output: OutputOpt = Output.TEXT,
    debug: DebugOpt = False,
) -> None:
    """Predict what a resume with that topology and those flags restores, drops, or fails on."""

    def body() -> int:
        from ckptinspect.api import resume as do_resume

        only(output, ResumeResult.OUTPUTS)
        r = do_resume(path, tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, etp=etp, vpp=vpp,
                      make_vocab_size_divisible_by=make_vocab_size_divisible_by, vocab_size=vocab_size,
                      finetune=finetune, no_load_optim=no_load_optim, no_load_rng=no_load_rng)
        emit_result(r, output, explain=explain)
        return r.exit_code()

    guarded(debug, body, json_command(output, "resume"))


from ckptinspect.cli.manifest_cmd import register as _register_manifest  # noqa: E402 - after the app exists
from ckptinspect.cli.scan_cmd import register as _register_scan  # noqa: E402
from ckptinspect.cli.estimate_cmd import register as _register_estimate  # noqa: E402
from ckptinspect.cli.values_cmd import register as _register_values  # noqa: E402
from ckptinspect.cli.retain_cmd import register as _register_retain  # noqa: E402
from ckptinspect.cli.watch_cmd import register as _register_watch  # noqa: E402

_register_manifest(app)
_register_scan(app)
_register_estimate(app)
_register_values(app)
_register_retain(app)
_register_watch(app)


def main() -> None:
    """Console-script entry point.

    After the command has run and its output is flushed, the process ends with `os._exit`: freeing the millions
    of objects a large `.metadata` is made of takes seconds and serves nothing (nothing is left to write).
    """
    import os
    import sys

    code: int | str | None = 0
    try:
        app()
    except SystemExit as e:
        code = e.code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    if code is None:
        code = 0
    elif isinstance(code, str):
        sys.stderr.write(code + "\n")
        sys.stderr.flush()
        code = 1
    os._exit(code)
