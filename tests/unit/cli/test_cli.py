"""CLI commands on the real samples: JSON shapes of CONTRACT.md, exit codes, text output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"
FIXTURE = SAMPLES / "mcore_0_19_2"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args), env={"CKPTINSPECT_WIDTH": "200"})
    return r.exit_code, r.output


def run_json(*args: str, code: int = 0) -> dict[str, Any]:
    rc, out = run(*args, "-o", "json")
    assert rc == code, out
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["tool"] == "ckptinspect"
    return doc


def test_version() -> None:
    rc, out = run("--version")
    assert rc == 0 and out.startswith("ckptinspect ")


def test_sniff_save_dir_and_checkpoint() -> None:
    doc = run_json("sniff", str(SAMPLES / "torch_dist"))
    assert doc["kind"] == "save_dir" and doc["format"] == "torch_dist"
    assert doc["generation"] == "megatron-core 0.16-0.18 (common.pt)"
    assert any("tracker" in e or "latest_checkpointed_iteration" in e for e in doc["evidence"])
    half = run_json("sniff", str(SAMPLES / "torch_dist" / "iter_0000003"))
    # Megatron would mis-sniff this as torch_dcp; it is an unfinished torch_dist save
    assert half["kind"] == "checkpoint" and half["format"] == "torch_dist" and half["state"] == "CK101"
    assert run_json("sniff", str(SAMPLES / "legacy"))["format"] == "torch"
    assert run_json("sniff", str(SAMPLES / "dcp" / "step-10"))["format"] == "torch_dcp"


def test_sniff_019_generation() -> None:
    doc = run_json("sniff", str(FIXTURE))
    assert "0.19" in doc["generation"]


def test_ls_lists_every_iteration_with_status() -> None:
    doc = run_json("ls", str(SAMPLES / "torch_dist"))
    assert doc["tracker"] == {"raw": "2", "iteration": 2}
    rows = {r["name"]: r for r in doc["iterations"]}
    assert set(rows) == {"iter_0000001", "iter_0000002", "iter_0000003"}
    assert rows["iter_0000002"]["tracked"] and not rows["iter_0000001"]["tracked"]
    assert rows["iter_0000001"]["status"] == "complete" and rows["iter_0000003"]["status"] == "incomplete"
    assert all(set(r) >= {"name", "iteration", "format", "status", "bytes", "files", "tracked"} for r in rows.values())
    assert rows["iter_0000002"]["bytes"] > 0 and rows["iter_0000002"]["files"] >= 10


def test_info_torch_dist_topology_and_tables(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    rc, out = run("info", str(SAMPLES / "torch_dist"), "-o", "json", "--csv", str(csv))
    assert rc == 0, out
    doc = json.loads(out)
    assert doc["format"] == "torch_dist" and doc["iteration"] == 2
    assert doc["topology"] == {"tp": 2, "pp": 2, "dp": 2, "ep": 1, "world_size": 8, "cp": 1, "etp": None, "vpp": 1}
    assert doc["optimizer_sharding"] == "dp_reshardable"
    keys = {t["key"]: t for t in doc["tensors"]}
    emb = keys["embedding.word_embeddings.weight"]
    assert emb["chunks"] == 2 and emb["dtype"] == "float32" and set(emb) >= {"key", "shape", "dtype", "chunks", "bytes"}
    assert any(o["family"] == "rng_state" and o["grid"] == [2, 2] for o in doc["objects"])
    assert csv.read_text().splitlines()[0].startswith("key,")
    assert len(csv.read_text().splitlines()) == len(doc["tensors"]) + 1


def test_info_legacy_resolves_tp_pp_from_args() -> None:
    doc = run_json("info", str(SAMPLES / "legacy"))
    assert doc["format"] == "torch" and doc["topology"]["tp"] == 2 and doc["topology"]["pp"] == 2
    shards = {t.get("shard") for t in doc["tensors"]}
    assert {"mp_rank_00_000", "mp_rank_01_001"} <= shards


def test_audit_json_contract_keys() -> None:
    doc = run_json("audit", str(SAMPLES / "torch_dist"))
    assert set(doc) >= {"path", "kind", "format", "iteration", "status", "findings", "checkpoints", "summary"}
    assert doc["status"] == "complete" and doc["iteration"] == 2
    codes = {f["code"] for f in doc["findings"]}
    assert "CK506" in codes  # the half-written iter_0000003
    for f in doc["findings"]:
        assert set(f) >= {"code", "severity", "message", "subject", "path", "details"}
    assert doc["summary"]["by_rank"] and doc["summary"]["by_component"]["optimizer"] > 0


def test_audit_fail_on_warning_and_ignore() -> None:
    rc, _ = run("audit", str(SAMPLES / "torch_dist"), "--fail-on", "warning")
    assert rc == 1  # CK506 is a warning
    rc, _ = run("audit", str(SAMPLES / "torch_dist"), "--fail-on", "warning", "--ignore", "CK5")
    assert rc == 0


@pytest.mark.parametrize("fmt", ["markdown", "junit", "text"])
def test_audit_other_outputs(fmt: str) -> None:
    rc, out = run("audit", str(SAMPLES / "torch_dist"), "-o", fmt)
    assert rc == 0
    if fmt == "junit":
        assert out.startswith("<?xml") and "<testsuite" in out
    elif fmt == "markdown":
        assert out.startswith("## ckptinspect audit") and "`complete`" in out
    else:
        assert "verdict" in out and "complete" in out


def test_coverage_one_tensor_picture_and_svg(tmp_path: Path) -> None:
    svg = tmp_path / "g.svg"
    key = "embedding.word_embeddings.weight"
    rc, out = run("coverage", str(SAMPLES / "torch_dist"), key, "--svg", str(svg))
    assert rc == 0, out
    assert key in out and svg.read_text().startswith("<svg")
    doc = run_json("coverage", str(SAMPLES / "torch_dist"), key)
    assert doc["tensors"][0]["ok"] and doc["picture"]["cells"] == [[0], [1]]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run("audit", str(tmp_path / "nope"))[0] == 2
    assert run("audit", str(SAMPLES / "torch_dist"), "--no-such-option")[0] == 2
    assert run("coverage", str(SAMPLES / "torch_dist"), "no.such.tensor")[0] == 2


def test_module_entry_point_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "sniff", str(SAMPLES / "dcp"), "-o", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "save_dir"


def test_save_dir_verdict_counts_deciding_findings_apart_from_leftovers() -> None:
    """iter_0000003 of the sample is a crashed leftover with an error: it does not decide the verdict, and the
    verdict line must not read like `complete (1 error(s))`."""
    rc, out = run("audit", str(SAMPLES / "torch_dist"))
    assert rc == 0
    assert "verdict: complete" in out
    assert "(0 error(s), 1 warning(s); leftover iterations: 1 error(s), 0 warning(s))" in out
    rc, md = run("audit", str(SAMPLES / "torch_dist"), "-o", "markdown")
    assert "- findings: 0 error(s), 1 warning(s); leftover iterations: 1 error(s), 0 warning(s)" in md
    rc, out = run("audit", str(SAMPLES / "torch_dist" / "iter_0000002"))
    assert "(0 error(s), 0 warning(s))" in out and "leftover" not in out
