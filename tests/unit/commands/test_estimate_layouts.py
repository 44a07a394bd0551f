"""`estimate` arithmetic for the layouts large runs use (MoE over EP/ETP, VPP, CP, SwiGLU, tied embeddings, bf16 +
fp32 master): invariants a wrong placement would break. The real-data checks (bytes per rank of every torch_dist
sample, MoE/VPP/CP ones included once present) are in test_estimate.py."""

from __future__ import annotations

from collections import Counter

import pytest

from ckptinspect.commands.estimate import SaveFormat, SaveOptions, Target, estimate_model
from ckptinspect.commands.estimate.describe import GptDescription, model_from_description, padded_vocab
from ckptinspect.commands.estimate.items import copies, torch_dist_items
from ckptinspect.commands.estimate.ranks import dense_coords, dense_rank, dp_group, expert_rank, stage_of_layer
from ckptinspect.commands.estimate.spec import TENSOR_ITEM_OVERHEAD, ObjectCosts
from ckptinspect.commands.estimate.volumes import place

MOE = GptDescription(layers=4, hidden=64, heads=4, vocab=1000, ffn_hidden=256, experts=8, moe_ffn_hidden=128,
                     swiglu=True, layernorm=False, bias=False)
NO_OBJECTS = ObjectCosts(rng=0, rerun=0, extra_state=0, extra_state_modules=0, optim_objects=0, common=0)


def test_rank_order_is_tp_cp_dp_pp() -> None:
    t = Target(tp=2, pp=2, dp=2, cp=2)
    assert [dense_rank(t, 0, 0, tp, 0) for tp in range(2)] == [0, 1]
    assert dense_rank(t, 0, 0, 0, 1) == 2 and dense_rank(t, 0, 1, 0, 0) == 4 and dense_rank(t, 1, 0, 0, 0) == 8
    assert all(dense_rank(t, *[dense_coords(t, r)[i] for i in (0, 1, 2, 3)]) == r for r in range(t.world))
    assert dp_group(t, 5) == (1, 3, 5, 7)  # DP x CP group of tp 1, pp 0


def test_expert_ranks_cover_the_stage() -> None:
    t = Target(tp=2, pp=1, dp=4, ep=4, etp=1)
    assert t.edp == 2
    ranks = {expert_rank(t, 0, d, e, x) for d in range(t.edp) for e in range(t.ep) for x in range(t.etp_)}
    assert ranks == set(range(t.world))


def test_vpp_interleaves_layer_pieces() -> None:
    t = Target(pp=2, vpp=2)
    assert [stage_of_layer(t, 8, layer) for layer in range(8)] == \
        [(0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1), (1, 1)]


def test_moe_description_counts_experts_and_swiglu() -> None:
    m = model_from_description(MOE, tp=2)
    h, v = 64, padded_vocab(MOE, 2)
    attn = 64 * (4 + 2 * 4) * 16 // 4 * 4 + h * h  # qkv + proj (kv_channels 16)
    per_layer = h + attn + h + 8 * h + 8 * (2 * 128 * h + h * 128)  # norms, router, experts (SwiGLU fc1)
    assert m.total_params == v * h * 2 + 4 * per_layer + h


def test_experts_split_over_ep_and_etp() -> None:
    t = Target(tp=2, pp=1, dp=2, ep=2, etp=1)
    m = model_from_description(MOE, tp=2)
    fc1 = [c for c in copies(m, t) if c.param.key.endswith("experts.experts.linear_fc1.weight") and c.order[1] == 0]
    assert len(fc1) == 16  # ETP 1, SwiGLU: W and V chunks of each of 8 experts
    assert Counter(c.ep for c in fc1) == {0: 8, 1: 8}
    assert all(len(c.holders) == t.edp for c in fc1)


