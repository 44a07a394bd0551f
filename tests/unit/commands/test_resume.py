"""`resume` predictions on real checkpoints (sample_ckpts/ written by megatron-core, the Megatron-Core 0.19.2 save
dir) and on variations of them built with `dataclasses.replace` on the read `Checkpoint`.

Each prediction test's docstring names the Megatron source it models. Keys: [LM] Megatron-LM
training/checkpointing.py @0032978f, [tok] training/tokenizer/tokenizer.py @00ee9667, [mc] megatron-core 0.16.1.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckptinspect.formats.resolve import resolve_checkpoint
from ckptinspect.errors import UsageError
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import Checkpoint, Format
from ckptinspect.model.chunk_table import ChunkTable
from ckptinspect.render.resume_text import render_resume
from ckptinspect.commands.resume import (
    RULES, Component, ComponentPrediction, Outcome, ResumePrediction, ResumeTarget, Verdict, predict_resume,
    verdict_of,
)

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"
FIXTURE_0192 = SAMPLES / "mcore_0_19_2"
M, O, R, X, S, I = (Component.MODEL, Component.OPTIMIZER, Component.RNG, Component.RERUN_STATE, Component.SCHEDULER,
                    Component.ITERATION)


@lru_cache(maxsize=None)
def _read(path: Path) -> Checkpoint | None:
    if not path.is_dir():
        return None
    return read_checkpoint(*resolve_checkpoint(path), True)


def ckpt(name: str) -> Checkpoint:
    """A real checkpoint: `fixture` = the 0.19.2 save dir, else a `sample_ckpts/` save dir. Skips when missing."""
    path = FIXTURE_0192 if name == "fixture" else SAMPLES / name
    c = _read(path)
    if c is None or c.format is None or c.args is None:
        pytest.skip(f"{path} not available or not readable yet (tools/make_sample_ckpts.py writes it)")
    return c


def with_args(c: Checkpoint, **changes: Any) -> Checkpoint:
    args = {k: v for k, v in {**(c.args or {}), **changes}.items() if v is not _DROP}
    return replace(c, args=args)


def with_common(c: Checkpoint, **changes: Any) -> Checkpoint:
    common = {k: v for k, v in {**(c.common or {}), **changes}.items() if v is not _DROP}
    return replace(c, common=common)


_DROP = object()


def outcomes(p: ResumePrediction) -> dict[Component, Outcome]:
    return {c: x.outcome for c, x in p.components.items()}


def predict(c: Checkpoint, **target: Any) -> ResumePrediction:
    return predict_resume(c, ResumeTarget(**target))


# ------------------------------------------------------------------------------------------ done-when cases


@pytest.mark.parametrize(("name", "dp"), [("torch_dist", 1), ("fixture", 1), ("fixture", 4), ("legacy", 1)])
def test_dp_only_change_is_ok(name: str, dp: int) -> None:
    """DP-only change ([LM] load_checkpoint): the (TP, PP) guard passes, rng is requested since ckpt_tp_pp ==
    run_tp_pp, dp_reshardable buckets have the DP-independent global shape (gbuf_world_numel_unpadded,)
    ([mc] distrib_optimizer.py sharded_param_state_dp_reshardable); legacy distrib_optim.pt is scattered from DP
    rank 0 by load_parameter_state_from_dp_zero ([mc] distrib_optimizer.py:1965-2068); check_checkpoint_args
    compares no DP arg. The sample's rerun state is idle (validate_state_dict False), the fixture has none."""
    c = ckpt(name)
    p = predict(c, tp=2, pp=2, dp=dp)
    assert p.verdict is Verdict.OK, p.to_dict()["components"]
    assert outcomes(p)[M] is Outcome.LOADED
    assert outcomes(p)[O] is Outcome.RESHARDED and outcomes(p)[R] is Outcome.LOADED
    assert outcomes(p)[S] is Outcome.LOADED and outcomes(p)[I] is Outcome.LOADED
    assert outcomes(p)[X] is Outcome.ABSENT


