"""NVRx local iterations as global tensors (`formats/nvrx_local.py`): every `ShardedTensor` with data becomes a chunk.

The evidence: `sample_ckpts/nvrx_local` and `sample_ckpts/bridge` are two real megatron-core 0.16.1 runs of one
payload (`tools/make_stack_samples.py` PAYLOAD: same model, seed and data, DP=2), one saved by NVRx 0.4.1's
LocalCheckpointManager as per-rank `torch.save` files, the other as `torch_dist`. The same training gives the same
weights and optimizer state, so every tensor's shard-invariant fingerprint must agree across the two formats, and a
one-element change in an NVRx file must change exactly that tensor's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ckptinspect import api
from ckptinspect.formats import read_checkpoint

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"


def _fingerprints(path: Path) -> dict[str, str | None]:
    r = api.values(path)
    return {t.key: t.values.fingerprint for t in r.report.tensors}


def test_every_tensor_of_an_nvrx_iteration_is_placed_and_covered() -> None:
    c = read_checkpoint(SAMPLES / "nvrx_local" / "iter_0000002", "n")
    assert len(c.tensors) == 20 and c.extra["unplaced_tensors"] == 0
    assert not c.findings
    # rank 0 holds layer 0's weights, rank 1 layer 1's (with replica_id (0, 0, 1)): both files are read
    files = {ch.storage.file.split("/")[0] for t in c.tensors for ch in t.chunks if ch.storage}
    assert files == {"0", "1"}
    cov = api.coverage(SAMPLES / "nvrx_local")
    assert not cov.findings


def test_nvrx_and_torch_dist_of_one_run_have_equal_fingerprints() -> None:
    nvrx = _fingerprints(SAMPLES / "nvrx_local")
    td = _fingerprints(SAMPLES / "bridge")
    assert len(nvrx) == 20 and set(nvrx) == set(td)
    assert all(v is not None for v in nvrx.values())
    assert nvrx == td
    v = api.diff(SAMPLES / "nvrx_local", SAMPLES / "bridge", values=True).report.values
    assert v is not None and len(v.compared) == 20 and set(v.identical) == set(nvrx)


def test_one_changed_element_changes_that_tensors_fingerprint_only(tmp_path: Path) -> None:
    shutil.copytree(SAMPLES / "nvrx_local", tmp_path / "n")
    c = read_checkpoint(tmp_path / "n" / "iter_0000002", "n")
    t = next(t for t in c.tensors if t.key == "output_layer.weight")
    item = t.chunks[0].storage
    assert item is not None
    with open(tmp_path / "n" / item.file, "r+b") as f:
        f.seek(item.offset + 4 * 37)
        b = f.read(1)
        f.seek(item.offset + 4 * 37)
        f.write(bytes([b[0] ^ 0x01]))
    before, after = _fingerprints(SAMPLES / "nvrx_local"), _fingerprints(tmp_path / "n")
    assert {k for k in before if before[k] != after[k]} == {"output_layer.weight"}


def test_an_iteration_missing_a_rank_places_no_tensor(tmp_path: Path) -> None:
    shutil.copytree(SAMPLES / "nvrx_local", tmp_path / "n")
    (tmp_path / "n" / "1" / "iter_0000002_1_local.pt").unlink()
    c = read_checkpoint(tmp_path / "n" / "iter_0000002", "n")
    assert {f.code for f in c.findings} == {"CK512"}
    assert not c.tensors  # its gaps would restate the missing rank as corruption
