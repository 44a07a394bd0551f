"""A legacy (`--ckpt-format torch`) save in progress, and a tracker being written, are `incomplete`, never `corrupt`
(issue 25 §1, `formats/inflight.py`).

Evidence: a real megatron-core 0.16.1 legacy save at world size 1 (`tools/_mcore_cpu._save_legacy`: `mp_rank_00/`,
`distrib_optim.pt` through the DistributedOptimizer's `save_parameter_state`, then `model_optim_rng.pt` with
`torch.save`; the tracker last), iteration 1 finished and tracked, iteration 2 stopped from the outside at chosen
points (`tests/live_save.py`, `tools/_write_gate.py`); the last stop is inside the tracker write (opened with
`open('w')`, nothing written yet: empty). The stopped dirs are copied (times kept) for the stale side of the age rule.

On the code before this change stops 0-3 read `corrupt` (CK110 shard dir without model_optim_rng.pt, CK206 cut
`.pt`) and the empty tracker `corrupt` (CK502).
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
from ckptinspect.formats.inflight import GRACE_ENV
from live_save import GatedSave, observe_each_stop

IT1, IT2 = "iter_0000001", "iter_0000002"
TRACKER = "latest_checkpointed_iteration.txt"
SHARD = f"{IT2}/mp_rank_00"
# (file name regex, at: None = before the file is created, N = after N bytes, the code the save dir shows)
STOPS: tuple[tuple[str, int | None, str], ...] = (
    (r"^distrib_optim\.pt$", None, "CK132"),  # mp_rank_00/ made, nothing in it
    (r"^distrib_optim\.pt$", 1000, "CK132"),  # the optimizer state cut after 1000 bytes
    (r"^model_optim_rng\.pt$", None, "CK132"),  # distrib_optim.pt whole, no model file yet
    (r"^model_optim_rng\.pt$", 2000, "CK132"),  # the model file cut after 2000 bytes
    (r"^latest_checkpointed_iteration\.txt$", 0, "CK133"),  # the tracker opened with open('w'): empty
)


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, [*args, "-o", "json"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, json.loads(r.stdout)


def _codes(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"]}


def _observe(save: Path) -> dict[str, Any]:
    ls_rc, ls = _cli("ls", str(save))
    out: dict[str, Any] = {"ls_rc": ls_rc, "ls": {r["name"]: r for r in ls["iterations"]}, "ls_findings": ls["findings"]}
    out["audit_rc"], out["audit"] = _cli("audit", str(save))
    out["all_rc"], out["all"] = _cli("audit", str(save), "--all")
    out["it_rc"], out["it"] = _cli("audit", str(save / IT2))
    out["others"] = {" ".join(a): _cli(*a)[0] for a in (("sniff", str(save)), ("scan", str(save)),
                                                      ("info", str(save / IT2)), ("scan", str(save / IT2)))}
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")
    root = tmp_path_factory.mktemp("legacy_stopped")
    save = GatedSave(root / "save", root / "gate", [(n, at) for n, at, _ in STOPS], msc=False,
                     format="legacy").start()
    return root, observe_each_stop(save, len(STOPS), _observe, keep_root=root, timeout=300)


@pytest.mark.slow
def test_every_stop_of_a_legacy_save_reads_incomplete(stopped: tuple[Path, list[dict[str, Any]]]) -> None:
    _, seen = stopped
    for (name, at, expect), obs in zip(STOPS, seen):
        where = f"stop {name} at {at}"
        assert obs["ls"][IT1]["status"] == "complete", where
        assert set(obs["others"].values()) <= {0, 1}, (where, obs["others"])
        if expect == "CK132":
            row = obs["ls"][IT2]
            assert row["status"] == "incomplete" and "CK132" in row["codes"], (where, row)
            assert not {"CK110", "CK111", "CK206"} & set(row["codes"]), (where, row)
            (f,) = [f for f in obs["ls_findings"] if f["code"] == "CK506"]
            assert f["details"]["in_progress"] is True and "being written" in f["message"], where
            assert (obs["audit"]["status"], obs["audit_rc"]) == ("complete", 0), (where, obs["audit"]["findings"])
            assert (obs["all"]["status"], obs["all_rc"]) == ("incomplete", 1), where
            assert obs["it"]["status"] == "incomplete" and "CK132" in _codes(obs["it"]), where
        else:  # the tracker being written: which iteration a resume picks is not known yet
            assert obs["ls"][IT2]["status"] == "complete", where
            assert (obs["audit"]["status"], obs["audit_rc"]) == ("incomplete", 1), where
            assert "CK133" in _codes(obs["audit"]) and "CK502" not in _codes(obs["audit"]), where
    final = seen[-1]
    assert final["ls"][IT2]["status"] == "complete" and final["ls"][IT2]["tracked"] is True
    assert (final["audit"]["status"], final["audit_rc"]) == ("complete", 0)


def _age(tree: Path, seconds: float) -> None:
    """Make `tree` and everything in it `seconds` older: what time does to a crash leftover."""
    t = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t))
    os.utime(tree, (t, t))


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "stale_code"), [(0, "CK110"), (1, "CK206"), (2, "CK110"), (3, "CK206")])
def test_legacy_age_rule_both_sides(stopped: tuple[Path, list[dict[str, Any]]], stop: int, stale_code: str,
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh: a save being written (CK132, with the age rule's verdict). Older than the grace, or the grace set to 0:
    a crash leftover, corrupt as before (CK110 / CK206)."""
    root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / f"state{stop}", save, symlinks=True)
    _age(save / IT2, 0)
    _, fresh = _cli("audit", str(save / IT2))
    assert fresh["status"] == "incomplete" and "CK132" in _codes(fresh) and stale_code not in _codes(fresh)
    cut = [f for f in fresh["findings"] if f["code"] == "CK132" and f["details"].get("read_error")]
    assert all(f["details"]["in_progress"] is True for f in cut) and (stale_code != "CK206" or cut)
    _age(save / IT2, 121)
    _, old = _cli("audit", str(save / IT2))
    assert old["status"] == "corrupt" and stale_code in _codes(old) and "CK132" not in _codes(old)
    _age(save / IT2, 0)
    monkeypatch.setenv(GRACE_ENV, "0")
    _, zero = _cli("audit", str(save / IT2))
    assert zero["status"] == "corrupt" and "CK132" not in _codes(zero)