def test_tp_change_on_dp_reshardable_fails_optimizer_and_drops_rng() -> None:
    """[LM] load_checkpoint: `ckpt_tp_pp != run_tp_pp` and distrib_optim_sharding_type not in
    DistributedOptimizer.checkpoint_fully_reshardable_formats → RuntimeError '(TP, PP) mismatch after resume';
    gen_sd_rng_state is built only when ckpt_tp_pp == run_tp_pp, else 'RNG state will be ignored'.
    TP 2→1 keeps the sample's padded vocabulary (ceil(100/64)×64 = 128), so the model itself reshards."""
    p = predict(ckpt("torch_dist"), tp=1, pp=2, dp=2)
    assert outcomes(p) == {M: Outcome.RESHARDED, O: Outcome.FAILS, R: Outcome.DROPPED, X: Outcome.ABSENT,
                           S: Outcome.LOADED, I: Outcome.LOADED, Component.DATALOADER: Outcome.ABSENT}
    assert p.verdict is Verdict.FAILS
    assert "dp_reshardable" in p.components[O].reason
    assert "--dist-ckpt-optim-fully-reshardable" in p.components[O].reason
    assert "RNG state will be ignored" in p.components[R].reason


def test_tp_change_on_fully_reshardable_reshards_optimizer_and_is_lossy() -> None:
    """[LM] load_checkpoint only raises for sharding types outside checkpoint_fully_reshardable_formats
    ([mc] distrib_optimizer.py:105-109); rng is still ignored on a (TP, PP) change, so the verdict is lossy."""
    p = predict(ckpt("torch_dist_fully"), tp=1, pp=1, dp=2)
    assert outcomes(p)[M] is Outcome.RESHARDED and outcomes(p)[O] is Outcome.RESHARDED
    assert outcomes(p)[R] is Outcome.DROPPED
    assert p.verdict is Verdict.LOSSY


def test_tp_change_that_repads_the_vocabulary_fails_with_both_shapes_and_a_suggestion() -> None:
    """[tok] _vocab_size_with_padding: multiple = make_vocab_size_divisible_by × TP, padded = ceil(V / multiple) ×
    multiple: 100 at 64 × 4 pads to 256, not the saved 128; [mc] strategies/torch.py:503-518
    MCoreLoadPlanner._validate_global_shapes raises 'Global shape mismatch'. 32 × 4 = 128 keeps it."""
    p = predict(ckpt("torch_dist"), tp=4, pp=2)
    model = p.components[M]
    assert model.outcome is Outcome.FAILS and model.rule == "model.vocab"
    assert "(128, 16)" in model.reason and "(256, 16)" in model.reason
    assert "--make-vocab-size-divisible-by 32" in model.reason
    assert p.vocab is not None and (p.vocab.saved, p.vocab.predicted, p.vocab.suggestion) == (128, 256, 32)
    assert [c.value for c in p.vocab.candidates] == [32, 16, 8]
    assert p.target["dp"] == 1 and p.target["dp_source"].startswith("derived")


def test_passing_the_suggested_divisor_removes_the_vocab_failure() -> None:
    """With --make-vocab-size-divisible-by 32 the recomputed padded size is the saved 128 ([tok]
    _vocab_size_with_padding), so the model reshards. A tokenizer without vocab_file (HuggingFaceTokenizer) skips
    check_checkpoint_args' vocab branch ([LM] `if args.vocab_file:`); the optimizer is skipped here so that the
    verdict isolates the model."""
    c = with_args(ckpt("torch_dist"), tokenizer_type="HuggingFaceTokenizer", vocab_file=None)
    p = predict(c, tp=4, pp=2, make_vocab_size_divisible_by=32, no_load_optim=True)
    assert outcomes(p)[M] is Outcome.RESHARDED
    assert p.vocab is not None and p.vocab.predicted == 128
    assert p.verdict is Verdict.LOSSY  # rng dropped, nothing fails


