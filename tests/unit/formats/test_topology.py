"""Topology facts the args leave out or get wrong come from the on-disk layout, and `topology_sources` says so.

ETP (issue 25 §5): Megatron-LM's `validate_args` defaults `expert_tensor_parallel_size` to TP, so `info` reported
ETP = TP whenever the args lacked it — but the expert weights' chunks show how the experts were really cut. The
samples are real megatron-core 0.16.1 MoE saves: `moe_tp2_ep2` (TP 2, EP 2, ETP 1: experts not TP-split) and, made
here with the same generator, a TP 2, EP 2, ETP 2 save (experts TP-split). Their args are edited with `torch.load` /
`torch.save` of the sample's own `common.pt` (`corpus_kit.edit_torch_file`).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from ckptinspect.formats.topology import EXPERT_TP_SOURCE
from conftest import SAMPLES
from corpus_kit import edit_torch_file

ROOT = Path(__file__).resolve().parents[3]


def _info(path: Path) -> dict[str, Any]:
    r = CliRunner().invoke(app, ["info", str(path), "-o", "json"])
    assert r.exit_code in (0, 1), r.stdout
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _audit_codes(path: Path) -> dict[str, list[dict[str, Any]]]:
    r = CliRunner().invoke(app, ["audit", str(path), "-o", "json"])
    out: dict[str, list[dict[str, Any]]] = {}
    for f in json.loads(r.stdout)["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


def _edit_args(common_pt: Path, drop: tuple[str, ...] = (), **values: Any) -> None:
    def change(state: dict[str, Any]) -> None:
        for k in drop:
            delattr(state["args"], k)
        for k, v in values.items():
            setattr(state["args"], k, v)

    edit_torch_file(common_pt, change)


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / src.name
    shutil.copytree(src, dst)
    return dst


def test_etp_from_the_expert_chunks_when_the_args_are_silent(tmp_path: Path) -> None:
    save = _copy(SAMPLES / "moe_tp2_ep2", tmp_path)
    _edit_args(save / "iter_0000001" / "common.pt", drop=("expert_tensor_parallel_size",))
    doc = _info(save)
    assert (doc["topology"]["tp"], doc["topology"]["etp"]) == (2, 1)  # was 2: "default (= TP)"
    assert doc["topology_sources"]["etp"].startswith(EXPERT_TP_SOURCE)
    assert "args silent" in doc["topology_sources"]["etp"]
    assert "CK702" not in _audit_codes(save)


def test_etp_from_the_expert_chunks_when_the_args_disagree(tmp_path: Path) -> None:
    save = _copy(SAMPLES / "moe_tp2_ep2", tmp_path)
    _edit_args(save / "iter_0000001" / "common.pt", expert_tensor_parallel_size=2)
    doc = _info(save)
    assert doc["topology"]["etp"] == 1
    assert doc["topology_sources"]["etp"] == f"{EXPERT_TP_SOURCE}; args say 2"
    (f,) = _audit_codes(save)["CK702"]
    assert f["details"] == {"arg": "expert_tensor_parallel_size", "args_value": 2, "on_disk": 1,
                            "witness": EXPERT_TP_SOURCE}


def test_etp_from_args_when_they_agree_with_the_chunks() -> None:
    doc = _info(SAMPLES / "moe_tp2_ep2")
    assert doc["topology"]["etp"] == 1 and doc["topology_sources"]["etp"] == "args"
    dense = _info(SAMPLES / "torch_dist")
    assert dense["topology"]["etp"] is None and "etp" not in dense["topology_sources"]


@pytest.fixture(scope="module")
def etp2_save(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real megatron-core save with TP 2, EP 2, ETP 2 (tools/make_sample_ckpts.py; ~45 s on 2 cores)."""
    pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")
    spec = importlib.util.spec_from_file_location("make_sample_ckpts", ROOT / "tools" / "make_sample_ckpts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_sample_ckpts", mod)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("etp2") / "save"
    mod.make_checkpoint(str(out), format="torch_dist", tp=2, pp=1, dp=2, ep=2, etp=2, experts=4, layers=2,
                        optim_sharding="dp_reshardable", iterations=(1,), seed=1234)
    return out


@pytest.mark.live
def test_etp_two_shows_in_the_chunks_of_a_real_save(etp2_save: Path, tmp_path: Path) -> None:
    """The other side: experts that ARE TP-split give ETP 2 from the chunks, with or without the arg."""
    doc = _info(etp2_save)
    assert doc["topology"]["etp"] == 2 and doc["topology_sources"]["etp"] == "args"
    save = _copy(etp2_save, tmp_path)
    _edit_args(save / "iter_0000001" / "common.pt", drop=("expert_tensor_parallel_size",))
    doc = _info(save)
    assert doc["topology"]["etp"] == 2
    assert doc["topology_sources"]["etp"] == f"{EXPERT_TP_SOURCE}; args silent, Megatron's default would be TP = 2"
