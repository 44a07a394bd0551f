"""What `retain` knows about a save dir before it plans: each iteration's status (classified as `ls` and `audit`
classify it, plus its integrity manifest checked), whether its manifest was verified, and for every iteration that
is not complete the age rule's verdict (`formats/inflight.py`: being written, or a crash leftover). The tracker, the
iteration a resume would pick, and the save dir's own findings (the tracker check's, as `ls` reports them).

Reading is all this module does; `plan.py` decides. One iteration is read at a time and only its verdict is kept
(status, finding codes, manifest state, age), so memory does not grow with the number of iterations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.checks import tracker as tracker_check
from ckptinspect.commands.audit.audit import AuditOptions, audit_checkpoint
from ckptinspect.errors import UsageError
from ckptinspect.findings import Finding, Status
from ckptinspect.formats.inflight import Age, age_of
from ckptinspect.formats.resolve import access_guard
from ckptinspect.formats.savedir import SaveDir, SaveStyle, join_label, read_save_dir
from ckptinspect.formats.sniff import path_kind
from ckptinspect.io.findings import unread_findings
from ckptinspect.io.local import require_path, unread_scope
from ckptinspect.io.objpath import ObjectPath
from ckptinspect.model import Kind, StrEnum

_MANIFEST_FAILED = ("CK401", "CK402", "CK404")


class ManifestState(StrEnum):
    """An iteration's integrity manifest (`integrity.json`) as `retain` checked it."""

    ABSENT = "absent"  # no manifest (CK400), or nothing to check it against (no checkpoint read)
    CHECKED = "checked"  # present; listed files present, none unlisted-and-stale: checked at metadata level
    HASHED = "hashed"  # present and every listed file's SHA-256 matched (`--hash`)
    FAILED = "failed"  # present and it disagrees with the files (CK401, CK402) or is unreadable (CK404)


class TrackerState(StrEnum):
    """What the save dir's tracker tells `retain`."""

    ABSENT = "absent"  # no latest_checkpointed_iteration.txt (torchtitan, NeMo 2 keep none)
    NAMES = "names"  # it names an iteration (which may be missing or unfinished)
    UNKNOWN = "unknown"  # unparseable, unreadable here, or being written: which iteration it names is not known


@dataclass(frozen=True, slots=True)
class IterationFacts:
    """One iteration dir: `location` is its full path (absolute for a local dir, the URL in object storage), what
    `--print0` prints; `age` the age rule's verdict, for an iteration that is not complete (None otherwise)."""

    name: str
    iteration: int | str
    location: str
    status: Status
    codes: tuple[str, ...]
    manifest: ManifestState
    age: Age | None

    @property
    def numbered(self) -> bool:
        return isinstance(self.iteration, int) and not isinstance(self.iteration, bool)

    @property
    def unreadable(self) -> bool:
        """Some of it could not be read here (CK209): nothing is known about what it holds."""
        return "CK209" in self.codes


@dataclass(frozen=True, slots=True)
class SaveDirFacts:
    """A save dir as `retain` sees it. `tracked`: the iteration the tracker names (when `tracker` is NAMES);
    `resume_pick`: the dir a resume would load (`SaveDir.resume_pick`: Bridge's `latest_train_state.pt` step, the
    tracked one, or the newest loadable for stacks without a tracker); `findings`: the save dir's own (tracker
    check, unreadable entries), as `ls` reports them."""

    path: str
    style: SaveStyle
    tracker: TrackerState
    tracker_raw: str | None
    tracked: int | str | None
    resume_pick: str | None
    iterations: tuple[IterationFacts, ...]
    findings: tuple[Finding, ...]


def read_facts(path: Path, label: str | None = None, hash_files: bool = False) -> SaveDirFacts:
    """Classify every iteration of the save dir `path`. Raises `UsageError` when `path` does not exist, cannot be
    read, is one checkpoint rather than a save dir, or is an NVRx local checkpoint root (its iterations are files in
    every rank dir, not one dir each, and NVRx removes older iterations itself)."""
    label = label if label is not None else str(path)
    require_path(path, label)
    with unread_scope(), access_guard(path, label):
        if path_kind(path) is not Kind.SAVE_DIR:
            raise UsageError(f"{label}: not a save dir (one checkpoint): retain plans over the iteration dirs of a "
                             "save dir")
        save = read_save_dir(path)
        if save.style is SaveStyle.NVRX:
            raise UsageError(f"{label}: an NVRx local checkpoint root keeps each iteration as files in every rank "
                             "dir, not as one dir; NVRx removes older iterations itself")
        return _facts(save, label, AuditOptions(hash=hash_files))


def _facts(save: SaveDir, label: str, opts: AuditOptions) -> SaveDirFacts:
    t = save.tracker
    state = TrackerState.ABSENT if not t.exists else TrackerState.UNKNOWN if t.error is not None \
        else TrackerState.NAMES
    tracked = t.iteration if state is TrackerState.NAMES else None
    its: list[IterationFacts] = []
    statuses: dict[str, Status] = {}
    reported: list[Finding] = []
    for it in save.iterations:
        # full: the integrity check runs too (at metadata level, or hashing with `--hash`): a manifest that
        # disagrees makes the iteration not complete, so it cannot be "the newest complete one"
        a = audit_checkpoint(it.path, join_label(label, it.name), opts, True, save.style is SaveStyle.MEGATRON,
                             it.name)
        statuses[it.name] = a.status
        reported.extend(a.findings)
        codes = tuple(sorted({f.code for f in a.findings}))
        age = None
        if a.status is not Status.COMPLETE:
            age = age_of(it.path, it.iteration if isinstance(it.iteration, int) else None, tracked=tracked)
        its.append(IterationFacts(it.name, it.iteration, _location(it.path), a.status, codes,
                                  _manifest(codes, a.checkpoint.format is not None, opts.hash), age))
    own = list(tracker_check.run(save, statuses, label))
    own += unread_findings(save.path, label, [*own, *reported])
    pick = save.resume_pick()
    return SaveDirFacts(label, save.style, state, t.raw, tracked, pick.name if pick is not None else None,
                        tuple(its), tuple(own))


def _manifest(codes: tuple[str, ...], read: bool, hashed: bool) -> ManifestState:
    if any(c in codes for c in _MANIFEST_FAILED):
        return ManifestState.FAILED
    if "CK400" in codes or not read:
        return ManifestState.ABSENT
    return ManifestState.HASHED if hashed else ManifestState.CHECKED


def _location(path: Path) -> str:
    """The full path `--print0` prints: the URL of an object path, the absolute path of a local dir."""
    if isinstance(path, ObjectPath):
        return str(path)
    return os.path.abspath(path)
