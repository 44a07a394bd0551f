"""Every Megatron-Core on-disk generation, read right: real saves of 0.13.1, 0.14.0, 0.15.3 (torch_dist and zarr),
0.16.1 and 0.19.2 in sample_ckpts/ (sample_ckpts/README.md says which release wrote each).

sniff names the generation with its evidence; info reports the optimizer sharding and dtypes; audit is `complete`
with no warning or error on every healthy sample; corruptions of them (a dropped chunk of a flattened tensor, a
missing .distcp, a missing zarr chunk file, a broken .zarray) get the right code and coordinates.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptinspect.commands.audit.audit import audit
from ckptinspect.cli.app import app
from ckptinspect.formats import read_checkpoint

SAMPLES = Path(__file__).resolve().parents[3] / "sample_ckpts"

# sample -> (generation, optimizer sharding, iteration dir)
GENERATIONS = {
    "mcore_0_13_1": ("megatron-core 0.8-0.13 (flattened DistOpt, mcore_data)", "fully_sharded_model_space",
                     "iter_0000001"),
    "mcore_0_13_1_dpzero": ("megatron-core 0.13 (MCoreSavePlan, content_metadata)", "dp_zero_gather_scatter",
                            "iter_0000001"),
    "mcore_0_14_0": ("megatron-core 0.14-0.15 (flattened DistOpt, mcore_data)", "fully_sharded_model_space",
                     "iter_0000001"),
    "mcore_0_15_3": ("megatron-core 0.15 (MCoreMetadata)", "dp_reshardable", "iter_0000001"),
    "mcore_0_15_3_zarr": ("megatron-core<=0.15 (zarr backend)", "dp_zero_gather_scatter", "iter_0000001"),
    "torch_dist_fully": ("megatron-core 0.16-0.18 (common.pt)", "fully_reshardable", "iter_0000001"),
    "mcore_0_19_2": ("megatron-core>=0.19 (common_state item)", "dp_reshardable", "iter_0000400"),
}
runner = CliRunner()


def cli_json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.output)


@pytest.mark.parametrize("sample", sorted(GENERATIONS))
def test_sniff_names_the_generation_with_evidence(sample: str) -> None:
    gen, _, _ = GENERATIONS[sample]
    doc = cli_json("sniff", str(SAMPLES / sample))
    assert doc["format"] == "torch_dist" and doc["generation"] == gen
    assert len(doc["evidence"]) >= 4  # tracker, iteration, metadata.json, + the generation's own facts


@pytest.mark.parametrize("sample", sorted(GENERATIONS))
def test_info_optimizer_sharding_and_dtypes(sample: str) -> None:
    gen, sharding, it = GENERATIONS[sample]
    ckpt = read_checkpoint(SAMPLES / sample / it, sample)
    assert ckpt.generation == gen and ckpt.optimizer_sharding == sharding
    assert {t.dtype for t in ckpt.tensors} == {"float32"}
    assert ckpt.topology.tp == 2 and ckpt.topology.world_size in (4, 8)
    assert ckpt.extra["generation_evidence"]


@pytest.mark.parametrize("sample", sorted(GENERATIONS))
def test_healthy_sample_audits_complete_without_warning(sample: str) -> None:
    report = audit(SAMPLES / sample)
    assert report.status.value == "complete"
    assert [f.code for f in report.findings if f.severity.value in ("warning", "error")] == []


def test_flattened_tensors_keep_their_original_shapes() -> None:
    ckpt = read_checkpoint(SAMPLES / "mcore_0_13_1" / "iter_0000001", "x")
    t = {t.key: t for t in ckpt.tensors}["optimizer.state.exp_avg.output_layer.weight"]
    assert t.shape == (2, 1, 1024) and t.orig_shape == (128, 16)
    assert sum(1 for t in ckpt.tensors if t.orig_shape) == 51


def test_zarr_is_read_without_the_zarr_package() -> None:
    import importlib.util

    assert importlib.util.find_spec("zarr") is None  # not a dependency, not even of the test extra
    ckpt = read_checkpoint(SAMPLES / "mcore_0_15_3_zarr" / "iter_0000001", "z")
    qkv = {t.key: t for t in ckpt.tensors}["decoder.layers.self_attention.linear_qkv.weight"]
    assert qkv.shape == (2, 48, 16) and len(qkv.chunks) == 4
    assert {c.storage.file for c in qkv.chunks if c.storage} == {
        f"decoder.layers.self_attention.linear_qkv.weight/{i}" for i in ("0.0.0", "0.1.0", "1.0.0", "1.1.0")}
    assert any(o.family == "optimizer.distributed.dp_group_idx_0.param_state" for o in ckpt.objects)


# --- corruptions ---------------------------------------------------------------------------------------------------


def _copy(sample: str, tmp_path: Path) -> Path:
    dst = tmp_path / sample
    shutil.copytree(SAMPLES / sample, dst)
    for dirpath, _, files in os.walk(dst):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IRWXU)
        for n in files:
            os.chmod(os.path.join(dirpath, n), os.stat(os.path.join(dirpath, n)).st_mode | stat.S_IWUSR)
    return dst


def _codes(path: Path) -> tuple[str, list[dict]]:
    doc = cli_json("audit", str(path))
    return doc["status"], doc["findings"]


def test_dropped_chunk_of_a_flattened_tensor_maps_back_to_the_original_shape(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    ckpt = _copy("mcore_0_13_1", tmp_path) / "iter_0000001"
    key = "optimizer.state.exp_avg.output_layer.weight"
    md = FileSystemReader(str(ckpt)).read_metadata()
    md.state_dict_metadata[key].chunks.pop(1)  # the grid cell (1, 0): rows 64..127 of the (128, 16) original
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    status, findings = _codes(ckpt)
    gap = [f for f in findings if f["code"] == "CK301"]
    assert status == "corrupt" and [f["subject"] for f in gap] == [key]
    assert "[1:2, 0:1, 0:1024]" in gap[0]["message"]
    assert gap[0]["details"]["orig_regions"] == ["elements [64, 0] .. [127, 15] (grid cell [1, 0], flat 0:1024 of a "
                                              "[64, 16] shard)"]


def test_missing_distcp_of_a_015_save(tmp_path: Path) -> None:
    ckpt = _copy("mcore_0_15_3", tmp_path) / "iter_0000001"
    (ckpt / "__1_1.distcp").unlink()
    status, findings = _codes(ckpt)
    assert status == "corrupt" and [f["subject"] for f in findings if f["code"] == "CK201"] == ["__1_1.distcp"]


def test_missing_zarr_chunk_file(tmp_path: Path) -> None:
    ckpt = _copy("mcore_0_15_3_zarr", tmp_path) / "iter_0000001"
    (ckpt / "output_layer.weight" / "1.0").unlink()
    status, findings = _codes(ckpt.parent)
    assert status == "corrupt"
    assert [f["subject"] for f in findings if f["code"] == "CK201"] == ["output_layer.weight/1.0"]


def test_short_zarr_chunk_file_and_broken_zarray(tmp_path: Path) -> None:
    ckpt = _copy("mcore_0_15_3_zarr", tmp_path) / "iter_0000001"
    chunk = ckpt / "embedding.word_embeddings.weight" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:100])
    (ckpt / "output_layer.weight" / ".zarray").write_text("{not json")
    status, findings = _codes(ckpt)
    codes = {f["code"]: f["subject"] for f in findings}
    assert status == "corrupt"
    assert codes["CK202"] == "embedding.word_embeddings.weight/0.0"
    assert codes["CK113"] == "output_layer.weight/.zarray"