@pytest.mark.parametrize("target", [
    Target(tp=2, pp=2, dp=2), Target(tp=1, pp=2, dp=2, cp=2, vpp=2), Target(tp=2, pp=1, dp=4, ep=2, etp=1),
    Target(tp=2, pp=2, dp=2, ep=2, etp=2),
])
@pytest.mark.parametrize("fully_parallel", [True, False])
def test_every_byte_is_written_exactly_once(target: Target, fully_parallel: bool) -> None:
    """Whatever the layout, the weights land once: per-rank model bytes add up to the model (+ archive overhead)."""
    m = model_from_description(MOE, tp=target.tp)
    o = SaveOptions(fully_parallel=fully_parallel)
    e = estimate_model(m, target, o, costs=NO_OBJECTS)
    items = torch_dist_items(m, target, o, NO_OBJECTS)
    n_model = sum(1 for it in items if it.component == "model")
    assert sum(c["model"] for c in e.chosen.by_rank.values()) == e.components["model"] + n_model * \
        TENSOR_ITEM_OVERHEAD
    # the optimizer: fp32 master + 2 moments of every local parameter, padding gaps included, each slice once
    opt = sum(c["optimizer"] for c in e.chosen.by_rank.values())
    assert opt >= e.components["fp32_master"] + e.components["optimizer_moments"]
    assert len({(it.shard_id, it.holders) for it, _ in place(items, target, fully_parallel)}) == len(items)


def test_fully_parallel_spreads_weights_over_dp_and_cp() -> None:
    t = Target(tp=1, pp=1, dp=2, cp=2)
    m = model_from_description(GptDescription(layers=4, hidden=256, heads=4, vocab=4096), tp=1)
    spread = estimate_model(m, t, SaveOptions(fully_parallel=True), costs=NO_OBJECTS).chosen
    piled = estimate_model(m, t, SaveOptions(fully_parallel=False), costs=NO_OBJECTS).chosen
    assert piled.by_rank[0]["model"] > 3 * max(spread.by_rank[r]["model"] for r in range(4))
    assert all(spread.by_rank[r]["model"] > 0 for r in range(4))
    # the optimizer is sharded over DP x CP = 4 either way
    assert {round(piled.by_rank[r]["optimizer"], -4) for r in range(4)} == \
        {round(spread.by_rank[r]["optimizer"], -4) for r in range(4)}


def test_tied_embeddings_are_saved_once_but_in_both_stages_optimizers() -> None:
    d = GptDescription(layers=2, hidden=64, heads=4, vocab=1000, tied_embeddings=True)
    t = Target(tp=1, pp=2, dp=1)
    m = model_from_description(d, 1)
    e = estimate_model(m, t, SaveOptions(), costs=NO_OBJECTS)
    vocab = padded_vocab(d, 1) * 64
    assert e.params == m.total_params and not any(p.saved for p in m.params if p.key == "output_layer.weight")
    last = e.chosen.by_rank[1]
    assert last["optimizer"] >= 3 * 4 * vocab  # the last stage's DistOpt holds the tied copy's state
    assert last["model"] < vocab * 2  # ... but does not save it as a weight


def test_legacy_writes_replicated_layernorms_in_every_tp_file() -> None:
    d = GptDescription(layers=2, hidden=64, heads=4, vocab=1000)
    m = model_from_description(d, 2)
    t = Target(tp=2, pp=1, dp=4)
    e = estimate_model(m, t, SaveOptions(format=SaveFormat.TORCH), costs=NO_OBJECTS)
    assert e.chosen.fmt == "torch" and e.chosen.writers == 2 and e.legacy.files == 4
    model_bytes = sum(c["model"] for c in e.legacy.by_rank.values())
    assert model_bytes > e.components["model"]  # layernorms and row-parallel biases once per TP rank's file


def test_sgd_and_fp32_without_distributed_optimizer_have_no_master() -> None:
    from ckptinspect.commands.estimate import Optimizer, estimate_params

    t = Target(tp=1, pp=1, dp=2)
    e = estimate_params(1000, "float32", t, SaveOptions(distributed_optimizer=False, optimizer=Optimizer.SGD))
    assert e.components["fp32_master"] == 0 and e.components["optimizer_moments"] == 4000
    e = estimate_params(1000, "bfloat16", t, SaveOptions(optimizer=Optimizer.SGD))
    assert e.components["fp32_master"] == 4000 and e.components["optimizer_moments"] == 4000
