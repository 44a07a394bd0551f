"""`manifest verify | merge | write`: SHA-256 integrity manifests in Megatron's `integrity.json` schema."""

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
    parse_location,
    progress_bar,
    sarif_command,
    usage_exit,
)
from ckptinspect.findings import FailOn
from ckptinspect.results import ManifestResult, WrittenManifestResult

manifest_app = typer.Typer(help="SHA-256 integrity manifests (Megatron's integrity.json).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the `manifest` command group to `app`."""
    app.add_typer(manifest_app, name="manifest")


@manifest_app.command("verify")
def manifest_verify(
    path: PathArg,
    manifest: Annotated[Optional[Path], typer.Option("--manifest", help="manifest file (default: integrity.json)")]
    = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="K/N: verify the K-th (0-based) of N slices")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", help="hashing threads (default: cores)")] = None,
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    progress: ProgressOpt = ProgressMode.AUTO,
    debug: DebugOpt = False,
) -> None:
    """Verify a SHA-256 manifest (the checkpoint's own integrity.json by default)."""

    def body() -> int:
        from ckptinspect.api import verify_manifest

        only(output, ManifestResult.OUTPUTS)
        from ckptinspect.services.integrity_verify import parse_shard

        shard_t = parse_shard(shard, "--shard")
        with progress_bar(output is Output.TEXT, "sha256", progress, command="manifest verify") as hook:
            r = verify_manifest(path, manifest, shard=shard_t, workers=workers, select=select or (),
                                ignore=ignore or (), progress=hook)
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body, json_command(output, "manifest verify"), sarif_command(output, "manifest verify"))


@manifest_app.command("merge")
def manifest_merge(
    reports: Annotated[list[Path], typer.Argument(help="JSON reports of `manifest verify --shard K/N -o json`")],
    output: OutputOpt = Output.TEXT,
    fail_on: FailOnOpt = FailOn.ERROR,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Combine the JSON reports of sharded verifications into one verdict."""

    def body() -> int:
        from ckptinspect.api import merge_manifest_reports

        only(output, ManifestResult.OUTPUTS)
        docs = json_reports(reports)
        r = merge_manifest_reports(docs, select=select or (), ignore=ignore or ())
        emit_result(r, output)
        return r.exit_code(fail_on.severity)

    guarded(debug, body)


@manifest_app.command("write")
def manifest_write(
    path: PathArg,
    out: Annotated[Optional[Path], typer.Option("--out", parser=parse_location,
                                                help="where to write: a file or a URL (default: CKPT/integrity.json;"
                                                     " required for a checkpoint in object storage)")]
    = None,
    recursive: Annotated[bool, typer.Option("--recursive", help="also list files in sub-dirs")] = False,
    workers: Annotated[Optional[int], typer.Option("--workers", help="hashing threads")] = None,
    output: OutputOpt = Output.TEXT,
    progress: ProgressOpt = ProgressMode.AUTO,
    debug: DebugOpt = False,
) -> None:
    """Write a SHA-256 manifest in Megatron's integrity.json schema (atomically)."""

    def body() -> int:
        from ckptinspect.api import write_manifest
        from ckptinspect.errors import ReadError

        only(output, WrittenManifestResult.OUTPUTS)
        try:
            with progress_bar(output is Output.TEXT, "sha256", progress, command="manifest write") as hook:
                r = write_manifest(path, out, recursive=recursive, workers=workers, progress=hook)
        except (ReadError, OSError) as e:
            # a file it may not read, a dir it may not write: the manifest cannot be made, and nothing was written
            usage_exit(f"manifest not written: {e.strerror if isinstance(e, OSError) and e.strerror else e}")
        emit_result(r, output)
        return r.exit_code()

    guarded(debug, body, json_command(output, "manifest write"))
