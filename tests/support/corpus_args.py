"""Acceptance cases: training args (CK7xx).

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corpus_kit import LEG, Case, Ctx, S, TD, _common, _legacy_pt, _set_args, legacy, td2


def _every_legacy_shard(**values: object) -> Callable[[Path, Ctx], None]:
    """The same args change in the four `model_optim_rng.pt` of the legacy TP2 PP2 sample."""
    edits = [_legacy_pt(f"mp_rank_0{t}_00{p}", _set_args(**values)) for t in (0, 1) for p in (0, 1)]

    def mutate(it: Path, ctx: Ctx) -> None:
        for edit in edits:
            edit(it, ctx)

    return mutate


ARGS_CASES: tuple[Case, ...] = (
    Case("args_tp_disagrees_with_layout", td2(_common(_set_args(tensor_model_parallel_size=4))), "complete",
         S({"CK702"}), sources=TD),
    Case("no_args", td2(_common(lambda common: common.pop("args"))), "complete", S({"CK701"}), sources=TD),
    # issue 25: a str / inf where a size belongs made every command exit 3 (int() in the shard-dir reader); now the
    # arg is named (CK703) and the mp_rank_TT_PPP dirs give PP
    Case("args_pipeline_size_not_an_int", legacy(_every_legacy_shard(pipeline_model_parallel_size="x")), "complete",
         S({"CK703"}), S({"CK110"}), sources=LEG),
    Case("args_pipeline_size_inf", legacy(_every_legacy_shard(pipeline_model_parallel_size=float("inf"))),
         "complete", S({"CK703"}), S({"CK110"}), sources=LEG),
)
