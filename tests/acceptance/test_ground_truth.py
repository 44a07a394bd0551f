"""Ground truth for `resume`: megatron-core's own loader, at the saved and at new topologies, on the real samples.

For every pair (sample, target TP×PP×DP, with or without the optimizer) `resume` predicts model and optimizer
outcomes; `tools/mcore_load.py` then builds the samples' model at the target topology with the installed
megatron-core (the test extra: 0.16.1) and runs Megatron's torch_dist load path (`dist_checkpointing.load` of the
model and DistributedOptimizer sharded state dicts, then `load_state_dict`). A pair agrees when the real load
succeeds exactly where `resume` predicts `loaded`/`resharded` for every loaded component, and raises where it
predicts `fails`. The loads run in one gloo process group per target topology (4 spawns, world ≤ 4).
The "Prediction vs real load" table of docs/benchmarks.md is this PAIRS list.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest

from ckptinspect.commands.resume import Component, Outcome, ResumeTarget, predict_resume
from ckptinspect.formats import read_checkpoint

pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_ckpts"
sys.path.insert(0, str(ROOT / "tools"))
import mcore_load  # noqa: E402

pytestmark = pytest.mark.slow

# The samples' model (sample_ckpts/README.md): 2 layers, hidden 16, 4 heads, padded vocab 128 (TP 1 and 2), seq 16.
MODEL = {"layers": 2, "hidden": 16, "heads": 4, "padded_vocab_size": 128, "seq_length": 16}
OK = {Outcome.LOADED, Outcome.RESHARDED}

# (sample, (tp, pp, dp), load the optimizer?) — every sample saved at TP2 × PP1 × DP2.
PAIRS: list[tuple[str, tuple[int, int, int], bool]] = [
    ("torch_dist_fully", (2, 1, 2), True),        # 0.16.1 fully_reshardable, same topology
    ("mcore_0_15_3", (2, 1, 2), True),            # 0.15.3 dp_reshardable read by 0.16.1
    ("mcore_0_13_1", (2, 1, 2), True),            # 0.13.1 flattened optimizer: 0.16 cannot load it
    ("mcore_0_13_1", (2, 1, 2), False),           #   ... but the weights load (--no-load-optim)
    ("mcore_0_13_1_dpzero", (2, 1, 2), True),     # dp_zero_gather_scatter
    ("mcore_0_14_0", (2, 1, 2), True),            # 0.14.0 flattened
    ("mcore_0_14_0", (2, 1, 2), False),
    ("mcore_0_15_3_zarr", (2, 1, 2), False),      # zarr backend: 0.16 has no zarr load strategy
    ("torch_dist_fully", (1, 1, 2), True),        # TP change, fully_reshardable
    ("mcore_0_15_3", (1, 1, 2), True),            # TP change, dp_reshardable
    ("mcore_0_15_3", (1, 1, 2), False),           # TP change, weights only
    ("mcore_0_13_1_dpzero", (1, 1, 2), True),     # TP change, dp_zero_gather_scatter
    ("mcore_0_13_1", (1, 1, 2), False),           # TP change of flattened-era weights
    ("torch_dist_fully", (2, 1, 1), True),        # DP change, fully_reshardable
    ("mcore_0_15_3", (2, 1, 1), True),            # DP change, dp_reshardable
    ("mcore_0_13_1_dpzero", (2, 1, 1), True),     # DP change, dp_zero_gather_scatter
    ("torch_dist_fully", (2, 2, 1), True),        # PP change, fully_reshardable
    ("mcore_0_15_3", (2, 2, 1), True),            # PP change, dp_reshardable
    ("mcore_0_14_0", (2, 2, 1), False),           # PP change of flattened-era weights
]


# Loads that raise on some ranks only (DP-rank-0 scatter / per-rank bucket checks at a TP change) leave the other
# ranks inside Megatron's collectives: they run in their own process group so no other case depends on them.
SOLO = {"mcore_0_15_3@tp1pp1dp2", "mcore_0_13_1_dpzero@tp1pp1dp2"}


def _ckpt_dir(sample: str) -> Path:
    return SAMPLES / sample / "iter_0000001"


def _case_id(sample: str, topo: tuple[int, int, int], optim: bool) -> str:
    return f"{sample}@tp{topo[0]}pp{topo[1]}dp{topo[2]}{'' if optim else '-no-optim'}"


@lru_cache(maxsize=1)
def _real_loads() -> dict[str, dict[str, object]]:
    by_topo: dict[tuple[tuple[int, int, int], bool], list[tuple[str, str, bool]]] = defaultdict(list)
    for sample, topo, optim in PAIRS:
        case = _case_id(sample, topo, optim)
        by_topo[topo, case in SOLO].append((case, str(_ckpt_dir(sample)), optim))
    out: dict[str, dict[str, object]] = {}
    for ((tp, pp, dp), _), cases in by_topo.items():
        try:
            out.update(mcore_load.load_cases(cases, tp, pp, dp, MODEL, timeout=600))
        except RuntimeError as e:  # the harness itself broke: every case of this batch fails (cached, no rerun)
            out.update({c: {"ok": None, "error": f"load harness failed: {e}"} for c, _, _ in cases})
    return out


def predicted_ok(sample: str, topo: tuple[int, int, int], optim: bool) -> tuple[bool, str]:
    ckpt = read_checkpoint(_ckpt_dir(sample), sample)
    pred = predict_resume(ckpt, ResumeTarget(tp=topo[0], pp=topo[1], dp=topo[2], no_load_optim=not optim))
    comps = [Component.MODEL] + ([Component.OPTIMIZER] if optim else [])
    outcomes = {c.value: pred.components[c].outcome for c in comps}
    return all(o in OK for o in outcomes.values()), ", ".join(f"{k} {v.value}" for k, v in outcomes.items())


@pytest.mark.parametrize(("sample", "topo", "optim"), PAIRS, ids=[_case_id(*p) for p in PAIRS])
def test_resume_prediction_matches_megatron_load(sample: str, topo: tuple[int, int, int], optim: bool) -> None:
    expected, said = predicted_ok(sample, topo, optim)
    real = _real_loads()[_case_id(sample, topo, optim)]
    assert real["ok"] == expected, f"resume said: {said}; megatron-core load: {real['error'] or 'succeeded'}"


def test_every_sample_audited_complete_loads_at_its_own_topology() -> None:
    """Every sample the same-topology pairs cover is `complete` for ckptinspect; its weights load for Megatron."""
    from ckptinspect.commands.audit.audit import audit

    same = {s for s, topo, _ in PAIRS if topo == (2, 1, 2) and s != "mcore_0_15_3_zarr"}  # 0.16 cannot load zarr
    for sample in same:
        report = audit(SAMPLES / sample)
        assert report.status.value == "complete", (sample, [f.code for f in report.findings])
    loads = _real_loads()
    assert all(any(loads[_case_id(s, (2, 1, 2), o)]["ok"] for o in (True, False)
                   if _case_id(s, (2, 1, 2), o) in loads) for s in same)
