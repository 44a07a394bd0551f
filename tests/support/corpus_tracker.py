"""Acceptance cases: trackers (CK5xx; the 0.16.1 save dir: iter 1, 2 complete, 3 half-written, tracker = 2).

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from corpus_kit import Case, Ctx, S, TD, _rm, td_dir


def _tracker(text: bytes, age: float = 0) -> Callable[[Path, Ctx], None]:
    """The tracker holding `text`, last modified `age` seconds ago."""

    def mutate(save: Path, ctx: Ctx) -> None:
        tracker = save / "latest_checkpointed_iteration.txt"
        tracker.write_bytes(text)
        if age:
            t = time.time() - age
            os.utime(tracker, (t, t))

    return mutate



TRACKER_CASES: tuple[Case, ...] = (
    Case("tracker_garbage", td_dir(_tracker(b"abc")), "corrupt", S({"CK502"}), sources=TD),
    # empty long after it was written (an empty tracker within the grace is being written: CK133, corpus_inflight)
    Case("tracker_empty", td_dir(_tracker(b"", age=600)), "corrupt", S({"CK502"}), S({"CK133"}), sources=TD,
         subprocess=True),
    Case("tracker_names_missing_iteration", td_dir(_tracker(b"7")), "corrupt", S({"CK503"}), sources=TD),
    Case("tracker_names_unfinished_iteration", td_dir(_tracker(b"3")), "incomplete", S({"CK504", "CK101"}),
         sources=TD),
    Case("tracker_deleted", td_dir(_rm("latest_checkpointed_iteration.txt", "iter_0000003")), "complete",
         S({"CK501"}), sources=TD),
    Case("tracker_deleted_newest_unfinished", td_dir(_rm("latest_checkpointed_iteration.txt")), "incomplete",
         S({"CK501", "CK101"}), sources=TD),
    Case("tracker_behind_complete_iteration", td_dir(_tracker(b"1")), "complete", S({"CK505", "CK506"}),
         sources=TD),
)
