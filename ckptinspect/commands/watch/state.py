"""The state machine of `watch`: snapshots of a save dir in, events out. No clock, no sleeping, no I/O of its own.

A `Snapshot` is what one poll saw: the tracker's raw text and, per iteration dir, a `signature` (a digest of its
entries' names, sizes and newest modification time: it changes whenever the save writes, renames or removes a
file). The machine asks its `classify` callback (the driver's metadata-level audit, `poll.py`) for a `Verdict` only
for an iteration that is new, whose signature changed while it was not settled, or — when the tracker moved — one
still in flight. A settled iteration (audited once its final marker appeared, or found broken) is not looked at
again; it leaves the state when its dir disappears.

Per iteration it keeps `_Track` (name, iteration, signature, phase, status, codes, the time of its last change,
whether its stall was reported): nothing of the parsed metadata, so memory is bounded by the number of iteration
dirs present, not by how long the run goes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ckptinspect.findings import CODES, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, Severity, Status
from ckptinspect.model import StrEnum

STALL_CODE = "CK530"


class EventKind(StrEnum):
    """The `event` of one watch line (docs/contract.md "Watch")."""

    TRACKER_MOVED = "tracker_moved"  # the tracker's text changed (first poll: what it names at start)
    IN_FLIGHT = "iteration_in_flight"  # an unfinished save (new, its unfinished shape changed, or writing again)
    STALLED = "stalled"  # an in-flight save unchanged for --stall-after seconds (CK530; once per stall)
    COMPLETE = "iteration_complete"  # its final marker appeared and the audit found it complete
    AUDITED = "audited"  # the audit of a settled iteration: complete, or broken (corrupt, unsafe, superseded)
    REMOVED = "iteration_removed"  # its dir disappeared (retention)
    ERROR = "error"  # the save dir could not be read on this poll


@dataclass(frozen=True, slots=True)
class Seen:
    """One iteration dir on one poll."""

    name: str
    iteration: int | str
    signature: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll: `time` (epoch seconds, the poller's clock), the tracker's raw text (None: no tracker),
    the iteration dirs in save-dir order."""

    time: float
    tracker: str | None
    iterations: tuple[Seen, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The audit of one iteration: its status and finding codes; `in_flight`: not complete and still a save that
    may be written (an unfinished save's shape, the tracker naming no later iteration)."""

    status: Status
    codes: tuple[str, ...]
    in_flight: bool


@dataclass(frozen=True, slots=True)
class Event:
    """One state change. `status` / `codes`: the iteration's verdict (None / () where the event has none);
    `seconds`: for `stalled`, how long nothing changed; `message`: for `error`."""

    kind: EventKind
    time: float
    name: str | None = None
    iteration: int | str | None = None
    status: Status | None = None
    codes: tuple[str, ...] = ()
    seconds: float | None = None
    message: str | None = None

    def exit_code(self, fail_on: Severity | None) -> int:
        """What this event makes the run exit with (`--fail-fast` stops on the first non-zero): an `audited` or
        `stalled` event with a code at or above `fail_on` 1, an `error` event 2, anything else 0."""
        if self.kind is EventKind.ERROR:
            return EXIT_USAGE
        if fail_on is None or self.kind not in (EventKind.AUDITED, EventKind.STALLED):
            return EXIT_OK
        # a stall is judged by CK530 alone: the unfinished save's own codes (CK101, ...) are what in flight looks like
        codes = (STALL_CODE,) if self.kind is EventKind.STALLED else self.codes
        worst = max((CODES[c].severity.rank for c in codes), default=-1)
        return EXIT_FINDINGS if worst >= fail_on.rank else EXIT_OK

    def to_dict(self) -> dict[str, object]:
        return {"event": self.kind.value, "time": round(self.time, 3), "name": self.name,
                "iteration": self.iteration, "status": self.status.value if self.status is not None else None,
                "codes": list(self.codes), "seconds": None if self.seconds is None else round(self.seconds, 3),
                "message": self.message}


class Phase(StrEnum):
    IN_FLIGHT = "in_flight"
    SETTLED = "settled"


@dataclass(slots=True)
class _Track:
    iteration: int | str
    signature: str
    phase: Phase
    status: Status
    codes: tuple[str, ...]
    changed_at: float
    stalled: bool = False


@dataclass(slots=True)
class Watcher:
    """Feed it snapshots in time order (`observe`); it returns the events each one causes. `stall_after`: seconds an
    in-flight save may stay unchanged before one `stalled` event."""

    classify: Callable[[str], Verdict]
    stall_after: float
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _tracker: str | None = None
    _polls: int = 0

    def tracked(self) -> int:
        """How many iteration dirs the machine holds state for (what its memory grows with)."""
        return len(self._tracks)

    def phase(self, name: str) -> Phase | None:
        """The phase of iteration dir `name` (None: not seen, or removed)."""
        t = self._tracks.get(name)
        return t.phase if t is not None else None

    def observe(self, snap: Snapshot) -> list[Event]:
        out: list[Event] = []
        moved = self._polls == 0 and snap.tracker is not None or self._polls > 0 and snap.tracker != self._tracker
        self._polls += 1
        if moved:
            self._tracker = snap.tracker
            out.append(Event(EventKind.TRACKER_MOVED, snap.time, iteration=_tracker_value(snap.tracker),
                             message=None if snap.tracker is not None else "the tracker was removed"))
        present = {s.name for s in snap.iterations}
        for name in [n for n in self._tracks if n not in present]:
            t = self._tracks.pop(name)
            out.append(Event(EventKind.REMOVED, snap.time, name, t.iteration, t.status, t.codes))
        for seen in snap.iterations:
            out.extend(self._step(seen, snap.time, moved))
        return out

    def done(self, name: str) -> bool:
        """Whether iteration dir `name` is settled complete: never looked at again (no signature needed)."""
        t = self._tracks.get(name)
        return t is not None and t.phase is Phase.SETTLED and t.status is Status.COMPLETE

    def _step(self, seen: Seen, now: float, moved: bool) -> Iterable[Event]:
        t = self._tracks.get(seen.name)
        if t is not None and t.phase is Phase.SETTLED:
            # complete: final. Broken: audited again only when its dir changes (a slow save the audit judged
            # damaged while it was still written — a legacy file cut short past the grace — may yet finish)
            if t.status is Status.COMPLETE or t.signature == seen.signature:
                return ()
            verdict = self.classify(seen.name)
            if verdict.in_flight:
                self._tracks[seen.name] = _Track(seen.iteration, seen.signature, Phase.IN_FLIGHT, verdict.status,
                                                 verdict.codes, now)
                return (Event(EventKind.IN_FLIGHT, now, seen.name, seen.iteration, verdict.status, verdict.codes),)
            same = verdict.status is t.status and verdict.codes == t.codes
            t.signature, t.status, t.codes, t.changed_at = seen.signature, verdict.status, verdict.codes, now
            return () if same else self._settled(seen, now, verdict)
        if t is not None and t.signature == seen.signature and not moved:
            if not t.stalled and now - t.changed_at >= self.stall_after:
                t.stalled = True
                return (Event(EventKind.STALLED, now, seen.name, t.iteration, t.status, (*t.codes, STALL_CODE),
                              seconds=now - t.changed_at),)
            return ()
        verdict = self.classify(seen.name)
        changed = t is None or t.signature != seen.signature
        if verdict.in_flight:
            was_stalled = t is not None and t.stalled and changed
            report = t is None or t.codes != verdict.codes or t.status is not verdict.status or was_stalled
            if t is None:
                t = _Track(seen.iteration, seen.signature, Phase.IN_FLIGHT, verdict.status, verdict.codes, now)
                self._tracks[seen.name] = t
            else:
                if changed:
                    t.changed_at, t.stalled = now, False
                t.signature, t.status, t.codes = seen.signature, verdict.status, verdict.codes
            if report:
                return (Event(EventKind.IN_FLIGHT, now, seen.name, seen.iteration, verdict.status, verdict.codes),)
            return ()
        self._tracks[seen.name] = _Track(seen.iteration, seen.signature, Phase.SETTLED, verdict.status,
                                         verdict.codes, now)
        return self._settled(seen, now, verdict)

    def _settled(self, seen: Seen, now: float, verdict: Verdict) -> tuple[Event, ...]:
        audited = Event(EventKind.AUDITED, now, seen.name, seen.iteration, verdict.status, verdict.codes)
        if verdict.status is Status.COMPLETE:
            return (Event(EventKind.COMPLETE, now, seen.name, seen.iteration, verdict.status, verdict.codes),
                    audited)
        return (audited,)


def _tracker_value(raw: str | None) -> int | str | None:
    if raw is None:
        return None
    text = raw.strip()
    return int(text) if text.isdigit() else text
