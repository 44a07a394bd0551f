"""Live: write a fresh checkpoint with megatron-core 0.16.1 (the test extra) and audit it, so a format change in the
library shows up here first. Runs in CI (tens of seconds on 2 cores)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.live


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_sample_ckpts", ROOT / "tools" / "make_sample_ckpts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_sample_ckpts", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def live_save(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")
    out = tmp_path_factory.mktemp("live") / "save"
    _generator().make_checkpoint(str(out), format="torch_dist", tp=2, pp=1, dp=2, iterations=(1, 2),
                                 half_written="before_metadata")
    return out


def _audit(path: Path, *extra: str) -> tuple[int, dict[str, object]]:
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", str(path), "-o", "json", *extra],
                       capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_fresh_megatron_save_audits_complete(live_save: Path) -> None:
    rc, doc = _audit(live_save, "--deep")
    assert doc["format"] == "torch_dist" and doc["iteration"] == 1
    assert doc["status"] == "complete" and rc == 0, doc["findings"]  # the tracked iteration decides
    rc, doc = _audit(live_save, "--all", "--deep")
    assert doc["format"] == "torch_dist" and doc["iteration"] == 1
    audits = {c["name"]: c for c in doc["checkpoints"]}  # type: ignore[union-attr]
    assert audits["iter_0000001"]["status"] == "complete"
    # the async write ran, finalize did not: data files without .metadata; the tracker still names iteration 1
    assert audits["iter_0000002"]["status"] == "incomplete"
    assert {f["code"] for f in audits["iter_0000002"]["findings"]} >= {"CK102"}
    codes = {f["code"] for f in doc["findings"]}  # type: ignore[union-attr]
    assert "CK506" in codes
    # --all fully audits the half-written iteration and every iteration decides: its CK102 error gates, and the
    # status says so (issue 25: it said complete and exited 1)
    assert rc == 1 and doc["status"] == "incomplete"


def test_fresh_megatron_save_topology(live_save: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "info", str(live_save / "iter_0000001"), "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert doc["topology"] == {"tp": 2, "pp": 1, "dp": 2, "ep": 1, "world_size": 4, "cp": 1, "etp": None, "vpp": 1}
    assert doc["optimizer_sharding"] == "dp_reshardable"
    assert doc["generation"] == "megatron-core 0.16-0.18 (common.pt)"
