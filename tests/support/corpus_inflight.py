"""Acceptance cases: a Megatron save caught before its end (CK130, CK131 and the save dir's CK506; issue 25).

The 0.16.1 save dir (iter 1, 2 complete, 3 stopped before `metadata.json`, tracker = 2) gets the state a save in
progress leaves on disk at each step of Megatron's write order: an `iter_{N:07d}` dir just created (empty), holding
the `common.pt` rank 0 writes first (whole, or cut mid-write), or a `metadata.json` cut while rank 0's plain
`open('w')` + `json.dump` writes it. `tests/unit/formats/test_inflight.py` builds the same states by stopping a real
megatron-core save at those points; these cases keep every code in the acceptance corpus.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from corpus_kit import Case, Ctx, S, TD, td_dir

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
    Case("inflight_all_iterations", td_dir(_both(_rm_dir("iter_0000003"), _new_iteration(1.0))), "incomplete",
         S({"CK130", "CK506"}), flags=("--all",), sources=TD),
)
