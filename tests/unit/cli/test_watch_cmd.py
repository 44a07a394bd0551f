"""`ckptinspect watch` on the command line: `-o jsonl` lines (each validated against docs/schema/watch.schema.json),
text lines, `--once` / `--max-polls` bounds, `--fail-fast` and the exit codes. Save dirs are copies of the real
torch_dist sample (`iter_0000003` there is a real save stopped before its `metadata.json`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ckptinspect.cli.app import app
from schemas import validate_document

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_ckpts" / "torch_dist"
runner = CliRunner()


def _lines(stdout: str) -> list[dict[str, object]]:
    docs = [json.loads(line) for line in stdout.splitlines()]
    for d in docs:
        validate_document(d)
    return docs


def test_once_as_json_lines(tmp_path: Path) -> None:
    save = tmp_path / "run"
    shutil.copytree(SAMPLE, save)
    r = runner.invoke(app, ["watch", str(save), "--once", "-o", "jsonl"])
    assert r.exit_code == 0, r.output
    docs = _lines(r.stdout)
    assert [(d["event"], d["name"]) for d in docs] == [
        ("tracker_moved", None), ("iteration_complete", "iter_0000001"), ("audited", "iter_0000001"),
        ("iteration_complete", "iter_0000002"), ("audited", "iter_0000002"), ("iteration_in_flight", "iter_0000003")]
    assert docs[0]["iteration"] == 2 and all(d["command"] == "watch" and d["path"] == str(save) for d in docs)


def test_a_stall_and_fail_on_warning(tmp_path: Path) -> None:
    save = tmp_path / "run"
    shutil.copytree(SAMPLE, save)
    r = runner.invoke(app, ["watch", str(save), "--max-polls", "2", "--interval", "0.05", "--stall-after", "0",
                            "-o", "jsonl"])
    assert r.exit_code == 0, r.output  # CK530 is a warning
    stalls = [d for d in _lines(r.stdout) if d["event"] == "stalled"]
    assert len(stalls) == 1 and stalls[0]["name"] == "iter_0000003" and "CK530" in stalls[0]["codes"]  # type: ignore
    r = runner.invoke(app, ["watch", str(save), "--max-polls", "2", "--interval", "0.05", "--stall-after", "0",
                            "--fail-on", "warning", "--fail-fast"])
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines()[-1].split("  ")[1] == "STALLED"  # it stopped at the stall


def test_fail_fast_on_a_broken_iteration(tmp_path: Path) -> None:
    save = tmp_path / "run"
    shutil.copytree(SAMPLE, save)
    shutil.rmtree(save / "iter_0000003")
    with open(save / "iter_0000001" / "__2_1.distcp", "r+b") as f:
        f.truncate(100)
    r = runner.invoke(app, ["watch", str(save), "--max-polls", "50", "--interval", "0", "--fail-fast"])
    assert r.exit_code == 1, r.output
    last = r.stdout.splitlines()[-1]
    assert "audited" in last and "iter_0000001" in last and "corrupt" in last  # stopped at the first broken one
    r = runner.invoke(app, ["watch", str(save), "--once", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["watch", str(save), "--once"])
    assert r.exit_code == 1 and "iter_0000002" in r.stdout  # without --fail-fast: every poll runs, worst exit


def test_usage_errors(tmp_path: Path) -> None:
    for args in (["watch", str(tmp_path / "missing"), "--once"], ["watch", str(SAMPLE / "iter_0000001"), "--once"],
                 ["watch", str(SAMPLE), "--interval", "-1"], ["watch", str(SAMPLE), "-o", "json"]):
        assert runner.invoke(app, args).exit_code == 2, args


def test_a_real_process_prints_each_line_as_it_happens(tmp_path: Path) -> None:
    """The console script in a subprocess, stdout a pipe: lines are flushed one by one (a log collector reads them
    while watch runs); bounded by --timeout."""
    save = tmp_path / "run"
    shutil.copytree(SAMPLE, save)
    p = subprocess.run([sys.executable, "-m", "ckptinspect", "watch", str(save), "--timeout", "1", "--interval",
                        "0.3", "-o", "jsonl"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert len(_lines(p.stdout)) == 6
