"""The value scan on real megatron-core 0.16.1 saves whose faults were put into the model / optimizer in memory
before `dist_checkpointing.save` (tests/data/values_ckpts, README there: the writer, the command, where each fault
is, as torch read it back), and the same healthy model saved at TP1, TP2 and as plain DCP."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptinspect.api import audit, read, values
from ckptinspect.model.components import component_of
from schemas import validate_document

DATA = Path(__file__).resolve().parents[2] / "data" / "values_ckpts"
L0_FC1 = "decoder.layers.mlp.linear_fc1.weight"
VALUE_CODES = {f"CK9{n:02d}" for n in range(1, 20)}


def _findings(name: str) -> dict[tuple[str, str], Any]:
    r = values(DATA / name)
    validate_document(r.to_dict())
    return {(f.code, f.subject): f for f in r.findings if f.code in VALUE_CODES}


def test_weights_nan_inf_denormals_and_a_zeroed_layer() -> None:
    got = _findings("weights")
    for key in (L0_FC1, "optimizer.state.param." + L0_FC1):  # fp32: the main params are the model params
        nan, inf, sub = got[("CK901", key)], got[("CK902", key)], got[("CK903", key)]
        assert nan.details["nan"] == 2 and nan.details["first"]["index"] == [0, 0, 0]
        assert inf.details["posinf"] == 2 and inf.details["first"]["index"] == [0, 0, 1]
        assert sub.details["subnormal"] == 8 and sub.details["first"]["index"] == [0, 1, 0]
    proj = "decoder.layers.self_attention.linear_proj.weight"
    assert got[("CK905", proj)].details["layers"] == [1]
    assert got[("CK905", "optimizer.state.param." + proj)].details["layers"] == [1]
    assert {c for c, _ in got} == {"CK901", "CK902", "CK903", "CK905"}


def test_the_first_nan_is_at_the_byte_the_finding_names() -> None:
    f = _findings("weights")[("CK901", L0_FC1)]
    first = f.details["first"]
    ckpt = read(DATA / "weights")
    raw = (Path(ckpt.data_dir) / first["file"]).read_bytes()
    assert np.isnan(np.frombuffer(raw[first["byte_offset"]:first["byte_offset"] + 4], dtype="<f4")[0])
    assert first["chunk"][0] == 0 and first["file"].endswith(".distcp")


def test_moments_zeroed_layer_and_negative_second_moment() -> None:
    got = _findings("moments")
    zero = got[("CK906", "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight")]
    assert zero.details["layers"] == [0]
    neg = got[("CK904", "optimizer.state.exp_avg_sq.decoder.layers.self_attention.linear_qkv.layer_norm_weight")]
    assert neg.details["min"] == -1.0 and neg.details["first"]["index"] == [1, 0]
    assert {c for c, _ in got} == {"CK904", "CK906"}


def test_bf16_weight_desynced_from_its_main_param() -> None:
    got = _findings("desync")
    (f,) = got.values()
    assert f.code == "CK911" and f.subject == L0_FC1
    assert f.details["first_index"] == [0, 0, 0] and f.details["mismatched"] == 1
    assert audit(DATA / "desync", values=True).status.value == "corrupt"
    assert audit(DATA / "desync").status.value == "complete"  # the container is whole: only the values tell


@pytest.mark.parametrize("name", ["healthy_tp1", "healthy_tp2", "healthy_dcp"])
def test_healthy_saves_have_no_value_finding(name: str) -> None:
    assert _findings(name) == {}


def _model_fingerprints(path: Path) -> dict[str, str | None]:
    return {t.key: t.values.fingerprint for t in values(path).report.tensors if t.component == "model"}


def test_fingerprints_equal_across_tp_and_format_and_differ_on_one_element(tmp_path: Path) -> None:
    tp1, tp2, plain = (_model_fingerprints(DATA / n) for n in ("healthy_tp1", "healthy_tp2", "healthy_dcp"))
    assert len(tp1) == 17 and all(tp1.values())
    assert tp1 == tp2 == plain
    assert len({len(t.chunks) for t in read(DATA / "healthy_tp2").tensors}) > 1  # TP2 split some of them
    # one element of one chunk changed (a bit flipped in the stored bytes): that tensor's fingerprint only changes
    copy = tmp_path / "tp2"
    shutil.copytree(DATA / "healthy_tp2", copy)
    ckpt = read(copy)
    t = next(t for t in ckpt.tensors if component_of(t.key) == "model" and len(t.chunks) > 1)
    f = _findings_place(copy, t.key)
    data = bytearray((Path(ckpt.data_dir) / f["file"]).read_bytes())
    data[f["byte_offset"]] ^= 0x01
    (Path(ckpt.data_dir) / f["file"]).write_bytes(bytes(data))
    changed = _model_fingerprints(copy)
    assert changed[t.key] != tp2[t.key]
    assert {k for k in tp2 if changed[k] != tp2[k]} == {t.key}


def _findings_place(path: Path, key: str) -> dict[str, Any]:
    """The file and byte offset of the last element of `key`'s second chunk (from the scan's own locate)."""
    from ckptinspect.commands.values.scan import source_of
    from ckptinspect.services.chunk_bytes import locate

    ckpt = read(path)
    t = next(t for t in ckpt.tensors if t.key == key)
    c = t.chunks[1]
    e = locate(source_of(ckpt), c, t.dtype)
    assert c.storage is not None
    return {"file": c.storage.file, "byte_offset": e.byte_of(tuple(s - 1 for s in c.sizes))}
