"""Unit tests of the check families that had none (storage, objects, tracker, args, legacy).

Each check's `run` is called directly on the neutral model of a real sample (written by megatron-core 0.16.1): clean
on the sample as written, then ONE change — on a copy of the files, or on the model with `dataclasses.replace` —
and the family's code must appear. The acceptance corpus covers the same codes end to end through the CLI.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from ckptinspect.checks import CheckContext, args, legacy, objects, storage, tracker
from ckptinspect.findings import Status
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.savedir import read_save_dir
from ckptinspect.model import Checkpoint

SAMPLES = Path(__file__).resolve().parents[3] / "sample_ckpts"
CTX = CheckContext()


def codes(findings: object) -> set[str]:
    return {f.code for f in findings}  # type: ignore[attr-defined]


@pytest.fixture
def td(tmp_path: Path) -> Path:
    """A copy of the complete torch_dist iteration (iter_0000002)."""
    shutil.copytree(SAMPLES / "torch_dist" / "iter_0000002", tmp_path / "iter_0000002")
    return tmp_path / "iter_0000002"


def read(path: Path) -> Checkpoint:
    return read_checkpoint(path, str(path))


# --- storage (CK201-CK206) -------------------------------------------------------------------------------------------

def test_storage_clean_then_missing_truncated_and_unreferenced_files(td: Path) -> None:
    assert codes(storage.run(read(td), CTX)) == set()
    (td / "__1_0.distcp").unlink()
    victim = td / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:64])
    (td / "__9_0.distcp").write_bytes(b"stale")
    found = codes(storage.run(read(td), CTX))
    assert {"CK201", "CK202", "CK204"} <= found


def test_storage_deep_reads_item_archives(td: Path) -> None:
    ckpt = read(td)
    assert codes(storage.run(ckpt, CheckContext(deep=True))) == set()
    item = next(t.chunks[0].storage for t in ckpt.tensors if t.chunks and t.chunks[0].storage)
    assert item is not None
    data = bytearray((td / item.file).read_bytes())
    data[item.offset:item.offset + min(item.length, 64)] = b"\0" * min(item.length, 64)  # clobber the archive head
    (td / item.file).write_bytes(bytes(data))
    assert "CK205" in codes(storage.run(read(td), CheckContext(deep=True)))


# --- objects (CK305 / CK306) -----------------------------------------------------------------------------------------

def test_objects_grid_missing_and_duplicate_cells() -> None:
    ckpt = read(SAMPLES / "torch_dist" / "iter_0000002")
    assert codes(objects.run(ckpt, CTX)) == set()
    gridded = [o for o in ckpt.objects if o.grid is not None and o.offset is not None and o.grid != (1,)]
    assert gridded, "the sample has sharded objects on a grid (rng_state)"
    victim = gridded[0]
    fewer = dataclasses.replace(ckpt, objects=tuple(o for o in ckpt.objects if o is not victim))
    assert "CK305" in codes(objects.run(fewer, CTX))
    twice = dataclasses.replace(ckpt, objects=ckpt.objects + (victim,))
    assert "CK306" in codes(objects.run(twice, CTX))


# --- tracker (CK501-CK506) -------------------------------------------------------------------------------------------

def _statuses(save_dir: Path) -> dict[str, Status]:
    return {"iter_0000001": Status.COMPLETE, "iter_0000002": Status.COMPLETE, "iter_0000003": Status.INCOMPLETE}


@pytest.mark.parametrize("tracker_text,expected", [
    (None, {"CK501"}), (b"abc", {"CK502"}), (b"7", {"CK503"}), (b"3", {"CK504"}), (b"1", {"CK505", "CK506"}),
    (b"2", {"CK506"}),
])
def test_tracker_codes(tmp_path: Path, tracker_text: bytes | None, expected: set[str]) -> None:
    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    if tracker_text is None:
        (save / "latest_checkpointed_iteration.txt").unlink()
    else:
        (save / "latest_checkpointed_iteration.txt").write_bytes(tracker_text)
    found = codes(tracker.run(read_save_dir(save), _statuses(save), str(save)))
    assert expected <= found and found <= {"CK501", "CK502", "CK503", "CK504", "CK505", "CK506"}
    if tracker_text == b"2":
        assert found == {"CK506"}  # the sample as written: only its crashed iter_0000003


# --- args (CK701 / CK702) --------------------------------------------------------------------------------------------

def test_args_against_the_on_disk_layout() -> None:
    ckpt = read(SAMPLES / "torch_dist" / "iter_0000002")
    assert codes(args.run(ckpt, CTX)) == set()
    assert ckpt.args is not None
    wrong_tp = dataclasses.replace(ckpt, args={**ckpt.args, "tensor_model_parallel_size": 4})
    found = list(args.run(wrong_tp, CTX))
    assert codes(found) == {"CK702"} and found[0].subject == "tensor_model_parallel_size"
    zero_tp = dataclasses.replace(ckpt, args={**ckpt.args, "tensor_model_parallel_size": 0})
    assert codes(args.run(zero_tp, CTX)) == {"CK702"}  # a 0 in args disagrees with the disk too
    assert "CK701" in codes(args.run(dataclasses.replace(ckpt, args=None), CTX))


# --- legacy (CK110-CK112) --------------------------------------------------------------------------------------------

def test_legacy_shard_dirs_and_distributed_optimizer(tmp_path: Path) -> None:
    it = tmp_path / "iter_0000001"
    shutil.copytree(SAMPLES / "legacy" / "iter_0000001", it)
    assert codes(legacy.run(read(it), CTX)) == set()
    (it / "mp_rank_01_001" / "distrib_optim.pt").unlink()
    assert "CK111" in codes(legacy.run(read(it), CTX))
    shutil.rmtree(it / "mp_rank_01_000")
    assert {"CK110", "CK111"} <= codes(legacy.run(read(it), CTX))


def test_legacy_args_disagreeing_between_shards() -> None:
    ckpt = read(SAMPLES / "legacy" / "iter_0000001")
    shard_args = ckpt.shard_args
    assert shard_args, "the legacy reader exposes the args of every shard"
    assert codes(legacy.run(ckpt, CTX)) == set()
    first = sorted(shard_args)[0]
    changed = {**shard_args, first: {**shard_args[first], "hidden_size": 12345}}
    assert "CK112" in codes(legacy.run(dataclasses.replace(ckpt, shard_args=changed), CTX))
