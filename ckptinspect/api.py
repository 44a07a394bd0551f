"""The public Python API: one function per command, each returning a frozen result.

Every result has `.findings`, `.status` (or `.verdict`), `.to_dict()` — exactly the document `ckptinspect CMD -o
json` prints — `.to_json()` (that document as the CLI prints it) and `.exit_code(fail_on="error")` — exactly the exit
code the CLI returns for it. The CLI is a thin layer over these functions, so the two cannot drift apart.

Paths are `str` or `os.PathLike`; a save dir stands for the checkpoint a resume would pick wherever a checkpoint is
expected. Errors: `UsageError` when a path does not exist or an argument is impossible (the CLI's exit 2);
`BrokenSaveDir` (with `.findings`) when a save dir has no checkpoint to pick. A broken, half-written or hostile
checkpoint is never an exception: it is findings.

Importing this module is cheap: the capability code is imported by the function that needs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from ckptinspect.results import (
    AuditResult,
    CoverageResult,
    DiffResult,
    EstimateResult,
    InfoResult,
    LsResult,
    ManifestResult,
    ResumeResult,
    RetainResult,
    ScanResult,
    SniffResult,
    ValuesResult,
    WrittenManifestResult,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ckptinspect.commands.watch import Event
    from ckptinspect.commands.estimate.describe import GptDescription
    from ckptinspect.services.integrity_report import ManifestReport
    from ckptinspect.model import Checkpoint
    from ckptinspect.progress import ProgressHook

PathLike = Union[str, "os.PathLike[str]"]
StorageOptions = Union[Mapping[str, Any], None]
"""Options of the object-storage clients (the CLI's `--storage-option`, nested: `{"client_kwargs": {"endpoint_url":
...}}`). Given, the call starts a fresh storage session with them (no cached listings, zeroed counters); None keeps
the current session and its options (the CLI's, or those of the last call that set them)."""


def _storage(options: StorageOptions) -> None:
    if options is not None:
        from ckptinspect.io.session import reset

        reset(options)


def _path(path: PathLike) -> tuple[Path, str]:
    """A local path, or a URL (s3:// gs:// az:// abfs:// msc:// file://) as an object path, as the CLI takes them.
    A `Path` given as such (an object path included) is kept: `os.fspath` of an object path refuses on purpose."""
    if isinstance(path, Path):
        return path, str(path)
    from ckptinspect.io import location

    p = location(os.fspath(path))
    return p, str(p)


def _exists(p: Path, label: str) -> None:
    from ckptinspect.io.local import require_path

    require_path(p, label)  # UsageError: no such file, or permission denied on PATH itself


# --- functions -----------------------------------------------------------------------------------------------------


def sniff(path: PathLike, *, storage_options: StorageOptions = None) -> SniffResult:
    """What `path` is: a save dir or one checkpoint, its format, the evidence, the producer generation."""
    _storage(storage_options)
    from ckptinspect.formats.resolve import access_guard
    from ckptinspect.formats.sniff import sniff as do_sniff

    p, label = _path(path)
    _exists(p, label)
    with access_guard(p, label):
        return SniffResult(do_sniff(p, label))


def read(path: PathLike, *, storage_options: StorageOptions = None) -> Checkpoint:
    """The neutral model of the checkpoint `path` names (metadata only; tensor bytes are never loaded)."""
    _storage(storage_options)
    from ckptinspect.formats import read_checkpoint
    from ckptinspect.formats.resolve import resolve_checkpoint

    p, label = _path(path)
    ckpt_path, ckpt_label = resolve_checkpoint(p, label)
    return read_checkpoint(ckpt_path, ckpt_label)


def ls(path: PathLike, *, storage_options: StorageOptions = None) -> LsResult:
    """Every iteration of a save dir with its (metadata-level) status, size, files and whether the tracker names it;
    the tracker's findings (`ckptinspect ls`). A checkpoint dir lists as one row."""
    _storage(storage_options)
    from ckptinspect.commands.audit.audit import list_save_dir

    p, label = _path(path)
    return LsResult(list_save_dir(p, label))


def info(path: PathLike, *, storage_options: StorageOptions = None) -> InfoResult:
    """The checkpoint as read — format, iteration, topology, optimizer sharding, tensors, objects, files, args —
    with its byte summary and the reader's own findings (`ckptinspect info`; `audit` runs the checks)."""
    _storage(storage_options)
    from ckptinspect.commands.audit.summary import summarize

    ckpt = read(path)
    return InfoResult(ckpt, summarize(ckpt))


def audit(path: PathLike, *, deep: bool = False, hash_files: bool = False, all_iterations: bool = False,
          manifest: PathLike | None = None, values: bool = False, select: Sequence[str] = (), ignore: Sequence[str] = (),
          progress: ProgressHook | None = None, storage_options: StorageOptions = None) -> AuditResult:
    """Run every check on a checkpoint or a save dir (`ckptinspect audit`); `values=True` adds the value scan of
    every fully audited checkpoint (`audit --values`)."""
    _storage(storage_options)
    from ckptinspect.commands.audit.audit import AuditOptions
    from ckptinspect.commands.audit.audit import audit as do_audit
    from ckptinspect.checks import CheckContext

    p, label = _path(path)
    m = None
    if manifest is not None:
        m, m_label = _path(manifest)
        if not m.exists():
            from ckptinspect.errors import UsageError

            raise UsageError(f"--manifest {m_label}: no such file")
    opts = AuditOptions(deep=deep, hash=hash_files, all_iterations=all_iterations, manifest=m, values=values,
                        select=tuple(select), ignore=tuple(ignore), context=CheckContext(progress=progress))
    return AuditResult(do_audit(p, opts, label))


def diff(a: PathLike, b: PathLike, *, values: bool = False, progress: ProgressHook | None = None,
         atol: float = 0.0, rtol: float = 0.0, ignore: Sequence[str] = (),
         storage_options: StorageOptions = None) -> DiffResult:
    """Args diff (classified, blocking or not) and tensor diff of two checkpoints (`ckptinspect diff`). `atol` /
    `rtol`: value tolerances for `values=True`; `ignore`: tensor key globs left out on both sides."""
    _storage(storage_options)
    from ckptinspect.commands.diff.diff import diff_paths
    from ckptinspect.commands.diff.tolerance import Tolerance

    pa, la = _path(a)
    pb, lb = _path(b)
    tol = Tolerance(atol, rtol, tuple(ignore))
    return DiffResult(diff_paths(pa, pb, values=values, progress=progress, a_label=la, b_label=lb, tolerance=tol))


def resume(path: PathLike, *, tp: int, pp: int, dp: int | None = None, ep: int | None = None,
           cp: int | None = None, etp: int | None = None, vpp: int | None = None,
           make_vocab_size_divisible_by: int | None = None, vocab_size: int | None = None, finetune: bool = False,
           no_load_optim: bool = False, no_load_rng: bool = False,
           storage_options: StorageOptions = None) -> ResumeResult:
    """What a resume with this topology and these flags restores, drops or fails on (`ckptinspect resume`)."""
    _storage(storage_options)
    from ckptinspect.commands.resume import ResumeTarget, predict_resume

    target = ResumeTarget(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, etp=etp, vpp=vpp,
                          make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                          vocab_size=vocab_size, finetune=finetune, no_load_optim=no_load_optim,
                          no_load_rng=no_load_rng)
    return ResumeResult(predict_resume(read(path), target))


def coverage(path: PathLike, keys: Sequence[str] = (), *, select: Sequence[str] = (), ignore: Sequence[str] = (),
             storage_options: StorageOptions = None) -> CoverageResult:
    """Per-tensor chunk coverage (every tensor when `keys` is empty; `ckptinspect coverage`)."""
    _storage(storage_options)
    from ckptinspect.commands.coverage.coverage import coverage as do_coverage

    return CoverageResult(do_coverage(read(path), keys, select, ignore))


def values(path: PathLike, *, shard: tuple[int, int] | str | None = None, workers: int | None = None,
           select: Sequence[str] = (), ignore: Sequence[str] = (), progress: ProgressHook | None = None,
           storage_options: StorageOptions = None) -> ValuesResult:
    """The value scan (`ckptinspect values`): every stored chunk of every tensor read, per tensor its statistics and
    shard-invariant fingerprint, findings CK901-CK911. `shard=(K, N)` (or ``"K/N"``) scans slice K of N;
    `merge_values_reports` combines the slices' JSON documents. `workers`: processes (default: the cores, for a
    checkpoint of more than 64 MiB of tensors)."""
    _storage(storage_options)
    from ckptinspect.commands.values.report import values_report
    from ckptinspect.services.integrity_verify import parse_shard

    return ValuesResult(values_report(read(path), shard=parse_shard(shard), workers=workers, select=select,
                                      ignore=ignore, progress=progress))


def merge_values_reports(reports: Sequence[Mapping[str, Any]], *, select: Sequence[str] = (),
                         ignore: Sequence[str] = ()) -> ValuesResult:
    """One value scan from the JSON documents of `values --shard K/N -o json` for every K (`ckptinspect
    values-merge`); equal to the unsharded scan."""
    from ckptinspect.commands.values.report import merge_reports

    return ValuesResult(merge_reports(reports, select, ignore))


def verify_manifest(path: PathLike, manifest: PathLike | None = None, *, shard: tuple[int, int] | None = None,
                    workers: int | None = None, select: Sequence[str] = (), ignore: Sequence[str] = (),
                    progress: ProgressHook | None = None, storage_options: StorageOptions = None) -> ManifestResult:
    """Verify a SHA-256 manifest (the checkpoint's own `integrity.json` by default; `ckptinspect manifest verify`)."""
    _storage(storage_options)
    from ckptinspect.services.integrity_verify import parse_shard, verify_manifest as do_verify
    from ckptinspect.errors import UsageError
    from ckptinspect.formats.resolve import resolve_data_dir

    p, label = _path(path)
    ckpt_path, ckpt_label = resolve_data_dir(p, label)  # where its files and integrity.json are
    m = None
    if manifest is not None:
        m, m_label = _path(manifest)
        if not m.exists():
            raise UsageError(f"--manifest {m_label}: no such file")
    shard = parse_shard(shard)
    report = do_verify(ckpt_path, m, shard=shard, workers=workers, progress=progress, path_label=ckpt_label)
    return ManifestResult(_filtered(report, select, ignore))


def merge_manifest_reports(reports: Sequence[Mapping[str, Any]], *, select: Sequence[str] = (),
                           ignore: Sequence[str] = ()) -> ManifestResult:
    """One verdict from the JSON documents of sharded verifications (`ckptinspect manifest merge`)."""
    from ckptinspect.commands.manifest.report import merge_reports

    return ManifestResult(_filtered(merge_reports(reports), select, ignore), "manifest merge")


def _filtered(report: ManifestReport, select: Sequence[str], ignore: Sequence[str]) -> ManifestReport:
    """`--select` / `--ignore` on a manifest report: the status follows the findings kept, as for `audit`."""
    if not select and not ignore:
        return report
    from dataclasses import replace

    from ckptinspect.findings import filter_findings, status_of

    kept = tuple(filter_findings(report.findings, select, ignore))
    return replace(report, findings=kept, status=status_of(kept))


def write_manifest(path: PathLike, out: PathLike | None = None, *, recursive: bool = False,
                   workers: int | None = None, progress: ProgressHook | None = None,
                   storage_options: StorageOptions = None) -> WrittenManifestResult:
    """Write a SHA-256 manifest in Megatron's `integrity.json` schema, atomically (`ckptinspect manifest write`)."""
    _storage(storage_options)
    from ckptinspect.commands.manifest.manifest import write_manifest as do_write
    from ckptinspect.formats.resolve import resolve_data_dir

    p, label = _path(path)
    ckpt_path, ckpt_label = resolve_data_dir(p, label)  # where its files and integrity.json are
    o = _path(out)[0] if out is not None else None
    return WrittenManifestResult(do_write(ckpt_path, o, recursive=recursive, workers=workers, progress=progress),
                                 ckpt_label)


def scan(path: PathLike, *, select: Sequence[str] = (), ignore: Sequence[str] = (),
         storage_options: StorageOptions = None) -> ScanResult:
    """Pickle-safety scan of every pickle the checkpoint holds; nothing is unpickled (`ckptinspect scan`)."""
    _storage(storage_options)
    from ckptinspect.commands.scan.scan import scan_path

    p, label = _path(path)
    _exists(p, label)
    return ScanResult(scan_path(p, label, tuple(select), tuple(ignore)))


def retain(path: PathLike, *, keep_last: int, keep_every: int | None = None, keep: Sequence[int | str] = (),
           hash_files: bool = False, storage_options: StorageOptions = None) -> RetainResult:
    """A read-only retention plan for a save dir (`ckptinspect retain`): which iteration dirs could be deleted
    (`delete`, `report.delete_paths`) and why each kept one stays (`report.keep`). Never the tracker's target, the
    newest complete iteration, a save that may still be in flight, a `keep` milestone; `keep_last` newest complete
    ones and every `keep_every`-th iteration are kept too. `hash_files`: an iteration with a manifest counts as
    complete only once every listed file's SHA-256 matched (else the manifest is checked at metadata level).
    Deletes nothing. `UsageError` for a PATH that is not a save dir, or a negative `keep_last`."""
    _storage(storage_options)
    from ckptinspect.commands.retain import RetainPolicy
    from ckptinspect.commands.retain import retain as do_retain
    from ckptinspect.commands.retain.plan import parse_keep

    p, label = _path(path)
    policy = RetainPolicy(keep_last, keep_every, parse_keep(str(k) for k in keep))
    return RetainResult(do_retain(p, policy, label, hash_files))


def watch(path: PathLike, *, interval: float = 10.0, stall_after: float = 600.0, max_polls: int | None = None,
          timeout: float | None = None, hash_files: bool = False,
          storage_options: StorageOptions = None) -> Iterator[Event]:
    """Follow a live run's save dir (`ckptinspect watch`): poll it every `interval` seconds and yield one `Event` per
    state change (`.kind`, `.name`, `.iteration`, `.status`, `.codes`, `.to_dict()`; `.exit_code(Severity.ERROR)`
    is what `--fail-fast` exits with). Each iteration is audited once, when its final marker appears; a save unchanged
    for `stall_after` seconds while unfinished is one `stalled` event (CK530). Stops after `max_polls` polls or
    `timeout` seconds (never when both are None: close the generator to stop). Reads only. `UsageError` for a PATH
    that does not exist or is one checkpoint; raised when the generator starts."""
    _storage(storage_options)
    from ckptinspect.commands.watch import WatchOptions, check_save_dir, follow
    from ckptinspect.errors import UsageError

    if interval < 0 or stall_after < 0 or (timeout is not None and timeout < 0) or (
            max_polls is not None and max_polls < 1):
        raise UsageError("--interval, --stall-after and --timeout must not be negative, --max-polls at least 1")
    p, label = _path(path)
    check_save_dir(p, label)
    return follow(p, label, WatchOptions(interval, stall_after, max_polls, timeout, hash_files))


def estimate(*, params: float | None = None, description: GptDescription | None = None,
             checkpoint: PathLike | None = None, dtype: str = "bfloat16", tp: int | None = None,
             pp: int | None = None, dp: int | None = None, ep: int | None = None, etp: int | None = None,
             cp: int | None = None, vpp: int | None = None, gpus_per_node: int = 8, format: str = "torch_dist",
             fully_parallel: bool | None = None, async_save: bool = False,
             distributed_optimizer: bool | None = None, optimizer: str | None = None,
             optim_sharding: str | None = None, files_per_rank: int | None = None, write_bw: float = 2.0,
             aggregate_bw: float = 100.0, d2h_bw: float = 25.0,
             storage_options: StorageOptions = None) -> EstimateResult:
    """What a save will cost before the job runs (`ckptinspect estimate`): size by component, bytes written per
    rank, files, stall seconds, async host memory.

    Exactly one model source: `params` (a parameter count), `description` (a `GptDescription`), or `checkpoint`
    (a torch_dist checkpoint or save dir; its own topology and save options unless overridden). Topology and save
    options left None take the checkpoint's value (or 1 / Megatron's default). `format` is "torch_dist" or "torch",
    `optimizer` "adam" or "sgd", `optim_sharding` "dp_reshardable" or "fully_reshardable"; bandwidths are decimal
    GB/s. Options that cannot describe a Megatron job raise `UsageError` (the CLI's exit 2).
    """
    _storage(storage_options)
    from ckptinspect.commands.estimate import Bandwidths, Optimizer, OptimSharding, SaveFormat
    from ckptinspect.commands.estimate.request import EstimateRequest, SaveArgs, TargetArgs, run
    from ckptinspect.errors import UsageError

    if min(write_bw, aggregate_bw, d2h_bw) <= 0:
        raise UsageError("--write-bw, --aggregate-bw and --d2h-bw must be positive")

    def choice(kind: Any, value: str | None, what: str) -> Any:
        try:
            return None if value is None else kind(value)
        except ValueError:
            raise UsageError(f"{what} {value!r}: expected {' | '.join(m.value for m in kind)}") from None

    req = EstimateRequest(
        params=params, dtype=dtype, description=description,
        from_path=_path(checkpoint)[0] if checkpoint is not None else None,
        target=TargetArgs(tp, pp, dp, ep, etp, cp, vpp, gpus_per_node),
        save=SaveArgs(choice(SaveFormat, format, "format"), fully_parallel, async_save, distributed_optimizer,
                      choice(Optimizer, optimizer, "optimizer"), choice(OptimSharding, optim_sharding,
                                                                         "optim_sharding"), files_per_rank),
        bandwidths=Bandwidths(write_bw * 1e9, aggregate_bw * 1e9, d2h_bw * 1e9),
    )
    return EstimateResult(run(req))