def test_changed_divisor_trips_check_checkpoint_args_for_vocab_file_tokenizers() -> None:
    """[LM] check_checkpoint_args: `if args.vocab_file: _compare('make_vocab_size_divisible_by')` asserts, and
    [tok] build_tokenizer asserts vocab_file for GPT2BPETokenizer, so the sample's run has one. --finetune skips
    check_checkpoint_args ([LM] load_checkpoint `'args' in state_dict and not args.finetune`)."""
    c = ckpt("torch_dist")
    p = predict(c, tp=4, pp=2, make_vocab_size_divisible_by=32)
    assert p.components[M].rule == "model.args-check" and "(64)" in p.components[M].reason
    assert "check_checkpoint_args" in predict(c, tp=4, pp=2).components[M].reason  # the suggestion warns
    ok = predict(c, tp=4, pp=2, make_vocab_size_divisible_by=32, finetune=True)
    assert ok.verdict is Verdict.OK and outcomes(ok)[M] is Outcome.RESHARDED


def test_vocab_without_vocab_size_in_args_0192() -> None:
    """The 0.19.2 args have padded_vocab_size 256 but no vocab_size: the tokenizer's V is in (256 − 128×2, 256]
    ([tok] _vocab_size_with_padding). At TP 4 every such V pads to 512; 64 × 4 = 256 keeps 256 for all of them.
    At TP 1 the size depends on V (256 only for V > 128), so the prediction cannot promise a load."""
    c = ckpt("fixture")
    p = predict(c, tp=4, pp=2)
    assert p.vocab is not None and (p.vocab.predicted, p.vocab.suggestion) == (512, 64)
    assert "(256, 32)" in p.components[M].reason and "(512, 32)" in p.components[M].reason
    q = predict(c, tp=1, pp=2, dp=2)
    assert q.vocab is not None and q.vocab.predicted is None and q.components[M].rule == "model.vocab-unknown"
    assert q.vocab.suggestion == 256 and [x.certain for x in q.vocab.candidates][:2] == [True, False]
    assert predict(c, tp=1, pp=2, dp=2, vocab_size=200).vocab.predicted == 256  # type: ignore[union-attr]
    assert predict(c, tp=1, pp=2, dp=2, vocab_size=100).vocab.predicted == 128  # type: ignore[union-attr]


def test_legacy_tp_change_fails() -> None:
    """[LM] check_checkpoint_args: checkpoint_version ≥ 3.0 and not use_dist_ckpt → _compare(
    'tensor_model_parallel_size') / ('pipeline_model_parallel_size') assert; with --finetune the args check is
    skipped but get_checkpoint_name builds mp_rank_* paths for the new ranks (missing / other shapes)."""
    c = ckpt("legacy")
    p = predict(c, tp=1, pp=2, dp=2)
    assert p.verdict is Verdict.FAILS and p.components[M].rule == "model.legacy-split"
    assert "check_checkpoint_args" in p.components[M].reason
    assert outcomes(p)[O] is Outcome.FAILS and outcomes(p)[R] is Outcome.FAILS
    f = predict(c, tp=2, pp=1, dp=4, finetune=True)
    assert f.verdict is Verdict.FAILS and "get_checkpoint_name" in f.components[M].reason


def test_finetune_skips_instead_of_dropping() -> None:
    """[LM] load_checkpoint under --finetune: gen_sd_optim / gen_sd_rng_state / gen_sd_rerun_state are not built,
    the optimizer + scheduler block and the rng block are gated on `not args.finetune`, iteration = 0."""
    p = predict(ckpt("torch_dist"), tp=1, pp=2, dp=2, finetune=True)
    assert outcomes(p) == {M: Outcome.RESHARDED, O: Outcome.SKIPPED, R: Outcome.SKIPPED, X: Outcome.ABSENT,
                           S: Outcome.SKIPPED, I: Outcome.SKIPPED, Component.DATALOADER: Outcome.ABSENT}
    assert p.verdict is Verdict.OK


