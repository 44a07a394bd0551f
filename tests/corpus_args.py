"""Acceptance cases: training args (CK7xx).

Part of the corpus gathered in `tests/corpus.py` (see `tests/corpus_kit.py` for the builders)."""

from __future__ import annotations

from corpus_kit import Case, S, TD, _common, _set_args, td2


ARGS_CASES: tuple[Case, ...] = (
    Case("args_tp_disagrees_with_layout", td2(_common(_set_args(tensor_model_parallel_size=4))), "complete",
         S({"CK702"}), sources=TD),
    Case("no_args", td2(_common(lambda common: common.pop("args"))), "complete", S({"CK701"}), sources=TD),
)
