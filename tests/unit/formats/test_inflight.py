"""A save in progress is `incomplete`, never `corrupt` or `unrecognized` (issue 25 §1).

Evidence: real megatron-core 0.16.1 saves (world size 1: iteration 1 finished and tracked, iteration 2 being
written) stopped from the outside at chosen points of Megatron's write order (`tests/support/live_save.py`,
`tools/_write_gate.py`: the writing process stops itself with SIGSTOP at a file's open or after N of its bytes),
once through multistorageclient (megatron-core's default when the package is installed: every file is written as
`.<name>.tmp` and renamed) and once with Megatron-LM's `--disable-msc` (plain `open()`, the `metadata.json` of the
issue). At every stop `ls` and `audit` run on the real, stopped save dir, and the dir is copied (times kept) for
the age-rule tests. `test_live_poll.py` runs the same save slowed down under a poller.

On the code before this change the stops read: empty dir, cut `common.pt`, MSC `.distcp` temps → `unrecognized`
(CK100) with no CK506; a cut `metadata.json` → `corrupt` (CK104) with no CK506; MSC's `..metadata.tmp` → CK102.
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

import ckptinspect
from ckptinspect.cli.app import app
from ckptinspect.formats.inflight import GRACE_ENV, cut_json, megatron_iteration
from conftest import SAMPLES
from live_save import GatedSave, observe_each_stop

IT1, IT2 = "iter_0000001", "iter_0000002"

# (stop: file name regex, at: None = before the file is created, N = after N bytes) -> the code iteration 2 shows
PLAIN_STOPS: tuple[tuple[str, int | None, str], ...] = (
    (r"^common\.pt$", None, "CK130"),  # rank 0 made the dir, nothing written yet
    (r"^common\.pt$", 1000, "CK130"),  # common.pt cut after 1000 of its ~3300 bytes
    (r"^__0_0\.distcp$", 4096, "CK102"),  # a data file being written, no .metadata
    (r"^\.metadata\.tmp$", 500, "CK103"),  # torch's FileSystemWriter.finish writing .metadata.tmp
    (r"^metadata\.json$", None, "CK101"),  # .metadata renamed into place, no marker yet
    (r"^metadata\.json$", 40, "CK131"),  # the marker cut by the plain open('w') + json.dump
    (r"^latest_checkpointed_iteration\.txt$", None, "complete"),  # finished, not tracked yet (CK505)
)
MSC_STOPS: tuple[tuple[str, int | None, str], ...] = (
    (r"^\.common\.pt\.tmp$", None, "CK130"),
    (r"^\.common\.pt\.tmp$", 1000, "CK130"),
    (r"^\.__0_0\.distcp\.tmp$", 4096, "CK102"),  # MSC's temp of a data file
    (r"^\.\.metadata\.tmp$", 500, "CK103"),  # MSC's temp of .metadata
    (r"^\.metadata\.json\.tmp$", None, "CK101"),
    (r"^\.metadata\.json\.tmp$", 40, "CK101"),  # MSC writes the marker atomically: never seen cut
    (r"^latest_checkpointed_iteration\.txt$", None, "complete"),
)
MODES = {"plain": (False, PLAIN_STOPS), "msc": (True, MSC_STOPS)}


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, [*args, "-o", "json"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, json.loads(r.stdout)


def _observe(save: Path) -> dict[str, Any]:
    """What `ls` and `audit` say about the save dir right now."""
    ls_rc, ls = _cli("ls", str(save))
    audit_rc, audit = _cli("audit", str(save))
    all_rc, audit_all = _cli("audit", str(save), "--all")
    # every other read command, on the save dir and on the iteration being written: none may fail
    others = {" ".join(args): _cli(*args)[0] for args in (("sniff", str(save)), ("scan", str(save)),
                                                         ("info", str(save / IT2)), ("scan", str(save / IT2)),
                                                         ("sniff", str(save / IT2)), ("audit", str(save / IT2)))}
    return {"ls_rc": ls_rc, "ls": {r["name"]: r for r in ls["iterations"]}, "ls_findings": ls["findings"],
            "audit_rc": audit_rc, "audit": audit, "all_rc": all_rc, "all": audit_all, "others": others,
            "files": sorted(p.name for p in (save / IT2).iterdir()) if (save / IT2).is_dir() else None}


def _stopped_save(root: Path, msc: bool, stops: tuple[tuple[str, int | None, str], ...]) -> list[dict[str, Any]]:
    save = GatedSave(root / "save", root / "gate", [(name, at) for name, at, _ in stops], msc=msc).start()
    return observe_each_stop(save, len(stops), _observe, keep_root=root)


@pytest.fixture(scope="module", params=list(MODES))
def stopped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[Any]]:
    pytest.importorskip("megatron.core", reason="megatron-core (test extra) not installed")
    msc, stops = MODES[request.param]
    if msc:
        pytest.importorskip("multistorageclient", reason="multistorageclient (test extra) not installed")
    root = tmp_path_factory.mktemp(f"stopped_{request.param}")
    return request.param, root, _stopped_save(root, msc, stops)



@pytest.mark.live
def test_every_stop_of_the_save_reads_incomplete_and_the_tracked_one_complete(
        stopped: tuple[str, Path, list[Any]]) -> None:
    mode, _, seen = stopped
    stops = MODES[mode][1]
    for (name, at, expect), obs in zip(stops, seen):
        where = f"{mode} stop {name} at {at}: files {obs['files']}"
        row = obs["ls"][IT2]
        assert obs["ls"][IT1]["status"] == "complete", where
        if expect == "complete":
            assert row["status"] == "complete", where
            assert "CK505" in {f["code"] for f in obs["ls_findings"]}, where
        else:
            assert row["status"] == "incomplete" and expect in row["codes"], (where, row)
            (f,) = [f for f in obs["ls_findings"] if f["code"] == "CK506"]
            assert f["subject"] == IT2 and f["details"]["in_progress"] is True and "being written" in f["message"]
        audit = obs["audit"]
        assert audit["status"] == "complete" and obs["audit_rc"] == 0, (where, audit["findings"])
        assert obs["ls_rc"] == 0, where  # CK505 / CK506 are warnings
        assert set(obs["others"].values()) <= {0, 1}, (where, obs["others"])
        # --all: every iteration decides, and the status says what the exit code says
        assert (obs["all"]["status"], obs["all_rc"]) == (("complete", 0) if expect == "complete"
                                                         else ("incomplete", 1)), where
    final = seen[-1]
    assert final["ls"][IT2]["status"] == final["ls"][IT1]["status"] == "complete"
    assert final["ls"][IT2]["tracked"] is True and final["audit"]["picked"] == IT2


@pytest.mark.live
def test_the_new_code_carries_the_age_rule(stopped: tuple[str, Path, list[Any]]) -> None:
    mode, _, seen = stopped
    for (name, at, expect), obs in zip(MODES[mode][1], seen):
        if expect in ("CK130", "CK131"):
            (f,) = [f for c in obs["audit"]["checkpoints"] if c["name"] == IT2 for f in c["findings"]
                    if f["code"] == expect]
            assert f["details"]["in_progress"] is True and f["details"]["superseded"] is False
            assert f["details"]["grace_seconds"] == 120.0


def _age(tree: Path, seconds: float) -> None:
    """Make every entry of `tree` (and `tree`) `seconds` older: what time does to a crash leftover."""
    t = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in filenames:
            os.utime(os.path.join(dirpath, n), (t, t))
    os.utime(tree, (t, t))


def _ck506(save: Path) -> dict[str, Any]:
    _, ls = _cli("ls", str(save))
    (f,) = [f for f in ls["findings"] if f["code"] == "CK506"]
    return f


@pytest.mark.live
@pytest.mark.parametrize("stop", [0, 1, 5])
def test_age_rule_both_sides(stopped: tuple[str, Path, list[Any]], stop: int, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh: being written. Older than the grace (120 s), the grace set to 0, or the tracker naming a later
    iteration: a crash leftover. The status is `incomplete` on both sides; only the verdict in the details and the
    message change."""
    mode, root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / f"state{stop}", save, symlinks=True)
    _age(save / IT2, 0)  # copied just now: fresh whatever the copy kept
    fresh = _ck506(save)
    assert fresh["details"]["in_progress"] is True and "being written" in fresh["message"]
    _age(save / IT2, 121)
    old = _ck506(save)
    assert old["details"]["in_progress"] is False and "crash leftover" in old["message"]
    assert old["details"]["newest_mtime"] < fresh["details"]["newest_mtime"] - 120
    code, doc = _cli("ls", str(save))
    assert doc["iterations"][1]["status"] == "incomplete" and code == 0

    _age(save / IT2, 0)
    monkeypatch.setenv(GRACE_ENV, "0")
    assert _ck506(save)["details"]["in_progress"] is False
    monkeypatch.setenv(GRACE_ENV, "not a number")  # ignored: the default grace
    assert _ck506(save)["details"]["grace_seconds"] == 120.0
    monkeypatch.delenv(GRACE_ENV)

    # the tracker names a later iteration (Megatron finalizes in save order): this save will never finish
    shutil.copytree(save / IT1, save / "iter_0000003")
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    later = _ck506(save)
    assert later["details"]["superseded"] is True and later["details"]["in_progress"] is False
    assert "the tracker names a later iteration" in later["message"]


