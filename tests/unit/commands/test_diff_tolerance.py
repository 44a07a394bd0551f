"""Tests of `ckptinspect.commands.diff.tolerance`: `diff --values` proves identical tensors by their value
fingerprints, `--atol` / `--rtol` accept small differences, `--ignore KEY_GLOB` leaves keys out — on the real
torch_dist sample and a plain DCP re-save of its tensors by `torch.distributed.checkpoint.save`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.api import diff
from ckptinspect.cli.app import app
from ckptinspect.errors import UsageError

torch = pytest.importorskip("torch")
from dcp_io import load_dcp as _load, save_dcp as _save  # noqa: E402 - needs torch

SAMPLES = Path(__file__).resolve().parents[3] / "sample_ckpts"
SRC = SAMPLES / "torch_dist" / "iter_0000001"


@pytest.fixture(scope="module")
def resaved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    state = _load(SRC)
    return _save(tmp_path_factory.mktemp("resaved") / "ckpt", state), state


def test_identical_by_fingerprint_across_chunk_grids(resaved: tuple[Path, dict[str, Any]]) -> None:
    path, state = resaved
    r = diff(SRC, path, values=True).report
    assert r.values is not None
    assert set(r.values.by_fingerprint) == set(state) == set(r.values.identical)
    assert r.values.elements_compared == 0  # nothing compared element by element


def test_tolerance_accepts_small_differences_only(resaved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, state = resaved
    key = "embedding.word_embeddings.weight"
    moved = dict(state)
    moved[key] = state[key] + 1e-6
    path = _save(tmp_path / "moved", moved)
    exact = diff(SRC, path, values=True).report
    assert exact.values is not None and key not in exact.values.identical
    (c,) = [c for c in exact.tensors.changed if c.key == key and c.what.value == "values"]
    assert c.mismatched_elements == state[key].numel()
    loose = diff(SRC, path, values=True, atol=2e-6).report
    assert loose.values is not None and key in loose.values.identical and loose.values.atol == 2e-6
    rel = diff(SRC, path, values=True, rtol=1e-9).report  # 1e-6 on values ~0.02: far above 1e-9 relative
    assert rel.values is not None and key not in rel.values.identical


def test_ignore_leaves_keys_out(resaved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, state = resaved
    fewer = {k: v for k, v in state.items() if not k.startswith("optimizer.")}
    path = _save(tmp_path / "fewer", fewer)
    blocking = diff(SRC, path).report
    assert blocking.blocking and blocking.tensors.only_in_a
    res = CliRunner().invoke(app, ["diff", str(SRC), str(path), "--ignore", "optimizer.*", "-o", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["tensors"]["only_in_a"] == [] and any("--ignore optimizer.*" in n for n in doc["notes"])


def test_negative_tolerance_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        diff(SRC, SRC, values=True, atol=-1.0)
    res = CliRunner().invoke(app, ["diff", str(SRC), str(SRC), "--rtol", "-1"])
    assert res.exit_code == 2
