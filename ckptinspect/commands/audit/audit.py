"""`audit`: sniff, read, run every check, and derive statuses — for one checkpoint or a whole save dir.

A save dir is audited as Megatron would resume from it: the tracked iteration (the newest when there is no tracker)
is audited fully; every other iteration is classified cheaply (metadata-level checks, no hashing, no deep read)
unless `all_iterations` asks for full audits. The save dir's status is the picked checkpoint's, worsened by tracker
findings (docs/contract.md "Status of a checkpoint"); with `all_iterations` every iteration's status decides too,
as its findings decide the exit code. Iterations are audited one at a time: a leftover's report keeps its verdict
and findings, not its parsed metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptinspect.pickling.unpickle import release_frozen
from ckptinspect.commands.audit.lineage import Lineage, Step, lineage_of, stale_save, step_findings, step_of
from ckptinspect.commands.values.report import TensorScan, scan_tensors
from ckptinspect.commands.values.desync import desync_findings
from ckptinspect.commands.values.rules import value_findings
from ckptinspect.commands.values.scan import source_of
from ckptinspect.checks import CheckContext, tracker
from ckptinspect.checks.registry import CHECKS
from ckptinspect.io.findings import storage_findings, unread_findings
from ckptinspect.io.local import require_path, unread_scope
from ckptinspect.findings import Finding, Status, filter_findings, status_of, worst_status
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.savedir import SaveDir, SaveStyle, join_label, read_save_dir
from ckptinspect.formats.resolve import access_guard
from ckptinspect.formats.sniff import path_kind
from ckptinspect.model import Checkpoint, Format, Kind, frozen
from ckptinspect.commands.audit.summary import Summary, summarize

CHEAP_SKIP = frozenset({"integrity"})


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """What to run. select / ignore: code prefixes (`--select`, `--ignore`)."""

    deep: bool = False
    hash: bool = False  # hash every file the manifest lists (`--hash`; `--deep` implies it)
    all_iterations: bool = False
    manifest: Path | None = None
    values: bool = False  # `--values`: the value scan of every fully audited checkpoint (`commands/values/`)
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    context: CheckContext = field(default_factory=CheckContext)


@dataclass(frozen=True, slots=True)
class CheckpointAudit:
    """One audited checkpoint. `full` is False for a cheap classification."""

    checkpoint: Checkpoint
    status: Status
    findings: tuple[Finding, ...]
    full: bool
    name: str | None = None  # iteration dir name inside a save dir
    values: tuple[TensorScan, ...] | None = None  # `--values`: every tensor's value scan
    values_bytes: int = 0

    def values_dict(self) -> dict[str, Any] | None:
        """The `values` object of the JSON document (`values -o json`'s `tensors` and `bytes_read`)."""
        if self.values is None:
            return None
        return {"bytes_read": self.values_bytes, "tensors": [t.to_dict() for t in self.values]}

    def to_dict(self) -> dict[str, Any]:
        c = self.checkpoint
        out: dict[str, Any] = {
            "path": c.path, "name": self.name, "format": c.format.value if c.format else None,
            "iteration": c.iteration, "status": self.status.value, "full": self.full,
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.values is not None:
            out["values"] = self.values_dict()
        return out


@dataclass(frozen=True, slots=True)
class AuditReport:
    """The result of `audit PATH`."""

    path: str
    kind: Kind
    status: Status
    findings: tuple[Finding, ...]
    checkpoints: tuple[CheckpointAudit, ...]
    picked: CheckpointAudit | None
    save_dir: SaveDir | None
    summary: Summary | None

    @property
    def gating_findings(self) -> tuple[Finding, ...]:
        """The findings the verdict and the exit code rest on: the save dir's own, and those of every fully audited
        checkpoint. A cheaply classified leftover iteration counts through CK505/CK506, not its own errors."""
        own = {id(f) for a in self.checkpoints if not a.full for f in a.findings}
        return tuple(f for f in self.findings if id(f) not in own)

    @property
    def format(self) -> Format | None:
        c = self.picked.checkpoint if self.picked else None
        return c.format if c else None

    @property
    def iteration(self) -> int | None:
        return self.picked.checkpoint.iteration if self.picked else None


def audit_checkpoint(
    path: Path, label: str, opts: AuditOptions, full: bool = True, megatron_context: bool = False,
    name: str | None = None,
) -> CheckpointAudit:
    with unread_scope():
        return _audit_checkpoint(path, label, opts, full, megatron_context, name)


def _audit_checkpoint(path: Path, label: str, opts: AuditOptions, full: bool, megatron_context: bool,
                      name: str | None) -> CheckpointAudit:
    ckpt = read_checkpoint(path, label, megatron_context)
    ctx = replace(opts.context, deep=opts.deep and full, hash=(opts.hash or opts.deep) and full,
                  manifest=opts.manifest if full else None)
    findings: list[Finding] = list(ckpt.findings)
    for check_name, check in CHECKS:
        if ckpt.format is None or (not full and check_name in CHEAP_SKIP):
            continue
        findings.extend(f.with_path(label) for f in check(ckpt, ctx))
    # what storage did while the checks read (the safety scan's byte items, --deep, --hash): an object rewritten,
    # gone or denied after the listing is a finding here too, not only when the reader met it; a local file the
    # checks could not open (a data file whose byte items the safety scan reads) is CK209
    scans: tuple[TensorScan, ...] | None = None
    read_bytes = 0
    if opts.values and full and ckpt.format is not None:
        scans, read_bytes = scan_tensors(ckpt, progress=opts.context.progress)
        findings.extend(f.with_path(label) for f in value_findings([t.facts for t in scans], label))
        findings.extend(desync_findings(ckpt, source_of(ckpt), label))
    findings.extend(storage_findings(path, label, findings))
    kept = tuple(filter_findings(findings, opts.select, opts.ignore))
    return CheckpointAudit(ckpt, status_of(kept), kept, full, name, scans, read_bytes)


def audit(path: Path, opts: AuditOptions | None = None, label: str | None = None) -> AuditReport:
    """Audit a checkpoint or a save dir. Raises `UsageError` only when `path` does not exist or cannot
    be read at all (`io.local.require_path`)."""
    opts = opts or AuditOptions()
    label = label if label is not None else str(path)
    require_path(path, label)
    with unread_scope(), access_guard(path, label):
        if path_kind(path) is Kind.CHECKPOINT:
            one, summary = _summarized(audit_checkpoint(path, label, opts), opts)
            return AuditReport(label, Kind.CHECKPOINT, one.status, one.findings, (one,), one, None, summary)
        return _audit_save_dir(path, label, opts)


def _summarized(a: CheckpointAudit, opts: AuditOptions) -> tuple[CheckpointAudit, Summary]:
    """The summary (bytes per rank) of an audited checkpoint, and the findings that rest on it: CK801 when DP rank 0
    wrote the weights that a fully parallel save would spread (`commands/estimate/concentration.py`)."""
    from ckptinspect.commands.estimate.concentration import writer_concentration

    summary = summarize(a.checkpoint)
    label = a.checkpoint.path
    extra = filter_findings((f.with_path(label) for f in writer_concentration(a.checkpoint, summary.by_rank)),
                            opts.select, opts.ignore)
    if not extra:
        return a, summary
    kept = a.findings + tuple(extra)
    return replace(a, status=status_of(kept), findings=kept), summary


def _audit_save_dir(path: Path, label: str, opts: AuditOptions) -> AuditReport:
    save = read_save_dir(path)
    pick = save.resume_pick()
    audits: list[CheckpointAudit] = []
    picked: CheckpointAudit | None = None
    summary = None
    # what the lineage rules keep across iterations: a few numbers per iteration (`Step`) and the previous scanned
    # iteration's fingerprints (CK524 compares neighbours only), never a parsed checkpoint
    steps: list[Step] = []
    stale: list[Finding] = []
    prev: Lineage | None = None
    for it in save.iterations:
        is_pick = pick is not None and it.name == pick.name
        full = opts.all_iterations or is_pick
        a = audit_checkpoint(it.path, join_label(label, it.name), opts, full, save.style is SaveStyle.MEGATRON,
                             it.name)
        steps.append(step_of(it.name, it.iteration, a.checkpoint))
        if (line := lineage_of(a.name, a.checkpoint, a.values)) is not None:
            if (f := stale_save(prev, line, label)) is not None:
                stale.append(f)
            prev = line
        if is_pick:
            picked, summary = _summarized(a, opts)
            a = picked
        else:
            # one iteration at a time: a leftover keeps its verdict and findings, not its parsed metadata (tensor
            # and object tables, chunk table, args), so a save dir's peak memory does not grow with its iterations
            a = replace(a, checkpoint=_slim(a.checkpoint))
        audits.append(a)
        _collect_frozen(len(audits))
    statuses = {a.name or "": a.status for a in audits}
    own = _save_dir_findings(save, statuses, label, (f for a in audits for f in a.findings))
    # `--all --values`: consecutive iterations with the same weights; every audit: numbers that disagree
    own = [*own, *stale, *step_findings(steps, save, label)]
    dir_findings = tuple(filter_findings(own, opts.select, opts.ignore))
    deciding = [picked.status if picked else Status.COMPLETE, status_of(dir_findings)]
    if opts.all_iterations:
        # --all audits every iteration fully, and every one decides: the status says what the exit code says
        deciding.extend(a.status for a in audits)
    status = worst_status(deciding)
    if picked is None and not dir_findings:
        status = Status.UNRECOGNIZED
    flat: list[Finding] = list(dir_findings)
    for a in audits:
        flat.extend(a.findings)
    return AuditReport(label, Kind.SAVE_DIR, status, tuple(flat), tuple(audits), picked, save, summary)


def _save_dir_findings(save: SaveDir, statuses: Mapping[str, Status], label: str,
                       iterations: Iterable[Finding]) -> list[Finding]:
    """The save dir's own findings: the tracker check's, and a CK209 for what could not be read at its level (the
    tracker, a sub-dir that is no iteration) and was reported neither by the tracker check nor by an iteration."""
    own = list(tracker.run(save, statuses, label))
    return own + list(unread_findings(save.path, label, [*own, *iterations]))


COLLECT_EVERY = 4  # iterations between two collections of the frozen leftovers (`_collect_frozen`)


def _collect_frozen(done: int) -> None:
    """Free the cyclic garbage the iterations' reads left in the GC's permanent generation, every `COLLECT_EVERY`
    iterations (`done`: how many were audited). The readers build under `pickling.unpickle.no_gc`, which
    `gc.freeze()`s what they built; the unpickler's stand-in classes are cyclic (as every class is), so once an
    iteration is dropped only the cycle collector could free them, and it no longer sees them: ~16 KB per iteration
    for good (the 0.16.1 sample; 20 iterations of `ls` left 321 KB, 56 KB with this; 48 of `audit --all` 108 KB
    with a collection every 1 or 4 iterations). Between iterations what is live is the report and the picked
    checkpoint (its chunk table is columns, not objects); a full collection costs ~27 ms here (+50 % on that sample's
    55 ms per `ls` iteration when run after every one), hence every 4. What survives is frozen again."""
    if done % COLLECT_EVERY:
        return
    release_frozen()


def _slim(c: Checkpoint) -> Checkpoint:
    """What a report keeps of a leftover iteration's checkpoint: its identity (path, data dir, format, iteration,
    generation) and the reader's findings."""
    return Checkpoint(path=c.path, format=c.format, generation=c.generation, iteration=c.iteration,
                      findings=c.findings, data_dir=c.data_dir)


@dataclass(frozen=True, slots=True)
class IterationRow:
    """One row of `ls`."""

    name: str
    iteration: int | str
    format: Format | None
    status: Status
    bytes: int
    files: int
    tracked: bool
    codes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "iteration": self.iteration, "format": self.format.value if self.format else None, "status": self.status.value,
                "bytes": self.bytes, "files": self.files, "tracked": self.tracked, "codes": list(self.codes)}


@dataclass(frozen=True, slots=True)
class Listing:
    """`ls SAVE_DIR`: the tracker and every iteration dir with its (cheaply classified) status."""

    path: str
    tracker: Mapping[str, Any]
    iterations: tuple[IterationRow, ...]
    findings: tuple[Finding, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tracker", frozen(self.tracker))


def list_save_dir(path: Path, label: str | None = None, opts: AuditOptions | None = None) -> Listing:
    """Classify every iteration of a save dir (metadata-level checks, no hashing)."""
    label = label if label is not None else str(path)
    require_path(path, label)
    opts = opts or AuditOptions()
    with unread_scope(), access_guard(path, label):
        return _list(path, label, opts)


def _list(path: Path, label: str, opts: AuditOptions) -> Listing:
    if path_kind(path) is Kind.CHECKPOINT:
        a = audit_checkpoint(path, label, opts, full=False)
        c = a.checkpoint
        row = IterationRow(Path(label).name, c.iteration if c.iteration is not None else Path(label).name,
                           c.format, a.status, c.data_bytes, len(c.files), False,
                           tuple(sorted({f.code for f in a.findings})))
        return Listing(label, {"raw": None, "iteration": None}, (row,), a.findings)
    save = read_save_dir(path)
    tracked = save.find(save.tracker.iteration) if save.tracker.exists and save.tracker.error is None else None
    rows = []
    statuses: dict[str, Status] = {}
    reported: list[Finding] = []
    steps: list[Step] = []
    for it in save.iterations:
        a = audit_checkpoint(it.path, join_label(label, it.name), opts, False, save.style is SaveStyle.MEGATRON, it.name)
        statuses[it.name] = a.status
        steps.append(step_of(it.name, it.iteration, a.checkpoint))
        reported.extend(a.findings)
        c = a.checkpoint
        # an NVRx iteration is virtual (its files live in the rank dirs): the reader listed them
        files = _all_files(it.path) if it.path.exists() else c.files
        rows.append(IterationRow(it.name, it.iteration, c.format, a.status,
                                 sum(f.size or 0 for f in files), len(files),
                                 tracked is not None and tracked.name == it.name,
                                 tuple(sorted({f.code for f in a.findings}))))
        del a, c  # the iteration's parsed checkpoint, before its frozen leftovers are collected
        _collect_frozen(len(rows))
    findings = (*_save_dir_findings(save, statuses, label, reported), *step_findings(steps, save, label))
    return Listing(label, save.tracker.to_dict(), tuple(rows), findings)


def _all_files(path: Path) -> tuple[Any, ...]:
    from ckptinspect.formats.files import list_files

    return list_files(path, recursive=True)
