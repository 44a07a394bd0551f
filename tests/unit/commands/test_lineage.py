"""Tests of `ckptinspect.commands.audit.lineage` (CK524, a stale save) on real megatron-core 0.16.1 save dirs: a run
of two iterations with lr=0 (a real optimizer step between them that leaves the weights bit-equal,
tests/data/values_ckpts/stale_lr0) and the sample_ckpts/torch_dist run whose three iterations really train; and
(CK525-CK529) save dirs put together from real iteration dirs the way users do: renamed, copied, two runs in one."""

from __future__ import annotations

import shutil
from pathlib import Path

from ckptinspect.api import audit, ls
from ckptinspect.commands.audit.lineage import Lineage, Step, stale_saves, step_findings

ROOT = Path(__file__).resolve().parents[3]
STALE = ROOT / "tests" / "data" / "values_ckpts" / "stale_lr0"


def test_a_real_stale_save_is_found() -> None:
    r = audit(STALE, all_iterations=True, values=True)
    (f,) = [f for f in r.findings if f.code == "CK524"]
    assert f.details["iteration"] == 2 and f.details["previous"] == 1 and f.details["model_tensors"] >= 17
    assert r.status.value == "complete" and r.exit_code() == 0 and r.exit_code("warning") == 1
    assert not [f for f in audit(STALE, all_iterations=True).findings if f.code == "CK524"]  # needs --values


def test_a_training_run_is_not_stale() -> None:
    r = audit(ROOT / "sample_ckpts" / "torch_dist", all_iterations=True, values=True)
    assert not [f for f in r.findings if f.code == "CK524"]
    scanned = [a for a in r.report.checkpoints if a.values is not None]
    assert len(scanned) == 3  # every iteration scanned, the half-written one included


def test_only_consecutive_advancing_iterations_count() -> None:
    a, b = {"w": "0" * 32}, {"w": "1" * 32}
    lines = [Lineage("iter_3", 3, a, 30), Lineage("iter_1", 1, a, 10), Lineage("iter_2", 2, b, 20)]
    assert stale_saves(lines, "d") == []  # 1 -> 2 changed, 2 -> 3 changed back: nothing is stale
    (f,) = stale_saves([Lineage("iter_1", 1, a, 10), Lineage("iter_2", 2, a, 20)], "d")
    assert f.subject == "iter_2" and "consumed_train_samples 10 -> 20" in f.message
    assert stale_saves([Lineage("x", 5, a, None), Lineage("y", 5, a, None)], "d") == []


# --- CK525-CK529: the iteration numbers and counters of a save dir's iterations (metadata only) -----------------------

VALUES = ROOT / "tests" / "data" / "values_ckpts"
LINEAGE = {f"CK52{n}" for n in range(5, 10)}


def _codes(path: Path) -> tuple[list[str], list[str]]:
    """The lineage codes of plain `audit` and of `ls` (both read every iteration's common state)."""
    a = [f.code for f in audit(path).findings if f.code in LINEAGE]
    b = [f.code for f in ls(path).findings if f.code in LINEAGE]
    return a, b


def _assemble(root: Path, parts: dict[str, Path], tracker: str) -> Path:
    """A save dir of real iteration dirs copied from other saves under the names a user gave them."""
    root.mkdir()
    for name, src in parts.items():
        shutil.copytree(src, root / name)
    (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    return root


def test_real_runs_have_consistent_lineage() -> None:
    for path in (ROOT / "sample_ckpts" / "torch_dist", STALE, ROOT / "sample_ckpts" / "bridge"):
        assert _codes(path) == ([], []), path


def test_a_renamed_dir_is_ck525(tmp_path: Path) -> None:
    save = _assemble(tmp_path / "s", {"iter_0000001": STALE / "iter_0000001", "iter_0000009": STALE / "iter_0000002"},
                     "1")
    (f,) = [f for f in audit(save).findings if f.code in LINEAGE]  # plain audit: iter 9 is only classified cheaply
    assert (f.code, f.subject, f.details["dir_iteration"], f.details["iteration"]) == ("CK525", "iter_0000009", 9, 2)
    assert _codes(save) == (["CK525"], ["CK525"])
    assert audit(save).exit_code() == 0  # a warning: the status stays complete


def test_a_tracker_naming_a_renamed_dir_is_ck526_alone(tmp_path: Path) -> None:
    """The user renamed iter_0000002 to iter_0000005 and edited the tracker to match: the resume continues at 2."""
    save = tmp_path / "s"
    shutil.copytree(ROOT / "sample_ckpts" / "torch_dist", save)
    (save / "iter_0000002").rename(save / "iter_0000005")
    (save / "latest_checkpointed_iteration.txt").write_text("5")
    (f,) = [f for f in audit(save).findings if f.code in LINEAGE]
    assert (f.code, f.details["tracker"], f.details["iteration"]) == ("CK526", 5, 2)
    # ordered by the stored iteration, iter 3 (12 samples) follows the renamed 2 (8): no counter went backwards
    assert _codes(save) == (["CK526"], ["CK526"])


def test_a_tracker_edited_to_name_an_older_iteration_stays_ck505(tmp_path: Path) -> None:
    """The tracker naming another existing iteration is the tracker check's (CK505 / CK503), not a lineage code."""
    save = _assemble(tmp_path / "s", {n: STALE / n for n in ("iter_0000001", "iter_0000002")}, "1")
    assert "CK505" in {f.code for f in audit(save).findings} and _codes(save) == ([], [])


def test_two_runs_in_one_dir_go_backwards(tmp_path: Path) -> None:
    """stale_lr0's iterations 1 and 2 (global batch 2: 2, 4 samples) and iteration 3 of another real run of the same
    model (global batch 1: 3 samples, scheduler step 3), as a new run saving into an old run's dir leaves them."""
    save = _assemble(tmp_path / "s", {"iter_0000001": STALE / "iter_0000001", "iter_0000002": STALE / "iter_0000002",
                                      "iter_0000003": VALUES / "restart_gbs1" / "iter_0000003"}, "3")
    assert _codes(save) == (["CK527", "CK529"], ["CK527", "CK529"])
    back = {f.code: f for f in ls(save).findings}
    assert back["CK527"].details["consumed_train_samples"] == [4, 3] and back["CK527"].subject == "iter_0000003"
    assert back["CK529"].details["scheduler_steps"] == [4, 3]


def test_samples_not_advancing_with_the_iteration_is_ck528(tmp_path: Path) -> None:
    """Iteration 1 of a global-batch-4 run (4 samples) and iteration 2 of a global-batch-2 run (4 samples)."""
    save = _assemble(tmp_path / "s", {"iter_0000001": ROOT / "sample_ckpts" / "torch_dist" / "iter_0000001",
                                      "iter_0000002": STALE / "iter_0000002"}, "2")
    (f,) = [f for f in audit(save, all_iterations=True).findings if f.code in LINEAGE]
    assert (f.code, f.details["consumed_train_samples"], f.details["previous"]) == ("CK528", [4, 4], 1)
    assert _codes(save) == (["CK528"], ["CK528"])


def test_step_rules_on_records() -> None:
    from ckptinspect.formats.savedir import read_save_dir

    save = read_save_dir(STALE)
    same = [Step("iter_0000001", 1, 1, 2, 2), Step("iter_0000005", 5, 1, 2, 2)]  # a copy under another name
    assert [f.code for f in step_findings(same, save, "d")] == ["CK525"]
    none = [Step("release", None, None, None, None), Step("iter_0000001", 1, None, None, None)]
    assert step_findings(none, save, "d") == []
