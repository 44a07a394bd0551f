"""`retain`: the retention plan on real save dirs, built from real iteration dirs.

Every save dir here is made of copies of real megatron-core iterations (`torch_dist/iter_0000001`, a 0.16.1 TP2 ×
PP2 × DP2 save; `mcore_0_19_2/iter_0000400`, a 0.19.2 save with `integrity.json`), real Bridge / torchtitan / NeMo 2
save dirs, and damage a crash leaves (a `metadata.json` or a `.distcp` missing). Times are set explicitly: every
file is backdated an hour (a crash leftover by the age rule) unless a test makes a save look in flight. Every test
also checks that the plan left every file of the save dir as it was (bytes, size, modification time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import ckptinspect
from ckptinspect.commands.retain import Reason, RetainPlan, RetainPolicy, plan_retention, read_facts
from ckptinspect.errors import UsageError
from ckptinspect.findings import Status
from conftest import SAMPLES

TORCH_DIST = SAMPLES / "torch_dist" / "iter_0000001"
WITH_MANIFEST = SAMPLES / "mcore_0_19_2" / "iter_0000400"
TRACKER = "latest_checkpointed_iteration.txt"
OLD = time.time() - 3600


@pytest.fixture(autouse=True)
def _grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTINSPECT_WRITE_GRACE_SECONDS", "120")


def _walk(root: Path) -> Iterator[Path]:
    yield root
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            yield Path(dirpath) / n


def _touch_all(root: Path, when: float) -> None:
    for p in sorted(_walk(root), key=lambda p: -len(p.parts)):  # files before their dirs
        os.utime(p, (when, when), follow_symlinks=False)


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and dir under `root`: size, modification time (ns), SHA-256 of a file's bytes."""
    out = {}
    for p in _walk(root):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return out


def _save_dir(root: Path, iterations: dict[int, Path], tracker: str | None) -> Path:
    """A save dir of real iteration dirs (`{n: source}`), all backdated an hour, with `tracker` as its text."""
    root.mkdir()
    for n, src in iterations.items():
        shutil.copytree(src, root / f"iter_{n:07d}")
    if tracker is not None:
        (root / TRACKER).write_text(tracker)
    _touch_all(root, OLD)
    return root


def _plan(root: Path, keep_last: int, keep_every: int | None = None, keep: tuple[int | str, ...] = (),
          hash_files: bool = False) -> RetainPlan:
    """The plan of `root`, checked to have modified nothing under it."""
    before = _snapshot(root)
    plan = ckptinspect.retain(root, keep_last=keep_last, keep_every=keep_every, keep=keep,
                              hash_files=hash_files).report
    assert _snapshot(root) == before, "retain modified the save dir"
    return plan


def _reasons(plan: RetainPlan) -> dict[str, tuple[str, ...]]:
    return {k.name: tuple(r.value for r in k.reasons) for k in plan.keep}


def _codes(plan: RetainPlan) -> list[str]:
    return [f.code for f in plan.findings]


def _name(n: int) -> str:
    return f"iter_{n:07d}"


def test_keep_last_deletes_the_older_complete_iterations(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 6)}, "5")
    plan = _plan(root, keep_last=2)
    assert plan.delete == (_name(1), _name(2), _name(3))
    assert _reasons(plan) == {_name(4): ("keep-last",),
                              _name(5): ("tracked", "resume-pick", "newest-complete", "keep-last")}
    assert plan.delete_paths == tuple(str((root / n).resolve()) for n in plan.delete)
    assert plan.status is Status.COMPLETE and plan.findings == ()


def test_the_tracker_target_is_kept_when_it_is_older_than_the_newest(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 5)}, "2")
    plan = _plan(root, keep_last=1)
    assert _name(2) not in plan.delete
    assert plan.delete == (_name(1), _name(3))
    assert _reasons(plan) == {_name(2): ("tracked", "resume-pick"), _name(4): ("newest-complete", "keep-last")}
    assert _codes(plan) == ["CK505", "CK505"]  # the tracker check's: complete iterations newer than the tracker


