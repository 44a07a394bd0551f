"""The one builder of the pickle-safety findings (CK601 dangerous, CK602 outside the allowlist, CK604 called).

Both ways a pickle is judged end here: a reader's `PickleReport` (what the safe unpickler and the walk merged into it
saw: `formats/`) and a scan's `PickleWalk` (`services/safety_containers.py`). Both hold the same two facts, the
verdict of every global (`policy.resolve`) and the globals called (with where), so the findings are built once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptinspect.findings import Finding
from ckptinspect.pickling.allowlist import GlobalClass


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