@pytest.mark.slow
def test_a_cut_file_in_the_tracked_legacy_iteration_is_corrupt(stopped: tuple[Path, list[dict[str, Any]]],
                                                              tmp_path: Path) -> None:
    """The tracker is written after every shard file: a cut file in the tracked iteration was whole once."""
    root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / "save", save)  # the finished save: tracker = 2, files fresh
    f = save / SHARD / "model_optim_rng.pt"
    f.write_bytes(f.read_bytes()[:2000])
    code, doc = _cli("audit", str(save))
    assert doc["status"] == "corrupt" and code == 1
    assert "CK206" in _codes(doc) and "CK132" not in _codes(doc)


@pytest.mark.slow
def test_tracker_age_rule_both_sides(stopped: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty tracker modified within the grace is being written (CK133, incomplete); older, it is unparseable
    (CK502, corrupt), as before."""
    root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / f"state{len(STOPS) - 1}", save, symlinks=True)
    tracker = save / TRACKER
    assert tracker.read_bytes() == b""
    os.utime(tracker)
    _, fresh = _cli("audit", str(save))
    assert fresh["status"] == "incomplete" and "CK133" in _codes(fresh) and "CK502" not in _codes(fresh)
    (f,) = [f for f in fresh["findings"] if f["code"] == "CK133"]
    assert f["subject"] == TRACKER and f["details"]["grace_seconds"] == 120.0
    t = time.time() - 121
    os.utime(tracker, (t, t))
    _, old = _cli("audit", str(save))
    assert old["status"] == "corrupt" and "CK502" in _codes(old) and "CK133" not in _codes(old)
    os.utime(tracker)
    monkeypatch.setenv(GRACE_ENV, "0")
    _, zero = _cli("audit", str(save))
    assert "CK502" in _codes(zero) and "CK133" not in _codes(zero)
    tracker.write_text(" ")  # not empty: whatever its age, Megatron wrote something that is no number
    monkeypatch.delenv(GRACE_ENV)
    _, ws = _cli("audit", str(save))
    assert "CK502" in _codes(ws)