def test_an_unfinished_newest_save_is_kept_and_never_counts_as_complete(tmp_path: Path) -> None:
    """The newest iteration lost its `metadata.json` (a save stopped before its final marker): an hour old, it is
    still newer than the tracker's target and every complete one, so an async save may await its finalize."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 5)}, "3")
    (root / _name(4) / "metadata.json").unlink()
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=1)
    assert plan.delete == (_name(1), _name(2))
    assert _reasons(plan) == {_name(3): ("tracked", "resume-pick", "newest-complete", "keep-last"),
                              _name(4): ("in-flight",)}
    ck522 = [f for f in plan.findings if f.code == "CK522"]
    assert [(f.subject, f.details["why"]) for f in ck522] == [(_name(4), "awaiting-finalize")]
    assert ck522[0].details["in_progress"] is False


def test_an_unfinished_save_older_than_a_complete_one_is_a_crash_leftover(tmp_path: Path) -> None:
    """An iteration with a `.distcp` missing (corrupt) below the tracked one, an hour old: deleted."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "3")
    (root / _name(2) / "__3_1.distcp").unlink()
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=5)
    assert plan.delete == (_name(2),)
    assert _reasons(plan) == {_name(1): ("keep-last",),
                              _name(3): ("tracked", "resume-pick", "newest-complete", "keep-last")}


def test_a_save_being_written_is_kept_whatever_its_place(tmp_path: Path) -> None:
    """Data files without `.metadata` and fresh modification times: a save being written (recent writes), kept
    even below the newest complete iteration; the same dir an hour old is a crash leftover and goes, and so does
    a fresh one once the tracker names a later iteration (the age rule's clock-free witness)."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 5)}, "1")
    for marker in (".metadata", "metadata.json"):
        (root / _name(2) / marker).unlink()
    _touch_all(root / _name(2), time.time())
    plan = _plan(root, keep_last=1)
    assert plan.delete == (_name(3),)
    assert _reasons(plan)[_name(2)] == ("in-flight",)
    assert [f.details["why"] for f in plan.findings if f.code == "CK522"] == ["recent-writes"]
    _touch_all(root, OLD)
    assert _plan(root, keep_last=1).delete == (_name(2), _name(3))
    (root / TRACKER).write_text("4")
    _touch_all(root / _name(2), time.time())
    assert _plan(root, keep_last=1).delete == (_name(1), _name(2), _name(3))


def test_a_fresh_save_above_the_tracker_is_in_flight(tmp_path: Path) -> None:
    """The newest dir holds only `common.pt`, written a moment ago (CK130): in flight by its writes."""
    root = _save_dir(tmp_path / "run", {1: TORCH_DIST, 2: TORCH_DIST}, "2")
    (root / _name(3)).mkdir()
    shutil.copy2(TORCH_DIST / "common.pt", root / _name(3) / "common.pt")
    _touch_all(root / _name(3), time.time())
    plan = _plan(root, keep_last=0)
    assert plan.delete == (_name(1),)
    assert _reasons(plan) == {_name(2): ("tracked", "resume-pick", "newest-complete"), _name(3): ("in-flight",)}
    assert [f.details["why"] for f in plan.findings if f.code == "CK522"] == ["recent-writes"]


def test_keep_names_milestones_and_a_missing_one_is_reported(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 5)}, "4")
    plan = _plan(root, keep_last=1, keep=(1, "iter_0000002", 7))
    assert plan.delete == (_name(3),)
    assert _reasons(plan)[_name(1)] == ("milestone",) and _reasons(plan)[_name(2)] == ("milestone",)
    missing = [f for f in plan.findings if f.code == "CK523"]
    assert [(f.subject, f.details["keep"]) for f in missing] == [("7", 7)]
    assert plan.status is Status.COMPLETE  # a warning: the exit code follows --fail-on
    r = ckptinspect.retain(root, keep_last=1, keep=("7",))
    assert r.exit_code("error") == 0 and r.exit_code("warning") == 1


def test_keep_every_keeps_the_multiples(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 7)}, "6")
    plan = _plan(root, keep_last=1, keep_every=2)
    assert plan.delete == (_name(1), _name(3), _name(5))
    assert _reasons(plan) == {_name(2): ("keep-every",), _name(4): ("keep-every",),
                              _name(6): ("tracked", "resume-pick", "newest-complete", "keep-last", "keep-every")}


def test_the_only_complete_checkpoint_is_old_and_the_tracker_names_a_broken_one(tmp_path: Path) -> None:
    """iter 1 is the only complete one; 2 and 3 lost `.metadata`, 4 (tracked) lost `metadata.json`: 1 is kept
    although `--keep-last 0`, the tracked 4 is kept (CK504, CK521), the leftovers below the tracker go."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 5)}, "4")
    for n in (2, 3):
        (root / _name(n) / ".metadata").unlink()
    (root / _name(4) / "metadata.json").unlink()
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=0)
    assert _name(1) not in plan.delete and _name(4) not in plan.delete
    assert plan.delete == (_name(2), _name(3))
    assert _reasons(plan) == {_name(1): ("newest-complete",), _name(4): ("tracked", "resume-pick")}
    ck521 = [f for f in plan.findings if f.code == "CK521"]
    assert [(f.subject, f.details["status"]) for f in ck521] == [(_name(4), "incomplete")]
    assert "CK504" in _codes(plan)


