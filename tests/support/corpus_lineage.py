"""Acceptance cases: lineage across a save dir's iterations (CK525-CK529), on save dirs put together from real
megatron-core 0.16.1 iteration dirs the way users and restarts do it: a dir renamed (with and without the tracker
edited to match), two runs' iterations in one dir (tests/data/values_ckpts/restart_gbs1: another real run of
stale_lr0's model with a global batch of 1), and a data position that did not advance. Plain `audit SAVE_DIR`: these
rules need only each iteration's common state.

Part of the corpus gathered in `tests/support/corpus.py`."""

from __future__ import annotations

import shutil
from pathlib import Path

from corpus_kit import TD, Case, Ctx, S, copy_source

LINEAGE_CODES = S({f"CK52{n}" for n in range(5, 10)})
STALE = ("values_stale_lr0",)


def _combined(ctx: Ctx, parts: dict[str, tuple[str, str]], tracker: str) -> Path:
    """A save dir of iteration dirs copied from sources (`name: (source, iteration dir)`)."""
    save = ctx.work / "save"
    save.mkdir()
    copies: dict[str, Path] = {}
    for name, (source, it) in parts.items():
        if source not in copies:
            copies[source] = copy_source(ctx, source)
        shutil.move(str(copies[source] / it), save / name)
    (save / "latest_checkpointed_iteration.txt").write_text(tracker)
    return save


def renamed(ctx: Ctx) -> Path:
    """stale_lr0's iter_0000002 copied away as iter_0000009 (the tracker still names iteration 1)."""
    return _combined(ctx, {"iter_0000001": ("values_stale_lr0", "iter_0000001"),
                           "iter_0000009": ("values_stale_lr0", "iter_0000002")}, "1")


def renamed_tracked(ctx: Ctx) -> Path:
    """The 0.16.1 sample's iter_0000002 renamed iter_0000005 and the tracker edited to 5."""
    save = copy_source(ctx, "torch_dist")
    (save / "iter_0000002").rename(save / "iter_0000005")
    (save / "latest_checkpointed_iteration.txt").write_text("5")
    return save


def two_runs(ctx: Ctx) -> Path:
    """stale_lr0's iterations 1, 2 (4 samples at 2) and restart_gbs1's iteration 3 (3 samples)."""
    return _combined(ctx, {"iter_0000001": ("values_stale_lr0", "iter_0000001"),
                           "iter_0000002": ("values_stale_lr0", "iter_0000002"),
                           "iter_0000003": ("values_restart_gbs1", "iter_0000003")}, "3")


def samples_stuck(ctx: Ctx) -> Path:
    """The 0.16.1 sample's iteration 1 (global batch 4: 4 samples) and stale_lr0's iteration 2 (4 samples)."""
    return _combined(ctx, {"iter_0000001": ("torch_dist", "iter_0000001"),
                           "iter_0000002": ("values_stale_lr0", "iter_0000002")}, "2")


LINEAGE_CASES: tuple[Case, ...] = (
    Case("lineage_renamed_dir", renamed, "complete", S({"CK525"}), LINEAGE_CODES - {"CK525"}, sources=STALE),
    Case("lineage_renamed_tracked_dir", renamed_tracked, "complete", S({"CK526"}), LINEAGE_CODES - {"CK526"},
         sources=TD),
    Case("lineage_two_runs_in_one_dir", two_runs, "complete", S({"CK527", "CK529"}),
         LINEAGE_CODES - {"CK527", "CK529"}, sources=(*STALE, "values_restart_gbs1")),
    Case("lineage_samples_not_advancing", samples_stuck, "complete", S({"CK528"}), LINEAGE_CODES - {"CK528"},
         sources=(*TD, *STALE)),
    Case("lineage_healthy_run", lambda ctx: copy_source(ctx, "values_stale_lr0"), "complete",
         absent=LINEAGE_CODES, flags=("--all",), sources=STALE),
)
