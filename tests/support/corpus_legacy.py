"""Acceptance cases: legacy per-rank format (CK11x).

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

from corpus_kit import Case, LEG, S, _legacy_pt, _rm, _set_args, legacy, truncate


LEGACY_CASES: tuple[Case, ...] = (
    Case("legacy_missing_shard_dir", legacy(_rm("mp_rank_01_001")), "corrupt", S({"CK110"}), sources=LEG),
    Case("legacy_missing_distrib_optim", legacy(_rm("mp_rank_00_001/distrib_optim.pt")), "corrupt", S({"CK111"}),
         sources=LEG),
    Case("legacy_args_differ", legacy(_legacy_pt("mp_rank_01_000", _set_args(lr=0.5))), "complete", S({"CK112"}),
         sources=LEG),
    Case("legacy_truncated_pt", legacy(lambda it, x: truncate(it / "mp_rank_00_001" / "model_optim_rng.pt")),
         "corrupt", S({"CK206"}), sources=LEG),
)