def test_no_complete_checkpoint_deletes_nothing(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "3")
    for n in (1, 2, 3):
        (root / _name(n) / "metadata.json").unlink()
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=0)
    assert plan.delete == ()
    assert all(Reason.NO_COMPLETE_CHECKPOINT in k.reasons for k in plan.keep) and len(plan.keep) == 3
    assert "CK520" in _codes(plan)
    assert ckptinspect.retain(root, keep_last=0).exit_code() == 1
    (root / TRACKER).unlink()  # no tracker either: CK520 alone says the dir holds nothing complete
    plan = _plan(root, keep_last=0)
    assert plan.delete == () and plan.status is Status.INCOMPLETE
    assert [c for c in _codes(plan) if c in ("CK520", "CK521", "CK523")] == ["CK520"]


def test_an_unparseable_tracker_deletes_nothing(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "two")
    plan = _plan(root, keep_last=1)
    assert plan.delete == ()
    assert {k.name for k in plan.keep if Reason.TRACKER_UNKNOWN in k.reasons} == {_name(1), _name(2), _name(3)}
    assert _codes(plan)[:2] == ["CK502", "CK521"]


def test_every_dir_of_the_tracked_iteration_is_kept(tmp_path: Path) -> None:
    """A stray `iter_3` beside Megatron's `iter_0000003`: both are iteration 3, the tracker's; neither goes."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "3")
    shutil.copytree(TORCH_DIST, root / "iter_3")
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=1)
    assert plan.delete == (_name(1), _name(2))
    assert {n for n, r in _reasons(plan).items() if "tracked" in r} == {"iter_3", _name(3)}


def test_a_tracker_being_written_deletes_nothing(tmp_path: Path) -> None:
    """An empty tracker modified a moment ago: Megatron is writing it (CK133), its target is not known yet."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "")
    os.utime(root / TRACKER)
    plan = _plan(root, keep_last=1)
    assert plan.delete == () and plan.tracker.value == "unknown"
    assert _codes(plan)[:2] == ["CK133", "CK521"]
    os.utime(root / TRACKER, (OLD, OLD))  # an empty tracker an hour old is unparseable (CK502): still unknown
    assert _plan(root, keep_last=1).delete == ()


def test_a_tracker_naming_a_missing_iteration_keeps_the_newest_complete(tmp_path: Path) -> None:
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "9")
    plan = _plan(root, keep_last=1)
    assert plan.delete == (_name(1), _name(2))
    assert _reasons(plan) == {_name(3): ("newest-complete", "keep-last")}
    assert [(f.code, f.subject) for f in plan.findings if f.code in ("CK503", "CK521")] == [
        ("CK503", _name(9)), ("CK521", _name(9))]


def _flip_tensor_byte(ckpt: Path) -> None:
    """Change one byte inside a tensor's stored item (same size): only hashing can tell."""
    item = ckptinspect.read(ckpt).tensors[0].chunks[0].storage
    f = ckpt / item.file
    data = bytearray(f.read_bytes())
    data[item.offset + item.length // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def test_a_manifest_that_disagrees_under_hash_makes_the_newest_not_complete(tmp_path: Path) -> None:
    """iter 600's manifest lists a file whose bytes changed: at metadata level it counts as complete (and 500 is
    deleted); with `--hash` it is corrupt, so 500 is the newest complete one and stays (600 stays as a save that
    may await its finalize: it is newer than the tracker's target and every complete one)."""
    root = _save_dir(tmp_path / "run", {n: WITH_MANIFEST for n in (400, 500, 600)}, "400")
    _flip_tensor_byte(root / _name(600))
    _touch_all(root, OLD)
    cheap = _plan(root, keep_last=1)
    assert cheap.delete == (_name(500),)
    assert _reasons(cheap)[_name(600)] == ("newest-complete", "keep-last")
    facts = {i.name: i for i in read_facts(root).iterations}
    assert {i.manifest.value for i in facts.values()} == {"checked"}
    hashed = _plan(root, keep_last=1, hash_files=True)
    assert hashed.delete == ()
    assert _reasons(hashed) == {_name(400): ("tracked", "resume-pick"), _name(500): ("newest-complete", "keep-last"),
                                _name(600): ("in-flight",)}
    entries = {e.name: e for e in hashed.entries}
    assert entries[_name(600)].status is Status.CORRUPT
    assert [entries[_name(n)].manifest.value for n in (400, 500, 600)] == ["hashed", "hashed", "failed"]
    assert read_facts(root, hash_files=True).iterations[-1].manifest.value == "failed"


def test_bridge_keeps_the_train_state_step(tmp_path: Path) -> None:
    root = tmp_path / "bridge"
    shutil.copytree(SAMPLES / "bridge", root)
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=1)
    assert plan.delete == (_name(1),)
    assert _reasons(plan) == {_name(2): ("tracked", "resume-pick", "newest-complete", "keep-last")}


