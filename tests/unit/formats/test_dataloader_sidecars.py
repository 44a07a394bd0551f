"""Per-DP-rank dataloader state (`formats/dataloader_state.py`) and the `resume` dataloader component
(`commands/resume/data_position.py`) on the real samples.

sample_ckpts/bridge holds Megatron-Bridge's `energon/iter_N/train_dataloader_dprank{r:03d}.pt` for DP 2;
sample_ckpts/torchtitan_dataloader is a DCP save by 2 gloo ranks with torchtitan's `dataloader.dp_rank_{r}` and
`dataloader.world_size` items (tools/make_stack_samples.py). Both are copied before any change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckptinspect.commands.resume import Component, Outcome, ResumeTarget, Verdict, predict_resume
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.resolve import resolve_checkpoint
from ckptinspect.model import Checkpoint, DataloaderState
from conftest import SAMPLES

DL_CODES = {"CK540", "CK541", "CK542", "CK543", "CK544"}
ENERGON = Path("energon/iter_0000002")


def read(path: Path) -> Checkpoint:
    return read_checkpoint(*resolve_checkpoint(path), True)


def codes(c: Checkpoint) -> set[str]:
    return {f.code for f in c.findings}


@pytest.fixture
def bridge(tmp_path: Path) -> Path:
    dst = tmp_path / "bridge"
    shutil.copytree(SAMPLES / "bridge", dst)
    return dst


def test_healthy_bridge_sidecars_are_read_without_a_finding() -> None:
    c = read(SAMPLES / "bridge")
    assert c.dataloader == DataloaderState("megatron-bridge", "../energon/iter_0000002", (0, 1), 2)
    assert not codes(c) & DL_CODES


def test_real_energon_state_classes_are_judged_safe_and_read() -> None:
    """The sample's files pickle megatron-energon 7.4.1's own classes (`SavableDataLoaderState`, ..., `FlexState`,
    a dict subclass filled by SETITEMS). Bridge's restricted loader allows exactly them; before they were allowed
    here, a real Bridge save with Energon state read `unsafe` (CK604) and, once allowed, `corrupt` (FlexState's
    SETITEMS on an object stand-in)."""
    from ckptinspect.pickling.allowlist import GlobalClass
    from ckptinspect.pickling.report import PickleReport
    from ckptinspect.pickling.torch_archive import read_torch_file

    f = SAMPLES / "bridge" / ENERGON / "train_dataloader_dprank000.pt"
    archive = read_torch_file(f)
    report: PickleReport = archive.report
    energon = {q for q in report.globals if q.startswith("megatron.energon.")}
    assert energon == {"megatron.energon.rng.SystemRngState", "megatron.energon.state.FlexState",
                       *(f"megatron.energon.savable_loader.{n}" for n in
                         ("SavableDataLoaderState", "SavableDatasetCheckpoint", "SavableDatasetState"))}
    assert all(v is GlobalClass.ALLOWED for v in report.globals.values()) and not report.called
    assert not report.unsafe and not report.dangerous
    state = archive.obj["dataloader_state_dict"]
    ds = state.__dict__["worker_states"][0].__dict__["state"].__dict__["dataset_state"]
    assert isinstance(ds, dict) and ds["sample_index"] == 4


def test_healthy_torchtitan_items_are_read_with_the_recorded_dp() -> None:
    c = read(SAMPLES / "torchtitan_dataloader")
    # dp = dataloader.world_size, read from its byte item with the allowlisting unpickler (DCP gives no DP)
    assert c.dataloader == DataloaderState("torchtitan", "dataloader.", (0, 1), 2)
    assert c.topology.dp is None and not codes(c) & DL_CODES


@pytest.mark.parametrize("name", ["torchtitan", "torch_dist", "nemo2/checkpoints"])
def test_samples_without_dataloader_state_have_none(name: str) -> None:
    c = read(SAMPLES / name)
    assert c.dataloader is None and not codes(c) & DL_CODES


def test_a_removed_rank_file_is_ck540(bridge: Path) -> None:
    (bridge / ENERGON / "train_dataloader_dprank001.pt").unlink()
    c = read(bridge)
    (f,) = [f for f in c.findings if f.code == "CK540"]
    assert f.details["missing_ranks"] == [1] and f.details["dp"] == 2 and "RuntimeError" in f.message
    assert c.dataloader is not None and c.dataloader.ranks == (0,)


def test_a_rank_beyond_dp_is_ck541_and_a_cut_file_ck542(bridge: Path) -> None:
    rank1 = bridge / ENERGON / "train_dataloader_dprank001.pt"
    shutil.copy(rank1, bridge / ENERGON / "train_dataloader_dprank002.pt")
    rank1.write_bytes(rank1.read_bytes()[:300])
    c = read(bridge)
    assert {"CK541", "CK542"} <= codes(c) and "CK540" not in codes(c)
    assert c.dataloader is not None and c.dataloader.ranks == (0, 1, 2) and c.dataloader.unreadable == (1,)


def test_an_explicit_dataloader_save_dir_is_followed(bridge: Path, tmp_path: Path) -> None:
    """Bridge's `dataset.dataloader_save` overrides the `{save}/energon` default (v0.6.0 save_checkpoint)."""
    elsewhere = tmp_path / "data_state"
    shutil.move(str(bridge / "energon"), elsewhere)
    assert read(bridge).dataloader is None  # no energon/ beside the iterations: nothing to judge
    cfg = bridge / "iter_0000002" / "run_config.yaml"
    cfg.write_text(cfg.read_text() + f"dataset:\n  dataloader_save: {elsewhere}\n")
    (elsewhere / "iter_0000002" / "train_dataloader_dprank000.pt").unlink()
    c = read(bridge)
    assert c.dataloader is not None and c.dataloader.ranks == (1,) and "CK540" in codes(c)


