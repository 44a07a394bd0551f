"""Save-dir checks: the tracker and the crash leftovers around it (CK501–CK506, reference §8.2).

Unlike the other checks this one looks at a save dir, not a checkpoint: it needs the status of every iteration.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ckptinspect.findings import Finding, Status
from ckptinspect.formats.savedir import (
    TRACKER,
    IterationDir,
    SaveDir,
    SaveDirStyle,
    tracked_missing,
    tracker_unparseable,
)


def run(save: SaveDir, statuses: Mapping[str, Status], label: str) -> Iterator[Finding]:
    """Findings for `save`, given the status of each iteration dir (by dir name)."""
    tracker = save.tracker
    if not tracker.exists:
        if save.style is SaveDirStyle.MEGATRON:
            yield Finding("CK501", f"no {TRACKER}: a resume picks nothing unless told (--ckpt-step)", TRACKER, label)
        return
    tracked = None
    if tracker.error is not None:
        yield tracker_unparseable(tracker, label)
    else:
        tracked = save.find(tracker.iteration)
    if tracker.error is not None:
        pass  # leftovers are still worth naming below
    elif tracked is None:
        yield tracked_missing(tracker, label)
    elif statuses.get(tracked.name) is Status.INCOMPLETE:
        yield Finding("CK504", f"{TRACKER} names {tracked.name}, which is not complete", tracked.name, label,
                      {"iteration": tracker.iteration})
    for it in save.iterations:
        if tracked is not None and it.name == tracked.name:
            continue
        status = statuses.get(it.name)
        if status is Status.COMPLETE and _newer(it, tracker.iteration):
            yield Finding("CK505", f"{it.name} is complete and newer than the tracked iteration (finalize never ran?)",
                          it.name, label, {"iteration": it.iteration})
        elif status is Status.INCOMPLETE:
            yield Finding("CK506", f"{it.name} is an incomplete save (leftover of a crash?)", it.name, label,
                          {"iteration": it.iteration})


def _newer(it: IterationDir, tracked: int | str | None) -> bool:
    return isinstance(it.iteration, int) and isinstance(tracked, int) and it.iteration > tracked