@pytest.mark.live
def test_a_cut_marker_in_the_tracked_iteration_is_corrupt(stopped: tuple[str, Path, list[Any]],
                                                          tmp_path: Path) -> None:
    """The tracker is written after metadata.json: a cut marker in the tracked iteration was whole once."""
    mode, root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / "save", save)  # the finished save: tracker = 2
    marker = save / IT2 / "metadata.json"
    marker.write_bytes(marker.read_bytes()[:40])
    code, doc = _cli("audit", str(save))
    assert doc["status"] == "corrupt" and code == 1
    assert "CK104" in {f["code"] for f in doc["findings"]} and "CK131" not in {f["code"] for f in doc["findings"]}


@pytest.mark.live
def test_an_iteration_dir_pointed_at_directly(stopped: tuple[str, Path, list[Any]], tmp_path: Path) -> None:
    """An empty `iter_{N:07d}` is Megatron's when its parent holds the tracker; moved out of the save dir, or named
    otherwise, it is no checkpoint."""
    mode, root, _ = stopped
    state = root / "state0"
    code, doc = _cli("audit", str(state / IT2))
    assert doc["status"] == "incomplete" and {f["code"] for f in doc["findings"]} >= {"CK130"}
    lone = tmp_path / IT2
    lone.mkdir()
    code, doc = _cli("audit", str(lone))
    assert doc["status"] == "unrecognized" and code == 1


