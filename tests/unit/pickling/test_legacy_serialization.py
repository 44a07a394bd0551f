"""torch's legacy (pre-1.6, non-zip) serialization: `torch.save(..., _use_new_zipfile_serialization=False)`.

torch 2.13 still writes it and `torch.load` still reads it. The legacy Megatron sample is re-saved in that layout with
the real torch (its objects loaded with torch from the trusted sample): the checkpoint reads as it does in zip layout
(same tensors, every tensor's stored bytes where torch put them), a truncated file is corrupt, and a payload in it is
unsafe (it was `CK206 corrupt` for all three: "not supported").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckptinspect.commands.audit.audit import audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.findings import Status
from ckptinspect.formats import read_checkpoint
from hostile_samples import payload, run_real_loaders

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]
LEGACY = REPO / "sample_ckpts" / "legacy"


@pytest.fixture(scope="module")
def resaved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("legacy-nonzip") / "legacy"
    shutil.copytree(LEGACY, out)
    for pt in sorted(out.rglob("*.pt")):
        obj = torch.load(pt, weights_only=False)  # the trusted sample
        torch.save(obj, pt, _use_new_zipfile_serialization=False)
        assert not pt.read_bytes().startswith(b"PK")
    return out


def _tensors(path: Path) -> dict[tuple[str, str | None], tuple[tuple[int, ...], str]]:
    ckpt = read_checkpoint(path, "ckpt")
    return {(t.key, t.shard): (t.shape, t.dtype) for t in ckpt.tensors}


def test_a_legacy_layout_checkpoint_reads_like_its_zip_layout(resaved: Path) -> None:
    result = audit(resaved)
    assert result.status is Status.COMPLETE, result.findings
    before = _tensors(LEGACY / "iter_0000001")
    assert len(before) > 10 and _tensors(resaved / "iter_0000001") == before


def test_every_tensor_is_stored_where_torch_put_its_bytes(resaved: Path) -> None:
    """Each tensor's bytes at its stored range in the legacy file equal its bytes at its range in the zip file torch
    wrote for the same object."""
    def stored(root: Path) -> dict[tuple[str, str | None], bytes]:
        out = {}
        for t in read_checkpoint(root, "ckpt").tensors:
            s = t.chunks[0].storage
            assert s is not None, t.key
            with open(root / s.file, "rb") as f:  # noqa: PTH123
                f.seek(s.offset)
                out[(t.key, t.shard)] = f.read(s.length)
        return out

    legacy, zipped = stored(resaved / "iter_0000001"), stored(LEGACY / "iter_0000001")
    assert legacy.keys() == zipped.keys() and len(legacy) > 10
    assert all(legacy[k] == zipped[k] and len(zipped[k]) > 0 for k in zipped if zipped[k])
    assert sum(1 for v in zipped.values() if v) > 10


def test_a_truncated_legacy_layout_file_is_corrupt(resaved: Path, tmp_path: Path) -> None:
    broken = tmp_path / "legacy"
    shutil.copytree(resaved, broken)
    pt = sorted(broken.rglob("model_optim_rng.pt"))[0]
    data = pt.read_bytes()
    pt.write_bytes(data[: len(data) - 100])
    result = audit(broken)
    assert result.status is Status.CORRUPT
    assert any(f.code == "CK206" and "truncated" in f.message for f in result.findings), result.findings


@pytest.mark.slow
def test_a_payload_in_a_legacy_layout_file_runs_under_torch_load_and_is_unsafe(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"

    # the real torch legacy writer, with an object whose pickle is the payload
    torch.save({"w": torch.zeros(2), "x": _Raw(payload(marker, "os.system"))}, evil,
               _use_new_zipfile_serialization=False)
    run_real_loaders([("torch.load", [str(evil)])])
    assert marker.exists(), "torch.load did not run the payload"
    marker.unlink()
    assert scan_path(evil, "s").status is Status.UNSAFE
    assert audit(evil).status is Status.UNSAFE
    assert not marker.exists()


class _Raw:
    """An object whose pickle is the given pickle's body (its opcodes up to STOP), spliced in by `__reduce__`."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[object, ...]:
        import pickle

        return (pickle.loads, (self.data,))


@pytest.mark.parametrize("n", [99, 105, 40])  # element counts whose first byte is an opcode: GLOBAL, INST, MARK
def test_storage_bytes_after_the_five_pickles_are_never_walked_as_pickles(n: int, tmp_path: Path) -> None:
    """torch's legacy loader unpickles five pickles, then reads each storage raw (an int64 count, the bytes): a
    benign tensor whose count and bytes happen to spell pickle opcodes naming `os.system` is data, not a pickle."""
    p = tmp_path / "w.pt"
    data = list(b"os\nsystem\n(S'id'\ntR." * 20)[:n]
    torch.save({"w": torch.tensor(data, dtype=torch.uint8)}, p, _use_new_zipfile_serialization=False)
    assert torch.load(p, weights_only=True)["w"].tolist() == data
    for result in (scan_path(p, "s"), audit(p)):
        assert result.status is Status.COMPLETE, result.findings
        assert not {f.code for f in result.findings} & {"CK601", "CK602", "CK604"}, result.findings
