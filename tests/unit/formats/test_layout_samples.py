"""The parallel-layout samples (megatron-core 0.16.1: MoE/EP, ETP, VPP, CP, SwiGLU + bf16, legacy EP/VPP) as read.

`info` must report the layout each was saved with (sample_ckpts/README.md), `audit` must say `complete` with no
warning or error, and each corruption of `tests/support/corpus_layouts.py` must point at its place in the layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES
from corpus import Ctx, case_named

# sample -> (topology, optimizer sharding, dtypes by component) as written by tools/make_sample_ckpts.py SAMPLES
EXPECTED: dict[str, tuple[dict[str, int | None], str, dict[str, list[str]]]] = {
    "moe_ep2": ({"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 2, "etp": 1, "vpp": 1, "world_size": 2},
                "dp_reshardable", {"model": ["float32"], "optimizer": ["float32"]}),
    "moe_tp2_ep2": ({"tp": 2, "pp": 1, "dp": 2, "cp": 1, "ep": 2, "etp": 1, "vpp": 1, "world_size": 4},
                    "fully_reshardable", {"model": ["float32"], "optimizer": ["float32"]}),
    "vpp": ({"tp": 1, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "etp": None, "vpp": 2, "world_size": 2},
            "dp_reshardable", {"model": ["float32"], "optimizer": ["float32"]}),
    "vpp_fully": ({"tp": 1, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "etp": None, "vpp": 2, "world_size": 2},
                  "fully_reshardable", {"model": ["float32"], "optimizer": ["float32"]}),
    "cp2": ({"tp": 1, "pp": 1, "dp": 2, "cp": 2, "ep": 1, "etp": None, "vpp": 1, "world_size": 4},
            "dp_reshardable", {"model": ["float32"], "optimizer": ["float32"]}),
    "swiglu_bf16": ({"tp": 2, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": None, "vpp": 1, "world_size": 4},
                    "dp_reshardable", {"model": ["bfloat16"], "optimizer": ["float32"]}),
    "legacy_ep2": ({"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 2, "etp": 1, "vpp": 1, "world_size": 2},
                   "legacy distrib_optim.pt", {"model": ["float32"], "optimizer": ["float32"]}),
    "legacy_pp2_ep2": ({"tp": 1, "pp": 2, "dp": 2, "cp": 1, "ep": 2, "etp": 1, "vpp": 1, "world_size": 4},
                       "legacy distrib_optim.pt", {"model": ["float32"], "optimizer": ["float32"]}),
    "legacy_vpp": ({"tp": 1, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "etp": None, "vpp": 2, "world_size": 2},
                   "legacy distrib_optim.pt", {"model": ["float32"], "optimizer": ["float32"]}),
}


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, [*args, "-o", "json"])
    return r.exit_code, json.loads(r.stdout)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_info_reports_the_saved_layout(name: str) -> None:
    topology, sharding, dtypes = EXPECTED[name]
    rc, doc = _cli("info", str(SAMPLES / name))
    assert rc == 0
    assert doc["topology"] == topology, doc["topology_sources"]
    assert doc["optimizer_sharding"] == sharding
    got = {c: sorted(d) for c, d in doc["summary"]["dtypes"].items() if c in ("model", "optimizer")}
    assert got == dtypes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_healthy_layout_sample_audits_clean(name: str) -> None:
    rc, doc = _cli("audit", str(SAMPLES / name), "--deep")
    assert doc["status"] == "complete"
    assert [f for f in doc["findings"] if f["severity"] != "info"] == [], doc["findings"]
    assert rc == 0


def test_swiglu_fc1_holds_two_chunks_per_tp_rank() -> None:
    """gated_linear_unit: linear_fc1 is stored as W and V halves per TP rank on a grid twice as fine."""
    rc, doc = _cli("info", str(SAMPLES / "swiglu_bf16"))
    fc1 = next(t for t in doc["tensors"] if t["key"] == "decoder.layers.mlp.linear_fc1.weight")
    assert fc1["shape"] == [2, 128, 16] and fc1["dtype"] == "bfloat16"
    assert fc1["chunks"] == 2 * 2 * 2  # layers × TP × (W, V)


# case name -> (code, text the message must contain, layout coordinates of the first gap)
WHERE: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "layout_dropped_expert_chunk": ("CK301", "layer 1, expert 3 (EP rank 1)", {"layer": 1, "expert": 3, "ep_rank": 1}),
    "layout_dropped_vpp_stage_chunk": ("CK301", "layer 2 (PP rank 0, virtual stage 1)",
                                       {"layer": 2, "pp_rank": 0, "virtual_stage": 1}),
    "layout_dropped_dpcp_bucket_chunk": ("CK301", "the DP×CP range written by rank 0", {"writer_ranks": [0]}),
    "layout_missing_legacy_ep_shard": ("CK110", "mp_rank_00_001", None),
}


@pytest.mark.parametrize("name", sorted(WHERE))
def test_corruption_names_its_place_in_the_layout(name: str, tmp_path: Path) -> None:
    code, text, coords = WHERE[name]
    case = case_named(name)
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    rc, doc = _cli("audit", str(case.build(ctx)))
    hits = [f for f in doc["findings"] if f["code"] == code]
    assert rc == 1 and len(hits) == 1, doc["findings"]
    assert text in hits[0]["message"], hits[0]["message"]
    if coords is not None:
        assert hits[0]["details"]["layout"][0] == coords


# (sample, resume args) -> {component: (outcome, deciding rule)}; the same predictions are checked against real
# megatron-core loads in tests/acceptance/test_ground_truth_layouts.py (slow); these run without torch.
RESUME: dict[tuple[str, tuple[str, ...]], dict[str, tuple[str, str]]] = {
    ("moe_ep2", ("--tp", "1", "--pp", "1", "--ep", "1")): {
        "model": ("resharded", "model.reshard"), "optimizer": ("fails", "optimizer.expert-split"),
        "rng": ("fails", "rng.ep-grid")},
    ("moe_tp2_ep2", ("--tp", "2", "--pp", "1", "--ep", "1")): {"optimizer": ("fails", "optimizer.expert-split")},
    ("moe_tp2_ep2", ("--tp", "2", "--pp", "1", "--ep", "4")): {
        "model": ("resharded", "model.reshard"), "optimizer": ("resharded", "optimizer.reshard"),
        "rng": ("loaded", "rng.load")},
    ("moe_tp2_ep2", ("--tp", "2", "--pp", "1", "--etp", "2")): {
        "model": ("resharded", "model.reshard"), "optimizer": ("resharded", "optimizer.reshard")},
    ("vpp", ("--tp", "1", "--pp", "2", "--vpp", "1")): {
        "model": ("resharded", "model.reshard"), "optimizer": ("fails", "optimizer.vpp-fixed"),
        "rng": ("loaded", "rng.load")},
    ("vpp", ("--tp", "1", "--pp", "2", "--vpp", "3")): {"model": ("fails", "model.topology")},
    ("vpp_fully", ("--tp", "1", "--pp", "2", "--vpp", "1")): {
        "model": ("resharded", "model.reshard"), "optimizer": ("resharded", "optimizer.reshard")},
    ("legacy_vpp", ("--tp", "1", "--pp", "2", "--vpp", "1")): {
        "model": ("fails", "model.legacy-split"), "optimizer": ("fails", "optimizer.legacy-split")},
    ("cp2", ("--tp", "1", "--pp", "1", "--cp", "1", "--dp", "2")): {
        "model": ("loaded", "model.load"), "optimizer": ("resharded", "optimizer.dp"), "rng": ("loaded", "rng.load")},
    ("cp2", ("--tp", "1", "--pp", "1", "--cp", "4", "--dp", "1")): {
        "model": ("loaded", "model.load"), "optimizer": ("loaded", "optimizer.load")},
}


@pytest.mark.parametrize("key", sorted(RESUME), ids=[f"{s} {' '.join(a)}" for s, a in sorted(RESUME)])
def test_resume_layout_rules(key: tuple[str, tuple[str, ...]]) -> None:
    sample, args = key
    _, doc = _cli("resume", str(SAMPLES / sample), *args)
    got = {c: (v["outcome"], v["rule"]) for c, v in doc["components"].items() if c in RESUME[key]}
    assert got == RESUME[key], doc["components"]
    fired = {r["id"]: r for r in doc["rules"] if r["decided"]}
    assert all(fired[rule]["source"] for _, rule in RESUME[key].values())