def test_torchtitan_without_a_tracker(tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    shutil.copytree(SAMPLES / "torchtitan", root)
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=1)
    assert plan.tracker.value == "absent"
    assert plan.delete == ("step-1",)
    assert _reasons(plan) == {"step-2": ("resume-pick", "newest-complete", "keep-last")}


@pytest.mark.parametrize("sample", ["legacy", "megatron_fsdp"])
def test_other_megatron_layouts(sample: str, tmp_path: Path) -> None:
    """A legacy (`mp_rank_*`) and a Megatron FSDP (`fsdp_dtensor`) iteration, three copies each."""
    src = SAMPLES / sample / "iter_0000001"
    root = _save_dir(tmp_path / "run", {n: src for n in (1, 2, 3)}, "3")
    plan = _plan(root, keep_last=1)
    assert {e.status for e in plan.entries} == {Status.COMPLETE}
    assert plan.delete == (_name(1), _name(2))
    assert _reasons(plan) == {_name(3): ("tracked", "resume-pick", "newest-complete", "keep-last")}


def test_nemo2_checkpoints_with_an_unfinished_one(tmp_path: Path) -> None:
    """NeMo 2 `…-step=N` checkpoint dirs (copies of the real one); the newest still has NeMo's `-unfinished`
    marker: not complete, newer than every complete one, so kept as in flight; the stack's pick is step 2."""
    (src,) = (SAMPLES / "nemo2" / "checkpoints").iterdir()
    root = tmp_path / "checkpoints"
    root.mkdir()
    names = {n: src.name.replace("step=1", f"step={n}") for n in (1, 2, 3)}
    for name in names.values():
        shutil.copytree(src, root / name)
    (root / f"{names[3]}-unfinished").write_text("")
    _touch_all(root, OLD)
    plan = _plan(root, keep_last=1)
    assert plan.delete == (names[1],)
    assert _reasons(plan) == {names[2]: ("resume-pick", "newest-complete", "keep-last"), names[3]: ("in-flight",)}


def test_nemo2_single_checkpoint_is_kept() -> None:
    root = SAMPLES / "nemo2" / "checkpoints"
    plan = _plan(root, keep_last=0)
    assert plan.delete == () and len(plan.keep) == 1
    assert plan.keep[0].reasons == (Reason.RESUME_PICK, Reason.NEWEST_COMPLETE)


def test_the_sample_save_dir_keeps_its_half_written_iteration() -> None:
    """`sample_ckpts/torch_dist` itself: iter 3 has no `metadata.json` and is newer than the tracker's 2."""
    plan = _plan(SAMPLES / "torch_dist", keep_last=1)
    assert plan.delete == (_name(1),)
    assert _reasons(plan)[_name(3)] == ("in-flight",)


def test_what_is_not_a_save_dir_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not a save dir"):
        ckptinspect.retain(TORCH_DIST, keep_last=1)
    with pytest.raises(UsageError, match="NVRx"):
        ckptinspect.retain(SAMPLES / "nvrx_local", keep_last=1)
    with pytest.raises(UsageError, match="--keep-last"):
        RetainPolicy(-1)
    with pytest.raises(UsageError, match="--keep-every"):
        RetainPolicy(1, 0)


def test_the_plan_is_a_pure_function_of_the_facts(tmp_path: Path) -> None:
    """The same facts give the same plan, and a policy change needs no new read."""
    root = _save_dir(tmp_path / "run", {n: TORCH_DIST for n in range(1, 4)}, "3")
    facts = read_facts(root)
    assert plan_retention(facts, RetainPolicy(1)) == plan_retention(facts, RetainPolicy(1))
    for n in (3, 4, 5, 7):  # more than there are: every complete one is kept
        assert plan_retention(facts, RetainPolicy(n)).delete == (), n
    assert plan_retention(facts, RetainPolicy(2)).delete == (_name(1),)
    assert plan_retention(facts, RetainPolicy(0)).delete == (_name(1), _name(2))
