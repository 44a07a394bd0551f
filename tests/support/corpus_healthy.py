"""Acceptance cases: healthy checkpoints: every sample and the 0.19.2 fixture audit `complete`.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

from corpus_kit import Case, DCP, FULLY, LEG, M19, MANIFEST_CODES, NOT_FULLY, S, TD, _plain, td_iter2, td_save


HEALTHY_CASES: tuple[Case, ...] = (
    Case("ok_torch_dist_save_dir", td_save, "complete", S({"CK506"}), S({"CK504", "CK505", "CK801"}), sources=TD,
         subprocess=True),
    Case("ok_torch_dist_checkpoint", td_iter2, "complete", S({"CK400"}), sources=TD),
    Case("ok_torch_dist_checkpoint_deep", td_iter2, "complete", absent=S({"CK205"}), flags=("--deep",), sources=TD),
    Case("ok_torch_dist_fully_save_dir", _plain("torch_dist_fully"), "complete", absent=S({"CK801"}), sources=FULLY),
    # saved with --no-ckpt-fully-parallel-save: DP rank 0 wrote every weight (info only, still complete)
    Case("ok_torch_dist_not_fully_save_dir", _plain("torch_dist_not_fully"), "complete", S({"CK801"}),
         sources=NOT_FULLY),
    Case("ok_torch_dist_not_fully_ignored", _plain("torch_dist_not_fully", "iter_0000001"), "complete",
         absent=S({"CK801"}), flags=("--ignore", "CK8"), sources=NOT_FULLY),
    Case("ok_legacy_save_dir", _plain("legacy"), "complete", absent=S({"CK112", "CK602"}), sources=LEG,
         subprocess=True),
    Case("ok_legacy_checkpoint", _plain("legacy", "iter_0000001"), "complete", sources=LEG),
    Case("ok_dcp_checkpoint", _plain("dcp", "step-10"), "complete", sources=DCP),
    Case("ok_dcp_run_dir", _plain("dcp"), "complete", absent=S({"CK501"}), sources=DCP),
    Case("ok_mcore_0192_save_dir", _plain("mcore-0.19.2"), "complete", absent=MANIFEST_CODES | {"CK400"}, sources=M19,
         subprocess=True),
    Case("ok_mcore_0192_deep", _plain("mcore-0.19.2", "iter_0000400"), "complete", absent=S({"CK205", "CK400"}),
         flags=("--deep",), sources=M19),
)
