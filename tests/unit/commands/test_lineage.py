"""Tests of `ckptinspect.commands.audit.lineage` (CK524, a stale save) on real megatron-core 0.16.1 save dirs: a run
of two iterations with lr=0 (a real optimizer step between them that leaves the weights bit-equal,
tests/data/values_ckpts/stale_lr0) and the sample_ckpts/torch_dist run whose three iterations really train."""

from __future__ import annotations

from pathlib import Path

from ckptinspect.api import audit
from ckptinspect.commands.audit.lineage import Lineage, stale_saves

ROOT = Path(__file__).resolve().parents[3]
STALE = ROOT / "tests" / "data" / "values_ckpts" / "stale_lr0"


def test_a_real_stale_save_is_found() -> None:
    r = audit(STALE, all_iterations=True, values=True)
    (f,) = [f for f in r.findings if f.code == "CK524"]
    assert f.details["iteration"] == 2 and f.details["previous"] == 1 and f.details["model_tensors"] >= 17
    assert r.status.value == "complete" and r.exit_code() == 0 and r.exit_code("warning") == 1
    assert not [f for f in audit(STALE, all_iterations=True).findings if f.code == "CK524"]  # needs --values


def test_a_training_run_is_not_stale() -> None:
    r = audit(ROOT / "sample_ckpts" / "torch_dist", all_iterations=True, values=True)
    assert not [f for f in r.findings if f.code == "CK524"]
    scanned = [a for a in r.report.checkpoints if a.values is not None]
    assert len(scanned) == 3  # every iteration scanned, the half-written one included


def test_only_consecutive_advancing_iterations_count() -> None:
    a, b = {"w": "0" * 32}, {"w": "1" * 32}
    lines = [Lineage("iter_3", 3, a, 30), Lineage("iter_1", 1, a, 10), Lineage("iter_2", 2, b, 20)]
    assert stale_saves(lines, "d") == []  # 1 -> 2 changed, 2 -> 3 changed back: nothing is stale
    (f,) = stale_saves([Lineage("iter_1", 1, a, 10), Lineage("iter_2", 2, a, 20)], "d")
    assert f.subject == "iter_2" and "consumed_train_samples 10 -> 20" in f.message
    assert stale_saves([Lineage("x", 5, a, None), Lineage("y", 5, a, None)], "d") == []
