"""Acceptance cases: a Megatron save caught before its end (CK130-CK133 and the save dir's CK506; issue 25).

The 0.16.1 save dir (iter 1, 2 complete, 3 stopped before `metadata.json`, tracker = 2) gets the state a save in
progress leaves on disk at each step of Megatron's write order: an `iter_{N:07d}` dir just created (empty), holding
the `common.pt` rank 0 writes first (whole, or cut mid-write), or a `metadata.json` cut while rank 0's plain
`open('w')` + `json.dump` writes it. `tests/unit/formats/test_inflight.py` builds the same states by stopping a real
megatron-core save at those points; these cases keep every code in the acceptance corpus. The legacy TP2 PP2 sample
(iter 1, tracked) gets a next save `iter_0000002` half written (a shard dir not made yet, one `model_optim_rng.pt`
cut), fresh (CK132) or older than the grace (CK110 / CK206 as before), and the 0.16.1 save dir an empty tracker
(`open('w')` before the number is written), fresh: CK133 (an old one is `corpus_tracker`'s CK502).
`tests/unit/formats/test_inflight_legacy.py` stops a real legacy save at those points.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from corpus_kit import LEG, Case, Ctx, S, TD, legacy, td_dir

NEW = "iter_0000004"


def _new_iteration(common_pt: float | None) -> Callable[[Path, Ctx], None]:
    """`iter_0000004/` as rank 0 leaves it right after `os.makedirs` (None) or while / after `torch.save`-ing
    `common.pt` (the fraction of iteration 2's `common.pt` written)."""

    def mutate(save: Path, ctx: Ctx) -> None:
        (save / NEW).mkdir()
        if common_pt is not None:
            data = (save / "iter_0000002" / "common.pt").read_bytes()
            (save / NEW / "common.pt").write_bytes(data[:int(len(data) * common_pt)])

    return mutate


def _cut_marker(iteration: str, keep: int) -> Callable[[Path, Ctx], None]:
    """`metadata.json` of `iteration` holding the first `keep` bytes of the 0.16.1 marker (119 bytes)."""

    def mutate(save: Path, ctx: Ctx) -> None:
        data = (save / "iter_0000001" / "metadata.json").read_bytes()
        (save / iteration / "metadata.json").write_bytes(data[:keep])

    return mutate


def _both(*mutations: Callable[[Path, Ctx], None]) -> Callable[[Path, Ctx], None]:
    def mutate(save: Path, ctx: Ctx) -> None:
        for m in mutations:
            m(save, ctx)

    return mutate


def _rm_dir(name: str) -> Callable[[Path, Ctx], None]:
    return lambda save, ctx: shutil.rmtree(save / name)


def _set_age(root: Path, seconds: float) -> None:
    """`root` and everything under it last modified `seconds` ago."""
    t = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t))
    os.utime(root, (t, t))


def _legacy_next_save(age: float) -> Callable[[Path, Ctx], None]:
    """Called with the legacy sample's iter_0000001: `iter_0000002` as a legacy save leaves it part way (rank
    (tp 1, pp 1) has not made its shard dir yet, (tp 1, pp 0) is `torch.save`-ing its model file), `age` s old."""

    def mutate(it1: Path, ctx: Ctx) -> None:
        it2 = it1.parent / "iter_0000002"
        shutil.copytree(it1, it2)
        shutil.rmtree(it2 / "mp_rank_01_001")
        model = it2 / "mp_rank_01_000" / "model_optim_rng.pt"
        model.write_bytes(model.read_bytes()[:3000])
        _set_age(it2, age)

    return mutate


def _empty_tracker(age: float) -> Callable[[Path, Ctx], None]:
    """The tracker as Megatron's `open('w')` leaves it before `write(str(iteration))`, `age` s old."""

    def mutate(save: Path, ctx: Ctx) -> None:
        tracker = save / "latest_checkpointed_iteration.txt"
        tracker.write_bytes(b"")
        t = time.time() - age
        os.utime(tracker, (t, t))

    return mutate


INFLIGHT_CASES: tuple[Case, ...] = (
    Case("inflight_empty_iteration_dir", td_dir(_new_iteration(None)), "complete", S({"CK130", "CK506"}),
         S({"CK100"}), sources=TD),
    Case("inflight_only_common_pt", td_dir(_new_iteration(1.0)), "complete", S({"CK130", "CK506"}),
         S({"CK100", "CK206"}), sources=TD),
    Case("inflight_common_pt_cut", td_dir(_new_iteration(0.4)), "complete", S({"CK130", "CK506"}),
         S({"CK100", "CK206"}), sources=TD),
    Case("inflight_metadata_json_cut", td_dir(_cut_marker("iter_0000003", 40)), "complete",
         S({"CK131", "CK506"}), S({"CK104"}), sources=TD),
    Case("inflight_metadata_json_empty", td_dir(_cut_marker("iter_0000003", 0)), "complete",
         S({"CK131", "CK506"}), S({"CK104"}), sources=TD),
    # the tracker is written after the marker: a cut marker in the tracked iteration was whole once
    Case("tracked_metadata_json_cut", td_dir(_cut_marker("iter_0000002", 40)), "corrupt", S({"CK104"}),
         S({"CK131"}), sources=TD),
    # --all audits every iteration and every one decides: the status says what the exit code says
    # a legacy save being written (CK132) and the same files left by a crash (older than the 120 s grace)
    Case("inflight_legacy_next_save", legacy(_legacy_next_save(0)), "complete", S({"CK132", "CK506"}),
         S({"CK110", "CK206"}), sources=LEG),
    Case("legacy_next_save_crash_leftover", legacy(_legacy_next_save(600)), "complete", S({"CK110", "CK206"}),
         S({"CK132"}), sources=LEG),
    # the tracker being written (CK133; an empty one long after is CK502: corpus_tracker's tracker_empty)
    Case("inflight_tracker_empty", td_dir(_empty_tracker(0)), "incomplete", S({"CK133"}), S({"CK502"}), sources=TD),
    Case("inflight_all_iterations", td_dir(_both(_rm_dir("iter_0000003"), _new_iteration(1.0))), "incomplete",
         S({"CK130", "CK506"}), flags=("--all",), sources=TD),
)
