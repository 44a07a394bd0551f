"""`retain` polled through a real megatron-core save (issue 29 §2 "Evidence"): it never proposes deleting the only
complete checkpoint, nor the tracker's target, nor the save being written — while the save runs, and at every point
the save could have been killed.

The save (`tests/support/live_save.py`: world size 1, iteration 1 finished and tracked, iteration 2 written with
plain `open()` writes, slowed from the outside by `tools/_write_gate.py` so each step of the write order lasts) is
polled with the harshest policy, `--keep-last 0`. Each poll also copies the save dir as it stands (times kept):
that copy is what a kill at that moment leaves. Backdated an hour (a crash leftover by the age rule), each copy is
planned again: whatever iteration 2's state, some complete iteration and the tracker's target stay.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from live_save import GatedSave

IT1, IT2 = "iter_0000001", "iter_0000002"
SLOW = {"open": 0.25, r"^common\.pt$": 0.02, r"\.distcp$": 0.001, r"metadata": 0.15}
POLL_SECONDS = 0.2

pytestmark = pytest.mark.live


def _retain(save: Path) -> dict[str, Any]:
    r = CliRunner().invoke(app, ["retain", str(save), "--keep-last", "0", "-o", "json", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _safe(doc: dict[str, Any]) -> None:
    """What every plan must keep: a complete iteration, the tracker's target, an unfinished newest save."""
    keep = {k["name"]: k for k in doc["keep"]}
    assert any(k["status"] == "complete" for k in keep.values()), doc
    tracked = doc["tracker"]["iteration"]
    if isinstance(tracked, int):
        assert f"iter_{tracked:07d}" not in doc["delete"], doc
    if IT2 in keep and keep[IT2]["status"] != "complete":
        assert IT1 in keep, doc  # the only complete checkpoint


def _backdate(root: Path) -> None:
    old = time.time() - 3600
    for dirpath, _, files in os.walk(root):
        for f in files:
            os.utime(Path(dirpath) / f, (old, old))
        os.utime(dirpath, (old, old))


def test_retain_never_deletes_the_only_complete_checkpoint_of_a_live_save(tmp_path: Path) -> None:
    out = tmp_path / "save"
    save = GatedSave(out, tmp_path / "gate", slow=SLOW, msc=False).start()
    polls: list[dict[str, Any]] = []
    kills = tmp_path / "kills"
    start = time.monotonic()
    try:
        while save.running() and time.monotonic() - start < 120:
            if not (out / IT1 / "metadata.json").exists() or not (out / "latest_checkpointed_iteration.txt").exists():
                time.sleep(0.05)  # iteration 1 is not finished yet
                continue
            polls.append(_retain(out))
            try:
                shutil.copytree(out, kills / f"k{len(polls):03d}", symlinks=True)
            except (shutil.Error, FileNotFoundError):
                pass  # a file renamed away mid-copy: that moment is not captured, the next poll's is
            time.sleep(POLL_SECONDS)
        save.wait()
    finally:
        save.end()
    final = _retain(out)

    it2 = []
    for doc in polls:
        _safe(doc)
        assert IT2 not in doc["delete"], doc  # being written, then the newest complete: never deletable
        keep = {k["name"]: k for k in doc["keep"]}
        if IT2 in keep:
            it2.append(keep[IT2]["status"])
            if keep[IT2]["status"] != "complete":
                # while iteration 2 is written it is kept as in flight, and nothing at all is deleted
                assert "in-flight" in keep[IT2]["reasons"] and doc["delete"] == [], doc
    assert "incomplete" in it2, it2  # the save was seen unfinished (not vacuous)
    # once iteration 2 is tracked, iteration 1 is what --keep-last 0 deletes
    assert final["tracker"]["iteration"] == 2 and final["delete"] == [IT1], final

    states: set[str] = set()
    for k in sorted(kills.iterdir()):
        _backdate(k)
        doc = _retain(k)
        _safe(doc)
        keep = {e["name"]: e for e in doc["keep"]}
        states.add(keep[IT2]["status"] if IT2 in keep else "deleted" if IT2 in doc["delete"] else "absent")
    assert "incomplete" in states, states  # a kill mid-write was captured and planned
