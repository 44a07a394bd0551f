"""Megatron FSDP (`fsdp_dtensor`) on the real sample `sample_ckpts/megatron_fsdp` (a megatron-core 0.16.1 Megatron
FSDP run, tools/_fsdp_cpu.py): what the reader finds in it, and the FSDP checks (CK515-CK517) on edge inputs the
acceptance corpus (tests/support/corpus_stacks.py) does not build."""

from __future__ import annotations

import warnings
from pathlib import Path

import ckptinspect
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.megatron_fsdp import group_meta_findings, rng_findings, swiglu_findings
from ckptinspect.model import Format
from conftest import SAMPLES
from corpus import Ctx, case_named

ITER = SAMPLES / "megatron_fsdp" / "iter_0000001"
FC1 = "model.module.decoder.layers.0.mlp.linear_fc1.weight"


def test_sample_has_the_fsdp_specifics_the_checks_rely_on() -> None:
    c = read_checkpoint(ITER, "f")
    assert c.format is Format.FSDP_DTENSOR and c.extra["stack"] == "megatron-fsdp"
    shapes = {t.key: t.shape for t in c.tensors}
    # SwiGLU halves in the model and in each optimizer state
    assert shapes[FC1 + "_w"] == shapes[FC1 + "_v"] == (64, 16) and FC1 not in shapes
    assert "optimizer.state.module.module.module.decoder.layers.0.mlp.linear_fc1.weight_v.exp_avg" in shapes
    # uneven DTensor shards: Megatron FSDP splits each bucket in half, not each tensor
    uneven = {t.key: sorted(ch.sizes[0] for ch in t.chunks) for t in c.tensors if len(t.chunks) > 1}
    assert uneven[FC1 + "_w"] == [4, 60] and uneven["model.module.embedding.position_embeddings.weight"] == [7, 9]
    objects = {o.key for o in c.objects}
    assert "rng_state.(0, 0).0.random_rng_state" in objects and "rng_state.(0, 0).0.torch_rng_state" in shapes
    meta = [k for k in objects if k.startswith("optimizer.param_to_group_meta.")]
    assert len(meta) == 18 * 21 and all(k.count(".module.module.module.") == 1 for k in meta)
    # the Megatron args are a byte item of their own: topology and iteration come from it
    assert c.extra["args_source"] == "args byte item" and c.args is not None and c.args["ckpt_format"] == "fsdp_dtensor"
    t = c.topology
    assert (t.tp, t.pp, t.dp, t.world_size) == (1, 1, 2, 2) and c.optimizer_sharding == "fsdp_dtensor"


def test_sample_is_healthy_for_every_command() -> None:
    root = SAMPLES / "megatron_fsdp"
    s = ckptinspect.sniff(root).to_dict()
    assert (s["format"], s["stack"], s["state"]) == ("fsdp_dtensor", "megatron-fsdp", "complete")
    assert any("Megatron FSDP prefixes" in e for e in s["evidence"])
    a = ckptinspect.audit(root)
    assert a.status.value == "complete" and {f.code for f in a.findings} <= {"CK400"}
    assert a.exit_code() == 0
    sc = ckptinspect.scan(root).to_dict()
    assert sc["status"] == "complete" and sc["findings"] == [] and sc["pickles_scanned"] > 400
    assert ckptinspect.diff(ITER, ITER).to_dict()["identical"] is True


def test_diff_reads_the_args_item(tmp_path: Path) -> None:
    """`args` lives in a byte item; a changed learning rate must show as an args difference."""
    import argparse
    import shutil

    from corpus import append_item, edit_metadata, torch_bytes

    b = tmp_path / "iter_0000001"
    shutil.copytree(ITER, b)
    args = dict(read_checkpoint(ITER, "a").args or {})
    args["lr"] = 0.5
    with edit_metadata(b) as md:
        append_item(b, md, "args", torch_bytes(argparse.Namespace(**args)))
    d = ckptinspect.diff(ITER, b).to_dict()
    assert d["identical"] is False and [(r["name"], r["b"]) for r in d["args"]] == [("lr", 0.5)], d["args"]


def test_swiglu_findings_edges() -> None:
    base = "optimizer.state.module.module.module.decoder.layers.0.mlp.linear_fc1.weight"
    assert swiglu_findings({FC1 + "_w": (64, 16), FC1 + "_v": (64, 16)}, "x") == []
    f, = swiglu_findings({base + "_v.exp_avg": (64, 16)}, "x")
    assert f.code == "CK515" and f.subject == base + "_w.exp_avg"
    f, = swiglu_findings({FC1 + "_w": (64, 16), FC1 + "_v": (60, 16)}, "x")
    assert f.code == "CK515" and "differ in shape" in f.message
    # per-expert GroupedMLP keys (weight{i}_w) pair by expert
    e = "model.module.decoder.layers.0.mlp.experts.linear_fc1.weight"
    assert [x.subject for x in swiglu_findings({e + "3_w": (8, 4), e + "3_v": (8, 4), e + "4_w": (8, 4)}, "x")] \
        == [e + "4_v"]


def test_rng_findings_edges() -> None:
    cell = ["rng_state.(0, 0).0." + f for f in ("random_rng_state", "np_rng_state", "torch_rng_state",
                                                "cuda_rng_state", "rng_tracker_states.model-parallel-rng")]
    assert rng_findings(cell, {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1}, "x") == []
    # TP2 per args, only cell (0, 0) saved
    f, = rng_findings(cell, {"tensor_model_parallel_size": 2}, "x")
    assert f.code == "CK516" and f.details["missing"] == [[0, 1]]
    # a cell that lacks a field Megatron's load reads
    f, = rng_findings([k for k in cell if "np_rng" not in k], None, "x")
    assert "lacks np_rng_state" in f.message
    # a torch_dist-style ShardedObject name is not a "(pp, tp)" cell
    assert any("not a" in x.message for x in rng_findings(["rng_state.shard_0.0_1.1"], None, "x"))


def test_group_meta_findings_edges() -> None:
    m = "optimizer.param_to_group_meta.module.module.module."
    s = "optimizer.state.module.module.module."
    keys = [m + "a.weight.lr", m + "a.weight.eps", m + "b.linear_fc1.weight.lr", m + "b.linear_fc1.weight.eps",
            s + "a.weight.exp_avg", s + "b.linear_fc1.weight_w.exp_avg", s + "b.linear_fc1.weight_v.exp_avg"]
    assert group_meta_findings(keys, "x") == []  # SwiGLU state halves map to the unsplit param's meta
    f, = group_meta_findings(keys + [s + "c.weight.exp_avg"], "x")
    assert f.code == "CK517" and f.details["params"] == ["module.module.module.c.weight"]
    f, = group_meta_findings([k for k in keys if k != m + "a.weight.eps"], "x")
    assert "partial" in f.message and "eps" in f.message


def test_hostile_fsdp_args_payload_is_live(tmp_path: Path) -> None:
    """The hostile_megatron_fsdp_args case proves something only if Megatron's load path would run it: Megatron's
    fsdp_dtensor load hands a state dict with `args` to `torch.distributed.checkpoint.load`, whose planner
    `torch.load`s byte items with `weights_only=False`."""
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    ckpt = case_named("hostile_megatron_fsdp_args").build(ctx)
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... load in a single process"
        dcp.load({"args": None}, checkpoint_id=str(ckpt), no_dist=True)  # in-process, as the legacy liveness test does
    assert ctx.marker.exists()
