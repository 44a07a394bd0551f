"""The mapping tables (`commands/diff/mappings/`) are data: checked here for what the conversion diff relies on."""

from __future__ import annotations

from collections import Counter

import pytest

from ckptinspect.commands.diff.mappings import Geometry, Transform, blocks, pick
from ckptinspect.commands.diff.mappings.llama import LLAMA

GEO = Geometry(num_heads=8, num_query_groups=2, head_dim=4, ffn_hidden=12, vocab=10, tied=False)


@pytest.mark.parametrize("transform, n, rows", [(Transform.QKV_INTERLEAVE, 3, 2 * (4 + 2) * 4),
                                                (Transform.SWIGLU_SPLIT, 2, 24), (Transform.IDENTITY, 1, 7)])
def test_blocks_use_every_source_row_once(transform: Transform, n: int, rows: int) -> None:
    per = blocks(transform, GEO, n, rows)
    used = sorted(r for blk in per for a, b, _ in blk for r in range(a, b))
    assert used == list(range(rows))
    for blk in per:  # each target's rows are filled contiguously from 0
        assert sorted(r for a, b, t in blk for r in range(t, t + b - a)) == list(range(sum(b - a for a, b, _ in blk)))


def test_qkv_interleave_is_per_group() -> None:
    q, k, v = blocks(Transform.QKV_INTERLEAVE, GEO, 3, 48)
    assert q == [(0, 16, 0), (24, 40, 16)] and k == [(16, 20, 0), (40, 44, 4)] and v == [(20, 24, 0), (44, 48, 4)]


def test_each_hf_key_has_one_rule_or_alternatives_of_one_producer() -> None:
    targets = Counter(t for r in LLAMA.rules for t in r.targets)
    doubled = {t for t, n in targets.items() if n > 1}
    # only the norms: TE's fused layer_norm_weight or the local impl's separate norm, never both in one checkpoint
    assert doubled == {"model.layers.{L}.input_layernorm.weight", "model.layers.{L}.post_attention_layernorm.weight"}
    assert all(r.optional for r in LLAMA.rules if set(r.targets) & doubled)


def test_pick_needs_both_sides_and_says_why() -> None:
    args = {"swiglu": True, "num_attention_heads": 8, "group_query_attention": True, "num_query_groups": 2,
            "hidden_size": 32, "kv_channels": 4, "ffn_hidden_size": 12, "untie_embeddings_and_output_weights": True}
    cfg = {"model_type": "mistral", "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 32,
           "intermediate_size": 12, "vocab_size": 10}
    assert pick(args, cfg).table is LLAMA
    assert pick(args, {**cfg, "num_key_value_heads": 8}).table is None  # sizes disagree: not the same model
    assert pick({**args, "num_experts": 8}, cfg).table is None
    assert pick(args, {**cfg, "model_type": "gpt2"}).table is None
    assert pick(None, cfg).table is None and pick(args, None).table is None
    assert "num_key_value_heads" in " ".join(pick(args, {**cfg, "num_key_value_heads": 8}).evidence)