def test_an_iteration_without_state_beside_others_is_ck543(bridge: Path) -> None:
    shutil.rmtree(bridge / ENERGON)
    c = read(bridge)
    assert "CK543" in codes(c) and c.dataloader is None


def predict(c: Checkpoint, dp: int) -> tuple[Verdict, Outcome, str]:
    p = predict_resume(c, ResumeTarget(tp=1, pp=1, dp=dp))
    d = p.components[Component.DATALOADER]
    return p.verdict, d.outcome, d.reason


def test_resume_at_a_smaller_dp_drops_the_other_ranks_data_position() -> None:
    """Megatron-Bridge PR #5637: DP 2 -> 1 silently leaves rank 1's Energon state unread."""
    verdict, outcome, reason = predict(read(SAMPLES / "bridge"), 1)
    assert (verdict, outcome) == (Verdict.LOSSY, Outcome.DROPPED)
    assert "DP rank(s) 1 is dropped" in reason and "#5637" in reason


def test_resume_at_the_saved_dp_loads_and_at_a_larger_dp_fails() -> None:
    c = read(SAMPLES / "bridge")
    assert predict(c, 2)[1] is Outcome.LOADED
    verdict, outcome, reason = predict(c, 4)
    assert outcome is Outcome.FAILS and verdict is Verdict.FAILS and "DP rank(s) 2, 3" in reason


def test_resume_at_the_saved_dp_with_a_lost_rank_fails(bridge: Path) -> None:
    (bridge / ENERGON / "train_dataloader_dprank001.pt").unlink()
    verdict, outcome, reason = predict(read(bridge), 2)
    assert (verdict, outcome) == (Verdict.FAILS, Outcome.FAILS) and "RuntimeError" in reason


def test_resume_without_dataloader_state_says_absent() -> None:
    assert predict(read(SAMPLES / "torch_dist"), 1)[1] is Outcome.ABSENT


def test_resume_cli_names_the_dataloader_line() -> None:
    from typer.testing import CliRunner

    from ckptinspect.cli.app import app

    r = CliRunner().invoke(app, ["resume", str(SAMPLES / "bridge"), "--tp", "1", "--pp", "1", "--dp", "1"],
                           env={"COLUMNS": "200"})
    assert r.exit_code in (0, 1), r.output
    assert "dataloader" in r.stdout and "dropped" in r.stdout and "lossy" in r.stdout
