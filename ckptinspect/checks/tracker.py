"""Save-dir checks: the tracker and the crash leftovers around it (CK501–CK506, reference §8.2).

Unlike the other checks this one looks at a save dir, not a checkpoint: it needs the status of every iteration.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ckptinspect.findings import Finding, Status
from ckptinspect.formats.inflight import age_of
from ckptinspect.formats.savedir import (
    TRACKER,
    IterationDir,
    SaveDir,
    SaveStyle,
    read_tracker,
    tracked_missing,
    tracker_unparseable,
)


def run(save: SaveDir, statuses: Mapping[str, Status], label: str) -> Iterator[Finding]:
    """Findings for `save`, given the status of each iteration dir (by dir name)."""
    tracker = save.tracker
    yield from _non_persistent(save, label)
    if save.bridge_step is not None and save.find(save.bridge_step) is None:
        yield Finding("CK503", f"latest_train_state.pt (Megatron-Bridge's tracker, read first) names step "
                      f"{save.bridge_step}, whose iter_{save.bridge_step:07d} does not exist", "latest_train_state.pt",
                      label, {"iteration": save.bridge_step})
    if save.bridge_step is not None and save.bridge_step != tracker.iteration:
        yield Finding("CK514", f"latest_train_state.pt names step {save.bridge_step} but {TRACKER} names "
                      f"{tracker.iteration!r}: the save stopped between the two (Bridge writes latest_train_state.pt "
                      "first); Bridge resumes from the step in latest_train_state.pt", "latest_train_state.pt", label,
                      {"train_state_step": save.bridge_step, "tracker": tracker.iteration})
    if not tracker.exists:
        if save.style is SaveStyle.MEGATRON:
            yield Finding("CK501", f"no {TRACKER}: a resume picks nothing unless told (--ckpt-step)", TRACKER, label)
            return
        # torchtitan / NeMo 2 / NVRx keep no tracker: the stack loads the newest complete one, the rest are leftovers
        pick = save.resume_pick()
        for it in save.iterations:
            if (pick is None or it.name != pick.name) and statuses.get(it.name) is Status.INCOMPLETE:
                yield _unfinished(it, label, None, "the stack skips it")
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
            yield _unfinished(it, label, tracker.iteration)


def _unfinished(it: IterationDir, label: str, tracked: int | str | None, note: str | None = None) -> Finding:
    """CK506 for an incomplete iteration, with the age rule's verdict (`formats/inflight.py`): a save being written
    (its newest file is within the grace, and the tracker — `tracked`, as read — names no later iteration) or a
    crash leftover."""
    age = age_of(it.path, it.iteration if isinstance(it.iteration, int) else None, tracked=tracked)
    what = age.describe() + (f"; {note}" if note else "")
    return Finding("CK506", f"{it.name} is an incomplete save: {what}", it.name, label,
                   {"iteration": it.iteration, **age.to_dict()})


def _non_persistent(save: SaveDir, label: str) -> Iterator[Finding]:
    """Megatron `--non-persistent-ckpt-type global` keeps `{save}/non_persistent/` with its own tracker and resumes
    from it when its iteration is at least the persistent tracker's (training/checkpointing.py load_checkpoint)."""
    np_dir = save.path / "non_persistent"
    if save.style is not SaveStyle.MEGATRON or not np_dir.is_dir():
        return
    np_tracker = read_tracker(np_dir)
    it = np_tracker.iteration if np_tracker.error is None else None
    newer = isinstance(it, int) and (not isinstance(save.tracker.iteration, int) or it >= save.tracker.iteration)
    yield Finding("CK511", f"non_persistent/ holds Megatron's non-persistent global checkpoint (tracker: {it!r}); "
                  + ("a resume with --non-persistent-ckpt-type global loads it instead of the persistent one"
                     if newer else "older than the persistent tracker, so a resume ignores it")
                  + f" (audit it with: ckptinspect audit {label.rstrip('/')}/non_persistent)",
                  "non_persistent", label, {"iteration": it, "preferred": newer})


def _newer(it: IterationDir, tracked: int | str | None) -> bool:
    return isinstance(it.iteration, int) and isinstance(tracked, int) and it.iteration > tracked