# --- without a save: the naming rule and the cut-JSON test -------------------------------------------------------


def test_megatron_iteration_names(tmp_path: Path) -> None:
    save = tmp_path / "save"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("1")
    for name, n in (("iter_0000005", 5), ("iter_12345678", 12345678), ("iter_5", None), ("iter_00000005", None),
                    ("release", None), ("step-5", None), ("iter_000000x", None)):
        (save / name).mkdir()
        assert megatron_iteration(save / name, False) == n, name
        assert megatron_iteration(save / name, True) == n, name
    other = tmp_path / "other"
    (other / "iter_0000005").mkdir(parents=True)
    assert megatron_iteration(other / "iter_0000005", False) is None  # no tracker beside it
    assert megatron_iteration(other / "iter_0000005", True) == 5  # read through a Megatron save dir


def test_cut_json_is_every_proper_prefix_of_a_marker_and_nothing_else() -> None:
    for sample in ("torch_dist", "mcore_0_19_2"):
        marker = next((SAMPLES / sample).glob("iter_*/metadata.json")).read_bytes()
        assert not cut_json(marker)
        assert all(cut_json(marker[:i]) for i in range(len(marker))), sample
    for data in (b"\x00\x01garbage", b"}", b'{"a" 1}', b'{"a": 1}}', b"PK\x03\x04", b'[1, 2]x',
                 b'{"sharded_backend": "torch_dist"}', b'{"a": tx', b"\xff\xfe"):
        assert not cut_json(data), data
    text = '{"a": [1.5e+3, true, null, "x\\u00e9\\n", {"b": -2}], "c": false}'.encode()
    assert all(cut_json(text[:i]) for i in range(len(text))) and not cut_json(text)
    utf8 = '{"name": "é"}'.encode()
    assert cut_json(utf8[:11])  # a two-byte character cut after its first byte


# --- a save that moves on while one audit runs ----------------------------------------------------------------
# The poller of test_live_poll.py once read `corrupt` on a busy machine: sniffed while metadata.json did not exist
# yet (CK101), read after rank 0 had begun writing it (the reader's CK104). These replay each such step on the
# real stopped states: the next state's file appears between the sniff's check and the read that follows.


@pytest.mark.live
def test_marker_begun_between_sniff_and_read(stopped: tuple[str, Path, list[Any]], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    mode, root, _ = stopped
    if mode != "plain":
        pytest.skip("through multistorageclient metadata.json is renamed into place whole: no cut marker to meet")
    save = tmp_path / "save"
    shutil.copytree(root / "state4", save)  # .metadata, no metadata.json yet
    cut = (root / "state5" / IT2 / "metadata.json").read_bytes()
    import ckptinspect.formats.torch_dist as torch_dist

    real = torch_dist.read_metadata_json

    def begun(path: Path) -> Any:
        if path.name == IT2 and not (path / "metadata.json").exists():
            (path / "metadata.json").write_bytes(cut)
        return real(path)

    monkeypatch.setattr(torch_dist, "read_metadata_json", begun)
    a = ckptinspect.audit(save / IT2)
    codes = {f.code for f in a.findings}
    assert a.status.value == "incomplete" and "CK101" in codes and "CK104" not in codes, codes


@pytest.mark.live
def test_data_file_begun_between_two_checks(stopped: tuple[str, Path, list[Any]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mode, root, _ = stopped
    save = tmp_path / "save"
    shutil.copytree(root / "state1", save)
    for p in (save / IT2).iterdir():
        p.unlink()
    shutil.copy2(root / "state2" / IT2 / "common.pt", save / IT2)  # common.pt closed, no data file yet
    data = next(p for p in sorted((root / "state2" / IT2).iterdir()) if p.name.endswith((".distcp", ".distcp.tmp")))
    import ckptinspect.formats.sniff as sniff

    real = sniff._has_data_files

    def begun(path: Path) -> bool:
        found = real(path)
        if path.name == IT2 and not (path / data.name).exists():
            shutil.copy2(data, path / data.name)  # the first data file appears right after the check
        return found

    monkeypatch.setattr(sniff, "_has_data_files", begun)
    code, ls = _cli("ls", str(save))
    row = {r["name"]: r for r in ls["iterations"]}[IT2]
    assert row["status"] == "incomplete" and "CK102" in row["codes"], row  # sniffed again: not CK100
