"""Ground truth for the parallel layouts: ckptinspect's `resume` predictions against megatron-core 0.16.1's own loads.

For every layout sample, a real load at the saved topology must succeed (ckptinspect says `complete`, and `resume`
at the same topology says `ok`). For topology changes — EP, expert-TP, VPP, CP (DP×CP), TP with SwiGLU;
dp_reshardable and fully_reshardable optimizers — a real load at the new topology must succeed where `resume` predicts
loaded/resharded for every component the load requests, and raise where it predicts `fails`; a failing prediction
must also name the rule that matches the library's error. The loads run in two spawns (world 2 and world 4) through
`tools/make_sample_ckpts.py run_ground_truth`: each case builds Megatron's model and optimizer at the target
topology and calls `dist_checkpointing.load` + `load_state_dict` as Megatron-LM's `load_checkpoint` does (legacy:
`torch.load` + `load_parameter_state`). The table of these pairs is in docs/benchmarks.md ("Prediction vs real load").
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Pair:
    """One prediction-vs-load pair. `change`: the load's topology (as saved where missing; VPP None = no
    interleaving). `optim` / `rng`: whether the load requests them (else --no-load-optim / --no-load-rng).
    `rule`: for a failing pair, the rule that must decide the failing component; `error`: text of the real error."""

    id: str
    sample: str
    world: int
    change: dict[str, Any] = field(default_factory=dict)
    optim: bool = True
    rng: bool = True
    rule: str | None = None
    error: str | None = None


MISMATCH = "Global shape mismatch"
PAIRS: tuple[Pair, ...] = (
    # world 2
    Pair("moe_ep2 as saved", "moe_ep2", 2),
    Pair("vpp as saved", "vpp", 2),
    Pair("legacy_ep2 as saved", "legacy_ep2", 2),
    Pair("legacy_vpp as saved", "legacy_vpp", 2),
    Pair("moe_ep2 EP2→1, model only", "moe_ep2", 2, {"ep": 1}, optim=False, rng=False),
    Pair("moe_ep2 EP2→1, dp_reshardable optimizer", "moe_ep2", 2, {"ep": 1}, rng=False,
         rule="optimizer.expert-split", error="optimizer.distributed."),
    Pair("moe_ep2 EP2→1, rng", "moe_ep2", 2, {"ep": 1}, optim=False, rule="rng.ep-grid", error="rng_state"),
    Pair("vpp VPP2→1, model only", "vpp", 2, {"vpp": None}, optim=False),
    Pair("vpp VPP2→1, dp_reshardable optimizer", "vpp", 2, {"vpp": None}, rule="optimizer.vpp-fixed",
         error=MISMATCH),
    Pair("vpp_fully as saved", "vpp_fully", 2),
    Pair("vpp_fully VPP2→1, fully_reshardable optimizer", "vpp_fully", 2, {"vpp": None}),
    Pair("cp2 CP2×DP2→CP1×DP2", "cp2", 2, {"cp": 1}),
    Pair("cp2 CP2×DP2→CP2×DP1", "cp2", 2),
    Pair("swiglu_bf16 TP2→1, model only", "swiglu_bf16", 2, {"tp": 1}, optim=False),
    # world 4
    Pair("moe_tp2_ep2 as saved", "moe_tp2_ep2", 4),
    Pair("cp2 as saved", "cp2", 4),
    Pair("swiglu_bf16 as saved", "swiglu_bf16", 4),
    Pair("moe_tp2_ep2 EP2→1, fully_reshardable optimizer", "moe_tp2_ep2", 4, {"ep": 1}, rng=False,
         rule="optimizer.expert-split", error="KeyError: 'optimizer'"),
    Pair("moe_tp2_ep2 EP2→1, model only", "moe_tp2_ep2", 4, {"ep": 1}, optim=False, rng=False),
    Pair("legacy_pp2_ep2 as saved", "legacy_pp2_ep2", 4),
    Pair("moe_tp2_ep2 EP2→1, rng", "moe_tp2_ep2", 4, {"ep": 1}, optim=False, rule="rng.ep-grid", error="rng_state"),
    Pair("moe_tp2_ep2 EP2→4, fully_reshardable optimizer + rng", "moe_tp2_ep2", 4, {"ep": 4}),
    Pair("moe_tp2_ep2 ETP1→2, fully_reshardable optimizer + rng", "moe_tp2_ep2", 4, {"etp": 2}),
    Pair("cp2 CP2×DP2→CP4×DP1", "cp2", 4, {"cp": 4}),
)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_sample_ckpts", ROOT / "tools" / "make_sample_ckpts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_sample_ckpts", mod)
    spec.loader.exec_module(mod)
    return mod


def _topology(gen: ModuleType, p: Pair) -> dict[str, Any]:
    saved = gen.SAMPLES[p.sample]
    topo = {k: saved.get(k, gen.DEFAULTS[k]) for k in ("tp", "pp", "cp", "ep", "etp", "vpp")}
    topo["etp"] = topo["etp"] or topo["tp"]
    topo.update(p.change)
    topo["dp"] = p.world // (topo["tp"] * topo["pp"] * topo["cp"])
    return topo


@pytest.fixture(scope="module")
def truth() -> dict[str, dict[str, Any]]:
    """Megatron's own load of every pair, one spawn per world size."""
    pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")
    gen = _generator()
    out: dict[str, dict[str, Any]] = {}
    for world in sorted({p.world for p in PAIRS}):
        cases = [{"id": p.id, "sample": p.sample, "optim": p.optim, "rng": p.rng,
                  "topology": {k: v for k, v in _topology(gen, p).items() if k != "dp"}}
                 for p in PAIRS if p.world == world]
        out.update(gen.run_ground_truth(cases, world, root=str(ROOT / "sample_ckpts"), timeout=900))
    return out


def predict(p: Pair) -> dict[str, Any]:
    topo = _topology(_generator(), p)
    args = ["--tp", topo["tp"], "--pp", topo["pp"], "--dp", topo["dp"], "--cp", topo["cp"], "--ep", topo["ep"],
            "--vpp", topo["vpp"] or 1]
    if _generator().SAMPLES[p.sample].get("experts"):
        args += ["--etp", topo["etp"]]
    args += [] if p.optim else ["--no-load-optim"]
    args += [] if p.rng else ["--no-load-rng"]
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "resume", str(ROOT / "sample_ckpts" / p.sample),
                        *map(str, args), "-o", "json"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.mark.parametrize("pair", PAIRS, ids=[p.id for p in PAIRS])
def test_prediction_matches_megatron_load(pair: Pair, truth: dict[str, dict[str, Any]]) -> None:
    real = truth[pair.id]
    doc = predict(pair)
    failing = {c: v for c, v in doc["components"].items() if v["outcome"] == "fails"}
    assert (doc["verdict"] != "fails") == real["ok"], (doc["components"], real["errors"])
    if pair.rule is None:
        assert real["ok"] and not failing, real["errors"]
        return
    assert pair.rule in {v["rule"] for v in failing.values()}, failing
    assert any(pair.error in e for e in real["errors"]), real["errors"]


def test_same_topology_loads_cover_every_layout_sample() -> None:
    """Every layout sample has a load at its saved topology among the pairs."""
    layouts = {"moe_ep2", "moe_tp2_ep2", "vpp", "vpp_fully", "cp2", "swiglu_bf16", "legacy_ep2", "legacy_pp2_ep2",
               "legacy_vpp"}
    assert layouts <= {p.sample for p in PAIRS if not p.change and p.optim and p.rng}
    assert layouts <= set(_generator().SAMPLES)