# ----------------------------------------------------------------------------------------------- optimizer


def test_no_load_optim_also_skips_the_scheduler() -> None:
    """[LM] load_checkpoint restores opt_param_scheduler inside `if not release and not args.finetune and not
    args.no_load_optim`, and gen_sd_opt_param_scheduler is None with --no-load-optim."""
    p = predict(ckpt("torch_dist"), tp=1, pp=2, dp=2, no_load_optim=True)
    assert outcomes(p)[O] is Outcome.SKIPPED and outcomes(p)[S] is Outcome.SKIPPED
    assert outcomes(p)[R] is Outcome.DROPPED and p.verdict is Verdict.LOSSY
    r = predict(ckpt("torch_dist"), tp=1, pp=2, dp=2, no_load_optim=True, no_load_rng=True)
    assert outcomes(r)[R] is Outcome.SKIPPED and r.verdict is Verdict.OK


def test_checkpoint_without_optimizer() -> None:
    """Saved with --no-save-optim: [LM] load_checkpoint does not request it (ckpt_args.no_save_optim) but still
    calls optimizer.load_state_dict(state_dict['optimizer']) → KeyError 'Unable to load optimizer … Specify
    --no-load-optim or --finetune'; with --no-load-optim nothing is asked for, so it is absent."""
    base = ckpt("fixture")
    c = with_common(with_args(base, no_save_optim=True), optimizer=_DROP, opt_param_scheduler=_DROP)
    c = replace(c, table=ChunkTable.of(t for t in c.tensors if not t.key.startswith("optimizer.")),
                objects=tuple(o for o in c.objects if not o.family.startswith("optimizer.")), optimizer_sharding=None)
    p = predict(c, tp=2, pp=2, dp=2)
    assert outcomes(p)[O] is Outcome.FAILS and "--no-load-optim" in p.components[O].reason
    assert outcomes(p)[S] is Outcome.FAILS
    q = predict(c, tp=2, pp=2, dp=2, no_load_optim=True)
    assert outcomes(q)[O] is Outcome.ABSENT and outcomes(q)[S] is Outcome.ABSENT and q.verdict is Verdict.OK


def test_flattened_pre_016_optimizer_fails_whatever_the_topology() -> None:
    """fully_sharded_model_space state is N-D reformulated (mcore_data, Megatron-Core ≤0.15); current
    sharded_param_state_fs_model_space builds flattened_range ShardedTensors which
    ShardedTensor.validate_metadata_integrity rejects ([mc] mapping.py:133-134)."""
    base = ckpt("fixture")
    c = replace(base, optimizer_sharding="fully_sharded_model_space",
                extra={**base.extra, "mcore_data": {"optimizer.state.exp_avg.x": [[4, 8]]}})
    p = predict(c, tp=2, pp=2, dp=2)
    assert outcomes(p)[O] is Outcome.FAILS and "flattened_range" in p.components[O].reason
    assert outcomes(predict(c, tp=2, pp=2, dp=2, no_load_optim=True))[O] is Outcome.SKIPPED


def test_dp_zero_gather_scatter() -> None:
    """dp_zero_gather_scatter is still loadable ([mc] distrib_optimizer.py sharded_param_state_dp_zero): DP rank 0
    reads the whole buffer and load_parameter_state_from_dp_zero scatters it (DP change fine); it is not in
    checkpoint_fully_reshardable_formats, so [LM] load_checkpoint raises on a (TP, PP) change."""
    c = replace(ckpt("fixture"), optimizer_sharding="dp_zero_gather_scatter")
    assert outcomes(predict(c, tp=2, pp=2, dp=4))[O] is Outcome.RESHARDED
    p = predict(c, tp=2, pp=1, dp=4)
    assert outcomes(p)[O] is Outcome.FAILS and "dp_zero_gather_scatter" in p.components[O].reason


