"""The one `PickleReport` and the one builder of the pickle-safety findings (CK601 dangerous, CK602 outside the
allowlist, CK604 called; CK603 / CK605 for a walk past its bounds: `bound_finding`).

`PickleReport` is what the readers of pickles saw: the verdict of every global (`policy.resolve`) and the globals
called (with where), filled by the safe unpickler, the opcode walk merged into it and the streaming `.metadata`
reader. Both ways a pickle is judged end in `safety_findings`: a reader's `PickleReport` (`formats/`) and a scan's
`PickleWalk` (`services/safety_containers.py`) hold the same two facts, so the findings are built once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptinspect.findings import Finding
from ckptinspect.pickling.allowlist import GlobalClass

if TYPE_CHECKING:
    from ckptinspect.pickling.walk import PickleWalk

# How bad a verdict is: a name seen twice keeps the worse (the walk's `PickleWalk.globals`, `PickleReport.note`).
VERDICT_RANK = {GlobalClass.ALLOWED: 0, GlobalClass.UNKNOWN: 1, GlobalClass.DANGEROUS: 2}


@dataclass(slots=True)
class PickleReport:
    """What one unpickling saw: every global it referenced, with the allowlist verdict."""

    globals: dict[str, GlobalClass] = field(default_factory=dict)
    called: dict[str, str] = field(default_factory=dict)  # globals called that are not inert constructors → where

    def note(self, qual: str, verdict: GlobalClass) -> None:
        """Record a global as the pickle spells it. One spelling can name two globals (`torch` + `a.B` and `torch.a` +
        `B` are both `torch.a.B`, judged apart by `policy.resolve`): the worse verdict stays, whatever the order."""
        prev = self.globals.get(qual)
        if prev is None or VERDICT_RANK[verdict] > VERDICT_RANK[prev]:
            self.globals[qual] = verdict

    def merge(self, other: PickleReport) -> None:
        """Take over what another report saw (a sniff's read, one rank's `__R.metadata`)."""
        for q, v in other.globals.items():
            self.note(q, v)
        for q, at in other.called.items():
            self.called.setdefault(q, at)

    def merge_walk(self, walk: PickleWalk, where: str = "") -> None:
        """Take over what the opcode walk of a pickle found (the verdict `scan` gives the same bytes)."""
        for q, v in walk.globals.items():
            self.note(q, v)
        for q, at in walk.called.items():
            self.called.setdefault(q, f"{at}{' of ' + where if where else ''}")

    @property
    def unsafe(self) -> bool:
        """The real loader would run code from what was read: a dangerous global, or a call outside the inert
        constructors."""
        return bool(self.called) or bool(self.dangerous)

    @property
    def dangerous(self) -> list[str]:
        return sorted(k for k, v in self.globals.items() if v is GlobalClass.DANGEROUS)

    @property
    def unknown(self) -> list[str]:
        return sorted(k for k, v in self.globals.items() if v is GlobalClass.UNKNOWN)


def safety_findings(verdicts: Mapping[str, GlobalClass], called: Mapping[str, str], subject: str, path: str | None,
                    what: str, details: Mapping[str, Any] | None = None) -> list[Finding]:
    """CK601 / CK604 / CK602 for one pickle: `verdicts` is global → verdict, `called` global → where it is called;
    `what` starts every message (`"common.pt: pickle"`), `details` go into every finding."""
    extra = dict(details or {})
    out: list[Finding] = []
    dangerous = sorted(q for q, v in verdicts.items() if v is GlobalClass.DANGEROUS)
    if dangerous:
        out.append(Finding("CK601", f"{what} references dangerous callable(s) {', '.join(dangerous)} (not executed)",
                           subject, path, {**extra, "globals": dangerous}))
    calls = {q: at for q, at in called.items() if q not in dangerous}
    if calls:
        out.append(called_finding(calls, subject, path, what, extra))
    unknown = sorted(q for q, v in verdicts.items() if v is GlobalClass.UNKNOWN and q not in calls)
    if unknown:
        out.append(Finding("CK602", f"{what} references global(s) outside the allowlist: {', '.join(unknown)} "
                           "(kept opaque, not executed)", subject, path, {**extra, "globals": unknown}))
    return out


def called_finding(called: Mapping[str, str], subject: str, path: str | None, what: str,
                   details: Mapping[str, object] | None = None) -> Finding:
    """CK604: the pickle calls globals that are not inert constructors (the real loader would run them)."""
    names = sorted(called)
    return Finding(
        "CK604", f"{what} calls {', '.join(names)}, which {'is' if len(names) == 1 else 'are'} not an inert "
        "constructor: torch.load / pickle.load would run it (not executed here)", subject, path,
        {**(details or {}), "globals": names, "calls": {q: called[q] for q in names}},
    )


def bound_finding(limit: str, unjudged: bool, subject: str, path: str | None, what: str,
                  details: Mapping[str, object]) -> Finding:
    """CK605 when a walk hit a bound of the scanner's own (the rest was not judged: fail closed), CK603 when the pickle
    exceeds what the unpickler could build (`PickleWalk.limit` / `unjudged`)."""
    if unjudged:
        return Finding("CK605", f"{what} was not judged to its end, a bound of the scanner's was hit: {limit} (fail "
                       "closed: what follows may run code)", subject, path, dict(details))
    return Finding("CK603", f"{what} exceeds the scanner's bounds: {limit}", subject, path, dict(details))
