"""`ckptinspect retain` on the command line: text, `-o json` (validated against its schema), `--print0` feeding
`xargs -0 rm -rf`, exit codes. Save dirs are copies of the real torch_dist sample's iterations, backdated an hour."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from ckptinspect.commands.retain import Reason
from schemas import validate_document, validator

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "sample_ckpts" / "torch_dist" / "iter_0000001"
runner = CliRunner()


def _save_dir(root: Path, n: int, tracker: str) -> Path:
    root.mkdir()
    for k in range(1, n + 1):
        shutil.copytree(SOURCE, root / f"iter_{k:07d}")
    (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    old = time.time() - 3600
    for dirpath, _, files in os.walk(root):
        for f in files:
            os.utime(Path(dirpath) / f, (old, old))
        os.utime(dirpath, (old, old))
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return _save_dir(tmp_path / "run", 4, "3")


def test_json_document(run_dir: Path) -> None:
    r = runner.invoke(app, ["retain", str(run_dir), "--keep-last", "1", "--keep", "1", "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate_document(doc)
    assert doc["command"] == "retain" and doc["status"] == "complete"
    assert doc["delete"] == ["iter_0000002"]
    assert doc["delete_paths"] == [str((run_dir / "iter_0000002").resolve())]
    assert {k["name"]: k["reasons"] for k in doc["keep"]} == {
        "iter_0000001": ["milestone"], "iter_0000003": ["tracked", "resume-pick"],
        "iter_0000004": ["newest-complete", "keep-last"]}
    assert doc["policy"] == {"keep_last": 1, "keep_every": None, "keep": [1]}
    assert doc["tracker"] == {"raw": "3", "iteration": 3, "state": "names"}


def test_print0_feeds_xargs_rm(run_dir: Path) -> None:
    """The paths `--print0` prints are exactly the plan's, NUL-terminated; `xargs -0 rm -rf` removes those dirs
    and only those, and the save dir keeps a complete checkpoint that a new plan deletes nothing more from."""
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "retain", str(run_dir), "--keep-last", "1",
                        "--print0"], capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith(b"\0")
    paths = r.stdout.decode().split("\0")[:-1]
    assert paths == [str((run_dir / n).resolve()) for n in ("iter_0000001", "iter_0000002")]
    assert b"CK505" in r.stderr  # the tracker check's warning (iter 4 newer than the tracker) goes to stderr
    assert all(Path(p).is_dir() for p in paths)  # the plan deleted nothing itself
    subprocess.run(["xargs", "-0", "rm", "-rf"], input=r.stdout, check=True, timeout=60)
    assert sorted(p.name for p in run_dir.iterdir()) == ["iter_0000003", "iter_0000004",
                                                          "latest_checkpointed_iteration.txt"]
    again = runner.invoke(app, ["retain", str(run_dir), "--keep-last", "1", "-o", "json"])
    assert json.loads(again.stdout)["delete"] == []


def test_print0_with_nothing_to_delete_prints_nothing(run_dir: Path) -> None:
    r = runner.invoke(app, ["retain", str(run_dir), "--keep-last", "4", "--print0"])
    assert r.exit_code == 0 and r.stdout == ""


def test_text_output(run_dir: Path) -> None:
    r = runner.invoke(app, ["retain", str(run_dir), "--keep-last", "1"], env={"CKPTINSPECT_WIDTH": "200"})
    assert r.exit_code == 0, r.output
    assert "2 iteration dir(s) could be deleted, 2 kept; nothing was deleted" in r.stdout
    assert "tracked, resume-pick" in r.stdout and "delete" in r.stdout


def test_exit_codes(tmp_path: Path, run_dir: Path) -> None:
    broken = _save_dir(tmp_path / "broken", 2, "2")
    for k in (1, 2):
        (broken / f"iter_{k:07d}" / "metadata.json").unlink()
    r = runner.invoke(app, ["retain", str(broken), "--keep-last", "1", "-o", "json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["delete"] == []  # CK520
    assert runner.invoke(app, ["retain", str(broken), "--keep-last", "1", "--fail-on", "never"]).exit_code == 0
    assert runner.invoke(app, ["retain", str(run_dir), "--keep-last", "1", "--keep", "99",
                               "--fail-on", "warning"]).exit_code == 1  # CK523 (and CK505)
    usage = [["retain", str(run_dir)], ["retain", str(run_dir), "--keep-last", "-1"],
             ["retain", str(run_dir), "--keep-last", "1", "--keep-every", "0"],
             ["retain", str(run_dir), "--keep-last", "1", "--print0", "-o", "json"],
             ["retain", str(run_dir / "iter_0000001"), "--keep-last", "1"],
             ["retain", str(tmp_path / "nowhere"), "--keep-last", "1"],
             ["retain", str(run_dir), "--keep-last", "1", "-o", "sarif"]]
    for args in usage:
        assert runner.invoke(app, args).exit_code == 2, args


def test_the_schema_knows_every_reason() -> None:
    schema = validator("retain").schema
    reasons = schema["properties"]["keep"]["items"]["properties"]["reasons"]["items"]["enum"]
    assert reasons == [r.value for r in Reason]