def test_legacy_distributed_optimizer_without_distrib_optim_pt_fails() -> None:
    """[LM] load_checkpoint → optimizer.load_parameter_state(distrib_optim.pt) ([mc] distrib_optimizer.py:2253)
    torch.loads the file of each shard; a missing one cannot be loaded."""
    base = ckpt("legacy")
    shards = {k: tuple(f for f in v if f != "distrib_optim.pt") for k, v in base.shard_files.items()}
    c = replace(base, shard_files=shards)
    p = predict(c, tp=2, pp=2, dp=2)
    assert p.components[O].rule == "optimizer.legacy-missing" and p.verdict is Verdict.FAILS


# ------------------------------------------------------------------------------------------- rng and rerun


def test_rng_without_saved_state() -> None:
    """torch_dist saved with --no-save-rng: [LM] load_checkpoint does not request it (ckpt_args.no_save_rng), nor
    after a (TP, PP) change; with neither, the missing rng_state objects are requested. Legacy ignores
    no_save_rng: the rng block falls back to state_dict['random_rng_state'] → KeyError → 'Unable to load rng state
    …' and sys.exit()."""
    base = ckpt("torch_dist")
    c = with_args(replace(base, objects=tuple(o for o in base.objects if o.family != "rng_state")), no_save_rng=True)
    assert outcomes(predict(c, tp=2, pp=2, dp=2))[R] is Outcome.ABSENT
    missing = replace(base, objects=c.objects)  # no rng objects, and the args do not say --no-save-rng
    assert outcomes(predict(missing, tp=2, pp=2, dp=2))[R] is Outcome.FAILS
    assert outcomes(predict(missing, tp=1, pp=2, dp=2))[R] is Outcome.ABSENT  # not requested after a TP change
    legacy = with_args(with_common(ckpt("legacy"), rng_state=_DROP), no_save_rng=True)
    p = predict(legacy, tp=2, pp=2, dp=2)
    assert outcomes(p)[R] is Outcome.FAILS and "--no-load-rng" in p.components[R].reason
    assert outcomes(predict(legacy, tp=2, pp=2, dp=2, no_load_rng=True))[R] is Outcome.ABSENT


def test_data_parallel_random_init_cannot_grow_dp() -> None:
    """With --data-parallel-random-init get_rng_state saves one rng dict per DP rank; [LM] load_checkpoint indexes
    rng_state[dp_rank] and only catches KeyError, so a larger DP raises IndexError. A smaller DP loads a subset."""
    c = with_args(ckpt("fixture"), data_parallel_random_init=True)
    assert outcomes(predict(c, tp=2, pp=2, dp=4))[R] is Outcome.FAILS
    assert outcomes(predict(c, tp=2, pp=2, dp=1))[R] is Outcome.LOADED


def _pending(c: Checkpoint) -> Checkpoint:
    rerun = dict((c.common or {})["rerun_state_machine"])
    state = rerun["state"]
    rerun["state"] = replace(state, summary="3") if hasattr(state, "summary") else 3  # WILL_RERUN_FROM_CHECKPOINT
    return with_common(c, rerun_state_machine=rerun)


def test_pending_rerun_state_is_dropped_on_any_sharding_change() -> None:
    """[LM] load_checkpoint: rerun state is loaded only if ckpt world_size, (TP, PP) and data_parallel_size equal
    the run's and validate_state_dict accepts it (state ≠ NOT_RUNNING_YET, [mc] rerun_state_machine.py:845-859);
    otherwise 'Job sharding has changed: Rerun state will be ignored'."""
    c = _pending(ckpt("torch_dist"))
    assert outcomes(predict(c, tp=2, pp=2, dp=2))[X] is Outcome.LOADED
    for target in ({"tp": 2, "pp": 2, "dp": 1}, {"tp": 2, "pp": 1, "dp": 2, "no_load_optim": True}):
        p = predict(c, **target)
        assert outcomes(p)[X] is Outcome.DROPPED and p.verdict is Verdict.LOSSY, p.to_dict()["components"]
        assert "Job sharding has changed" in p.components[X].reason
    assert outcomes(predict(c, tp=2, pp=2, dp=1, finetune=True))[X] is Outcome.SKIPPED


