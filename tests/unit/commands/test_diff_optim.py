"""`diff` across DistributedOptimizer formats and generations, on real saves (sample_ckpts/, see its README):

- two optimizer formats of the same model are summarised per format, one row each, not one row per key, and are
  not blocking (Megatron loads each by the checkpoint's content_metadata);
- the ≤0.14 flattened `fp32_param` and today's `param` name the same tensor and are compared as one;
- N-D reformulated tensors (`mcore_data`) are compared in their original shape with `--values`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from ckptinspect.commands.diff import reformulated as reform
from ckptinspect.commands.diff.diff import diff_paths
from ckptinspect.commands.diff.optim import OptimFormat, classify, formats, pair_aliases, summarise
from ckptinspect.services.chunk_bytes import ChunkSource
from ckptinspect.cli.app import app
from ckptinspect.formats import read_checkpoint

ROOT = Path(__file__).resolve().parents[3] / "sample_ckpts"
BUCKETS_016 = ROOT / "torch_dist" / "iter_0000001"  # 0.16.1 dp_reshardable
PER_PARAM_016 = ROOT / "torch_dist_fully" / "iter_0000001"  # 0.16.1 fully_reshardable, TP2 PP1 DP2
FLAT_013 = ROOT / "mcore_0_13_1" / "iter_0000001"  # 0.13.1 fully_sharded_model_space (flattened, mcore_data)
BUCKETS_015 = ROOT / "mcore_0_15_3" / "iter_0000001"  # 0.15.3 dp_reshardable


def test_two_formats_are_summarised_per_format_not_per_key() -> None:
    r = diff_paths(BUCKETS_016, PER_PARAM_016)
    t = r.tensors
    assert not any(classify(k) for k in t.only_in_a + t.only_in_b), "optimizer keys left in only_in_*"
    by_side = {(s.side, s.format): s for s in t.optimizer}
    assert set(by_side) == {("a", OptimFormat.BUCKETS), ("b", OptimFormat.PER_PARAM)}
    a, b = by_side["a", OptimFormat.BUCKETS], by_side["b", OptimFormat.PER_PARAM]
    assert len(a.keys) == 12 and a.states == ("exp_avg", "exp_avg_sq", "param")  # 4 DP groups (PP2 x TP2) x 3
    assert len(b.keys) == 51 and b.states == ("exp_avg", "exp_avg_sq", "param")  # 17 params x 3 states
    assert not r.blocking, "a change of optimizer format alone is not blocking"
    assert any("different DistributedOptimizer formats" in n for n in r.notes)
    doc = r.to_dict()["tensors"]["optimizer_formats"]
    assert [(d["side"], d["format"], d["count"], d["blocking"]) for d in doc] == [
        ("a", "buckets", 12, False), ("b", "per_param", 51, False)]


def test_text_report_has_one_row_per_format() -> None:
    res = CliRunner().invoke(app, ["diff", str(BUCKETS_016), str(PER_PARAM_016)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "optimizer state in another format" in res.output
    assert "only in A" not in res.output.split("objects (")[0], "optimizer keys listed one by one"
    assert res.output.count("optimizer.state.exp_avg_sq.") <= 1


def test_flattened_fp32_param_pairs_with_param_and_values_compare_in_original_shape() -> None:
    r = diff_paths(FLAT_013, PER_PARAM_016, values=True)
    t = r.tensors
    assert len(t.renamed) == 17
    assert all(ka.startswith("optimizer.state.fp32_param.") and kb == ka.replace("fp32_param", "param", 1)
               for ka, kb in t.renamed)
    assert not t.only_in_a and not t.only_in_b and not t.optimizer
    assert not r.blocking
    assert r.values is not None and not r.values.skipped, r.values.skipped
    assert len(r.values.compared) == t.common == 68  # 17 model + 51 reformulated optimizer tensors
    json.dumps(r.to_dict())


def test_reformulated_main_param_equals_the_model_param_of_the_same_save() -> None:
    """The fp32 main params of a 0.13 flattened save, restored from (*grid, local numel) to the original shape, are
    the model params of the same save element for element (fp32 training). A plain reshape without the grid
    interleave would not be: the test can fail."""
    ckpt = read_checkpoint(FLAT_013, None)
    by_key = {t.key: t for t in ckpt.tensors}
    src = ChunkSource(FLAT_013, raw=False)
    prefix = "optimizer.state.fp32_param."
    checked, naive_differs = 0, set()
    for key, t in by_key.items():
        if not key.startswith(prefix):
            continue
        model = by_key[key[len(prefix):]]
        assert reform.reformulated(t) and not reform.reformulated(model)
        r = reform.compare_logical(dataclasses.replace(t, key=model.key), src, model, src)
        assert r.mismatched_elements == 0 and r.compared_elements == model.numel, key
        naive = reform._assemble(dataclasses.replace(t, orig_shape=None), src).reshape(model.shape)
        if not np.array_equal(naive, reform._assemble(model, src)):
            naive_differs.add(model.key)
        checked += 1
    assert checked == 17
    # row-parallel weights are split along a later axis: only the grid interleave restores them
    assert naive_differs == {"decoder.layers.self_attention.linear_proj.weight", "decoder.layers.mlp.linear_fc2.weight"}


def test_generations_013_vs_015_summarised() -> None:
    r = diff_paths(FLAT_013, BUCKETS_015)
    assert {(s.side, s.format) for s in r.tensors.optimizer} == {("a", OptimFormat.PER_PARAM),
                                                                  ("b", OptimFormat.BUCKETS)}
    assert not r.tensors.only_in_a and not r.tensors.only_in_b


def test_summary_needs_optimizer_state_on_both_sides() -> None:
    keys = ("optimizer.state.exp_avg.w", "optimizer.state.param.w")
    assert summarise(keys, (), frozenset({OptimFormat.PER_PARAM}), frozenset()) == (keys, (), ())
    same = frozenset({OptimFormat.BUCKETS})
    assert summarise(keys, (), same, same)[2] == ()
    assert formats(["decoder.w", "chained_1.optimizer.state.exp_avg.decoder.w"], ()) == {OptimFormat.PER_PARAM}
    assert pair_aliases(["optimizer.state.fp32_param.w"], ["optimizer.state.param.w", "optimizer.state.param.v"]) == (
        ("optimizer.state.fp32_param.w", "optimizer.state.param.w"),)
    assert pair_aliases(["optimizer.state.exp_avg.w"], ["optimizer.state.param.w"]) == ()


def test_same_run_saved_by_013_and_014_is_value_identical() -> None:
    """0.13.1 and 0.14.0 wrote the same seeded run in the same flattened format: every tensor, the 51 reformulated
    optimizer tensors included (compared chunk by chunk in their common on-disk space), has the same values."""
    r = diff_paths(FLAT_013, ROOT / "mcore_0_14_0" / "iter_0000001", values=True)
    assert not r.blocking and r.values is not None
    assert len(r.values.compared) == len(r.values.identical) == 68 and not r.values.skipped
