"""The retention rules: from a save dir's facts (`facts.py`) and a policy, which iteration dirs could be deleted and
why each kept one stays. Pure: `plan_retention` reads nothing and deletes nothing.

An iteration is kept for every rule that holds for it (its `reasons`, in `Reason` order); the rest could be deleted.
The safety rules hold whatever the policy says:

- the tracker's target (`tracked`) and what a resume would load (`resume-pick`: Bridge's `latest_train_state.pt`
  step, or the newest loadable dir of a stack without a tracker) are never deleted, complete or not;
- the newest complete iteration (`newest-complete`; "complete" includes its integrity manifest checked, when it has
  one) is never deleted, so the dir is never left without a complete checkpoint;
- a save that may still be in flight (`in-flight`) is never deleted: an iteration that is not complete and whose
  newest write is within the age rule's grace, or whose age cannot be told (no modification times), or that is
  newer than the tracker's target and every complete iteration — an async save waiting for its finalize (Megatron
  finalizes in save order and only then writes `metadata.json` and the tracker, so a later complete iteration or a
  tracker naming a later one is the clock-free proof that this one's finalize will never come);
- an iteration that could not be read here (CK209, `unreadable`) and `release/` (`release`) are kept.

With no complete checkpoint at all, or a tracker whose target cannot be known (unparseable, unreadable, being
written), nothing is deleted (`no-complete-checkpoint`, `tracker-unknown`). The policy then adds `keep-last` (the
N newest complete iterations), `keep-every` (iteration % K == 0, whatever its status) and `milestone` (`--keep`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.commands.retain.facts import IterationFacts, ManifestState, SaveDirFacts, TrackerState, read_facts
from ckptinspect.errors import UsageError
from ckptinspect.findings import Finding, Status, status_of
from ckptinspect.model import StrEnum


class Reason(StrEnum):
    """Why an iteration is kept (stable strings: `keep[].reasons` in JSON). Declaration order is report order."""

    NO_COMPLETE_CHECKPOINT = "no-complete-checkpoint"  # no complete checkpoint in the dir: nothing is deleted
    TRACKER_UNKNOWN = "tracker-unknown"  # the tracker cannot be read: its target is unknown, nothing is deleted
    TRACKED = "tracked"  # latest_checkpointed_iteration.txt names it
    RESUME_PICK = "resume-pick"  # a resume would load it
    NEWEST_COMPLETE = "newest-complete"  # the newest complete (and, with a manifest, checked) iteration
    IN_FLIGHT = "in-flight"  # not complete and may still be written
    UNREADABLE = "unreadable"  # could not be read here (CK209)
    RELEASE = "release"  # release/: not an iteration of the run
    MILESTONE = "milestone"  # named by --keep
    KEEP_LAST = "keep-last"  # one of the --keep-last N newest complete iterations
    KEEP_EVERY = "keep-every"  # iteration % --keep-every K == 0


_ORDER = {r: i for i, r in enumerate(Reason)}


@dataclass(frozen=True, slots=True)
class RetainPolicy:
    """`--keep-last N` (N >= 0), `--keep-every K` (K >= 1, or None), `--keep ITER ...` (iteration numbers or dir
    names)."""

    keep_last: int
    keep_every: int | None = None
    keep: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        if self.keep_last < 0:
            raise UsageError(f"--keep-last {self.keep_last}: must be 0 or more")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"--keep-every {self.keep_every}: must be 1 or more")

    def to_dict(self) -> dict[str, Any]:
        return {"keep_last": self.keep_last, "keep_every": self.keep_every, "keep": list(self.keep)}


@dataclass(frozen=True, slots=True)
class Entry:
    """One iteration dir of the plan: kept when some rule keeps it (`reasons`, never empty then), else it could be
    deleted; `location` its full path; `manifest` its integrity manifest as checked."""

    name: str
    iteration: int | str
    status: Status
    reasons: tuple[Reason, ...]
    location: str
    manifest: ManifestState

    @property
    def kept(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "iteration": self.iteration, "status": self.status.value,
                "manifest": self.manifest.value, "reasons": [r.value for r in self.reasons]}


@dataclass(frozen=True, slots=True)
class RetainPlan:
    """The plan: every iteration dir in save-dir order (`entries`), the save dir's own findings then the plan's
    (CK520-CK523); `status` the one they imply. `delete` (dir names), `delete_paths` (their full paths) and `keep`
    are views of `entries`."""

    path: str
    policy: RetainPolicy
    tracker: TrackerState
    tracker_raw: str | None
    tracked: int | str | None
    entries: tuple[Entry, ...]
    findings: tuple[Finding, ...]

    @property
    def status(self) -> Status:
        return status_of(self.findings)

    @property
    def keep(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.kept)

    @property
    def delete(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries if not e.kept)

    @property
    def delete_paths(self) -> tuple[str, ...]:
        return tuple(e.location for e in self.entries if not e.kept)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "status": self.status.value, "policy": self.policy.to_dict(),
                "tracker": {"raw": self.tracker_raw, "iteration": self.tracked, "state": self.tracker.value},
                "delete": list(self.delete), "delete_paths": list(self.delete_paths),
                "keep": [k.to_dict() for k in self.keep], "findings": [f.to_dict() for f in self.findings]}


def retain(path: Path, policy: RetainPolicy, label: str | None = None, hash_files: bool = False) -> RetainPlan:
    """Read the save dir `path` and plan (`read_facts`, then `plan_retention`)."""
    return plan_retention(read_facts(path, label, hash_files), policy)


def plan_retention(facts: SaveDirFacts, policy: RetainPolicy) -> RetainPlan:
    """The retention plan for `facts` under `policy` (module doc)."""
    its = facts.iterations
    reasons: dict[str, set[Reason]] = {i.name: set() for i in its}
    findings: list[Finding] = list(facts.findings)
    complete = [i for i in its if i.status is Status.COMPLETE]
    numbered_complete = sorted((i for i in complete if i.numbered), key=lambda i: int(i.iteration))
    # every dir of the tracked iteration (`iter_0000002` and a stray `iter_2` alike), Megatron's own name first
    tracked_dirs = sorted((i for i in its if facts.tracker is TrackerState.NAMES and i.iteration == facts.tracked),
                          key=lambda i: i.name != _iter_name(facts.tracked))
    tracked = tracked_dirs[0] if tracked_dirs else None
    label = facts.path
    if not complete:
        findings.append(Finding("CK520", f"no complete checkpoint in {label}: nothing may be deleted", None, label,
                                {"iterations": len(its)}))
        _all(reasons, Reason.NO_COMPLETE_CHECKPOINT)
    if facts.tracker is TrackerState.UNKNOWN:
        findings.append(Finding("CK521", f"the tracker cannot be read ({facts.tracker_raw!r}): which iteration a "
                                "resume loads is not known, so nothing is deleted", "latest_checkpointed_iteration.txt",
                                label, {"tracker": facts.tracker_raw, "status": None}))
        _all(reasons, Reason.TRACKER_UNKNOWN)
    elif facts.tracker is TrackerState.NAMES and (tracked is None or tracked.status is not Status.COMPLETE):
        name = tracked.name if tracked is not None else _iter_name(facts.tracked)
        what = "does not exist" if tracked is None else f"is {tracked.status.value}"
        fallback = f"; the newest complete one, {numbered_complete[-1].name}, is kept" if numbered_complete else ""
        findings.append(Finding("CK521", f"the tracker names {name}, which {what}: it is kept (a resume loads it)"
                                + fallback, name, label,
                                {"iteration": facts.tracked, "status": tracked.status.value if tracked else None}))
    for i in tracked_dirs:
        reasons[i.name].add(Reason.TRACKED)
    if facts.resume_pick is not None and facts.resume_pick in reasons:
        reasons[facts.resume_pick].add(Reason.RESUME_PICK)
    if numbered_complete:
        reasons[numbered_complete[-1].name].add(Reason.NEWEST_COMPLETE)
    elif complete:  # only release/ is complete: it is kept below anyway
        reasons[complete[-1].name].add(Reason.NEWEST_COMPLETE)
    newest_done = max((int(i.iteration) for i in numbered_complete), default=None)
    for i in its:
        why = _in_flight(i, facts, newest_done)
        if why is not None:
            reasons[i.name].add(Reason.IN_FLIGHT)
            findings.append(Finding("CK522", f"{i.name} is {i.status.value} and may still be in flight "
                                    f"({_IN_FLIGHT[why]}): kept",
                                    i.name, label, {"iteration": i.iteration, "why": why,
                                                    **(i.age.to_dict() if i.age is not None else {})}))
        if i.unreadable:
            reasons[i.name].add(Reason.UNREADABLE)
        if i.iteration == "release":
            reasons[i.name].add(Reason.RELEASE)
        if policy.keep_every is not None and i.numbered and int(i.iteration) % policy.keep_every == 0:
            reasons[i.name].add(Reason.KEEP_EVERY)
    for i in numbered_complete[max(0, len(numbered_complete) - policy.keep_last):] if policy.keep_last else ():
        reasons[i.name].add(Reason.KEEP_LAST)
    for wanted in policy.keep:
        hit = [i for i in its if _names(i, wanted)]
        for i in hit:
            reasons[i.name].add(Reason.MILESTONE)
        if not hit:
            findings.append(Finding("CK523", f"--keep {wanted}: no such iteration in {label}", str(wanted), label,
                                    {"keep": wanted}))
    entries = tuple(Entry(i.name, i.iteration, i.status, tuple(sorted(reasons[i.name], key=_ORDER.__getitem__)),
                          i.location, i.manifest) for i in its)
    return RetainPlan(label, policy, facts.tracker, facts.tracker_raw, facts.tracked, entries, tuple(findings))


def _all(reasons: dict[str, set[Reason]], why: Reason) -> None:
    for r in reasons.values():
        r.add(why)


_IN_FLIGHT = {
    "recent-writes": "its newest write is within the age rule's grace",
    "no-times": "no modification times to tell a save being written from a crash leftover",
    "awaiting-finalize": "newer than the tracker's target and every complete iteration: an async save may await "
                         "its finalize",
}


def _in_flight(i: IterationFacts, facts: SaveDirFacts, newest_done: int | None) -> str | None:
    """Why `i` may still be written, a key of `_IN_FLIGHT` (None when it may not): see the module doc."""
    if i.status is Status.COMPLETE or i.age is None:
        return None
    if i.age.in_progress:
        return "recent-writes"
    if i.age.in_progress is None:
        return "no-times"
    if not i.numbered or i.age.superseded:
        return None
    n = int(i.iteration)
    tracked = facts.tracked if isinstance(facts.tracked, int) and not isinstance(facts.tracked, bool) else None
    if (tracked is None or n > tracked) and (newest_done is None or n > newest_done):
        return "awaiting-finalize"
    return None


def _names(i: IterationFacts, wanted: int | str) -> bool:
    if isinstance(wanted, int):
        return i.numbered and int(i.iteration) == wanted
    return i.name == wanted or str(i.iteration) == wanted


def _iter_name(iteration: int | str | None) -> str:
    return "release" if iteration == "release" else f"iter_{int(iteration or 0):07d}"


def parse_keep(values: Iterable[str]) -> tuple[int | str, ...]:
    """`--keep` values: an iteration number (`1000`) or a dir name (`iter_0001000`, `release`, `step-10`)."""
    out: list[int | str] = []
    for v in values:
        v = v.strip()
        out.append(int(v) if v.isdigit() else v)
    return tuple(out)