def test_rerun_state_dropped_when_args_lack_world_size() -> None:
    """[LM] load_checkpoint compares getattr(ckpt_args, 'world_size', 0) with the run's world size: a checkpoint
    whose args lack it never matches, so a pending rerun state is always ignored."""
    c = with_args(_pending(ckpt("torch_dist")), world_size=_DROP)
    assert outcomes(predict(c, tp=2, pp=2, dp=2))[X] is Outcome.DROPPED


def test_legacy_has_no_rerun_state() -> None:
    """RerunStateMachine.state_dict returns None for non-torch_dist formats ([mc] rerun_state_machine.py:796-803)."""
    p = predict(ckpt("legacy"), tp=2, pp=2, dp=2)
    assert outcomes(p)[X] is Outcome.ABSENT and outcomes(p)[M] is Outcome.LOADED


# ------------------------------------------------------------------------------------------ target validity


@pytest.mark.parametrize(("changes", "target", "needle"), [
    ({}, {"tp": 8, "pp": 2, "dp": 1}, "num_attention_heads 4"),
    ({}, {"tp": 2, "pp": 3, "dp": 1}, "num_layers 2"),
    ({"ffn_hidden_size": 66}, {"tp": 4, "pp": 1, "dp": 1}, "ffn_hidden_size 66"),
    ({"group_query_attention": True, "num_query_groups": 3, "num_attention_heads": 12}, {"tp": 2, "pp": 2, "dp": 1},
     "num_query_groups 3"),
    ({}, {"tp": 2, "pp": 2, "dp": 4}, "global_batch_size 4"),
    ({}, {"tp": 2, "pp": 2, "dp": 1, "ep": 2}, "without MoE"),
    ({"num_experts": 6}, {"tp": 2, "pp": 2, "dp": 2, "ep": 4}, "num_experts 6"),
])
def test_divisibility_the_target_needs(changes: dict[str, Any], target: dict[str, Any], needle: str) -> None:
    """Megatron-Core raises at model / group construction: num_layers % PP ([mc] transformer_block.py:155),
    heads % TP (transformer_config.py:924), query groups multiple-or-divisor of TP (:939-946), ffn_hidden_size % TP
    (tensor_parallel/layers.py:842), num_experts % EP (moe/moe_layer.py:101), global batch % (micro batch × DP)
    (num_microbatches_calculator.py:340)."""
    p = predict(with_args(ckpt("torch_dist"), **changes), **target)
    assert p.components[M].rule == "model.topology" and p.verdict is Verdict.FAILS
    assert any(needle in x for x in p.problems), p.problems


def test_query_groups_may_divide_tp() -> None:
    """[mc] transformer_config.py:939-946 accepts num_query_groups that divide TP (KV heads replicated)."""
    c = with_args(ckpt("fixture"), group_query_attention=True, num_query_groups=2, num_attention_heads=8)
    assert not predict(c, tp=4, pp=2, dp=1, make_vocab_size_divisible_by=64, finetune=True).problems


def test_dp_defaults_to_the_saved_world_size() -> None:
    """Without --dp the run is assumed to keep the saved world size (Megatron derives DP = world / (TP × PP × CP),
    [mc] parallel_state.py:737-741); when that is unknown and the split is unchanged, DP stays as saved."""
    c = ckpt("fixture")
    assert predict(c, tp=1, pp=2).target["dp"] == 4
    p = predict(c, tp=2, pp=3)
    assert p.target["dp"] is None and "pass --dp" in p.notes[0]
    q = predict(replace(c, topology=replace(c.topology, world_size=None)), tp=2, pp=2)
    assert q.target["dp"] == 2 and q.verdict is Verdict.OK


def test_bad_targets_and_formats_are_usage_errors() -> None:
    c = ckpt("fixture")
    with pytest.raises(UsageError, match="--tp"):
        predict(c, tp=0, pp=1)
    with pytest.raises(UsageError, match="torch_dcp"):
        predict(replace(c, format=Format.TORCH_DCP), tp=2, pp=2)


def test_unreadable_checkpoint_fails_on_the_model(tmp_path: Path) -> None:
    """A dir Megatron's _get_checkpoint_format cannot classify raises NotImplementedError ([LM])."""
    c = read_checkpoint(tmp_path, str(tmp_path))
    p = predict(c, tp=1, pp=1)
    assert p.verdict is Verdict.FAILS and p.components[M].outcome is Outcome.FAILS and "CK100" in p.components[M].reason
    assert {x.outcome for c_, x in p.components.items() if c_ is not M} == {Outcome.ABSENT}


def test_release_checkpoint() -> None:
    """[LM] load_checkpoint: `release` sets iteration 0 and gates optimizer, rng and rerun on `not release`."""
    base = ckpt("fixture")
    p = predict(replace(base, path=str(Path(base.path).parent / "release")), tp=2, pp=2, dp=2)
    assert outcomes(p)[O] is Outcome.DROPPED and outcomes(p)[R] is Outcome.DROPPED
    assert outcomes(p)[I] is Outcome.ABSENT


# ------------------------------------------------------------------------------- table, contract, rendering


def test_rule_table_is_complete() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    for comp in Component:
        rules = [r for r in RULES if r.component is comp]
        assert rules and rules[-1].when == "otherwise", comp
        assert all(r.id.startswith(comp.value + ".") for r in rules)


def test_verdict_of() -> None:
    def comps(*xs: Outcome) -> dict[Component, ComponentPrediction]:
        return {c: ComponentPrediction(x, "", "t") for c, x in zip(Component, xs)}
    assert verdict_of(comps(Outcome.LOADED, Outcome.SKIPPED, Outcome.ABSENT)) is Verdict.OK
    assert verdict_of(comps(Outcome.RESHARDED, Outcome.DROPPED)) is Verdict.LOSSY
    assert verdict_of(comps(Outcome.DROPPED, Outcome.FAILS)) is Verdict.FAILS


def test_to_dict_has_the_contract_keys() -> None:
    d = predict(ckpt("torch_dist"), tp=1, pp=2, dp=2, no_load_rng=True).to_dict()
    assert d["verdict"] == "fails"
    assert set(d["components"]) == {"model", "optimizer", "rng", "rerun_state", "scheduler", "iteration", "dataloader"}
    assert all(set(v) >= {"outcome", "reason"} for v in d["components"].values())
    assert {"tp", "pp", "dp", "ep", "world_size"} <= set(d["source"]) and d["source"]["tp"] == 2
    assert d["target"]["no_load_rng"] is True and d["target"]["world_size"] == 4
    assert d["rules"] and {"id", "fired", "decided", "source"} <= set(d["rules"][0])


def test_render_with_explain_shows_the_rules_and_keeps_brackets() -> None:
    p = predict(ckpt("torch_dist"), tp=4, pp=2)
    console = Console(width=200, record=True, color_system=None)
    console.print(render_resume(p, explain=False))
    plain = console.export_text()
    assert "fails" in plain and "[mc] strategies/torch.py" in plain and "optimizer.split-fixed" not in plain
    console.print(render_resume(p, explain=True))
    explained = console.export_text()
    assert "optimizer.split-fixed" in explained and "●" in explained and "[LM] Megatron-LM" in explained


def test_prediction_does_not_import_torch() -> None:
    code = ("import sys; from pathlib import Path; from ckptinspect.formats import read_checkpoint; "
            "from ckptinspect.commands.resume import predict_resume, ResumeTarget; "
            f"predict_resume(read_checkpoint(Path({str(FIXTURE_0192 / 'iter_0000400')!r}), 'x'), ResumeTarget(2, 2)); "
            "assert 'torch' not in sys.modules and 'rich' not in sys.modules")
    if not FIXTURE_0192.is_dir():
        pytest.skip("0.19.2 fixture not available")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
