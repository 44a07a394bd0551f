"""DCP stream-transformed items (`formats/transforms.py`, issue 24 §2): checkpoints written by the real torch 2.13
`dcp.save(state, storage_writer=FileSystemWriter(path, _extensions=[ZStandard()]))`, every item zstd-compressed
(`transform_descriptors == ["stream.zstd/1"]`). A healthy one is `complete` in `audit`, `audit --deep` and `scan`;
a compressed byte item whose pickle runs code under the real `dcp.load` is `unsafe`; an item that cannot be decoded
here (no zstd extra, unknown descriptor) is CK208 `incomplete`; a decompression bomb is CK603; a compressed tensor
item of the wrong size is CK205 under `--deep`.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ckptinspect.commands.audit.audit import AuditOptions, audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.errors import LimitExceeded
from ckptinspect.findings import Status
from hostile_samples import Reduce, run_real_loader, torch_save_bytes

torch = pytest.importorskip("torch")
zstandard = pytest.importorskip("zstandard")

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "sample_ckpts" / "dcp_zstd"


def save_compressed(path: Path, state: dict[str, object]) -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single-process save without a process group
        dcp.save(state, storage_writer=FileSystemWriter(path, _extensions=[ZStandard()]))
    return path


def healthy_state() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 4, generator=g), "z": torch.zeros(64, 64),
            "extra": {"step": 3, "rng": torch.get_rng_state()}}


def reitem(ckpt: Path, key: str, blob: bytes, descriptors: list[str] | None = None) -> None:
    """Append `blob` to item `key`'s data file and point `.metadata` at it, keeping (or replacing) its transform
    descriptors (`.metadata` rewritten through torch's own classes: the sample is ours)."""
    import torch.distributed.checkpoint  # noqa: F401 - registers the classes the pickle names
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    md = pickle.loads((ckpt / ".metadata").read_bytes())
    idx = next(i for i in md.storage_data if i.fqn == key)
    info = md.storage_data[idx]
    path = ckpt / info.relative_path
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(blob)
    md.storage_data[idx] = _StorageInfo(info.relative_path, offset, len(blob),
                                        descriptors if descriptors is not None else info.transform_descriptors)
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))


def set_descriptors(ckpt: Path, descriptors: list[str]) -> None:
    import torch.distributed.checkpoint  # noqa: F401
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    md = pickle.loads((ckpt / ".metadata").read_bytes())
    for idx, info in list(md.storage_data.items()):
        md.storage_data[idx] = _StorageInfo(info.relative_path, info.offset, info.length, descriptors)
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))


def zstd(data: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor().compress(data))


def codes(findings: object) -> set[str]:
    return {f.code for f in findings}  # type: ignore[attr-defined]


def verdicts(path: Path) -> tuple[object, object, object]:
    return audit(path), audit(path, AuditOptions(deep=True)), scan_path(path, "s")


# --- healthy ---------------------------------------------------------------------------------------------------------


def test_a_healthy_compressed_checkpoint_is_complete_and_every_item_is_scanned(tmp_path: Path) -> None:
    ckpt = save_compressed(tmp_path / "c", healthy_state())
    md = pickle.loads((ckpt / ".metadata").read_bytes())
    assert {tuple(i.transform_descriptors) for i in md.storage_data.values()} == {("stream.zstd/1",)}
    a, deep, s = verdicts(ckpt)
    for r in (a, deep, s):
        assert r.status is Status.COMPLETE, r.findings  # type: ignore[attr-defined]
    assert s.pickles_scanned == 1 + len(md.storage_data)  # type: ignore[attr-defined]  # .metadata + every item


def test_the_bundled_compressed_sample_is_complete() -> None:
    md = pickle.loads((SAMPLE / ".metadata").read_bytes())
    assert all(i.transform_descriptors == ["stream.zstd/1"] for i in md.storage_data.values())
    a, deep, s = verdicts(SAMPLE)
    for r in (a, deep, s):
        assert r.status is Status.COMPLETE, r.findings  # type: ignore[attr-defined]


# --- hostile ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_compressed_byte_item_that_runs_code_under_dcp_load_is_unsafe(tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    marker = tmp_path / "pwned"
    save_compressed(ckpt, {"w": torch.zeros(4), "evil": Reduce(os.system, (f"touch {marker}",))})
    a, deep, s = verdicts(ckpt)
    assert not marker.exists()
    for r in (a, deep, s):
        assert r.status is Status.UNSAFE, r.findings  # type: ignore[attr-defined]
        assert "CK601" in codes(r.findings)  # type: ignore[attr-defined]
    run_real_loader("dcp", str(ckpt), "evil")
    assert marker.exists(), "the real dcp.load did not run the payload"


def test_a_decompression_bomb_in_a_tensor_item_is_a_bound_finding_not_memory(tmp_path: Path) -> None:
    ckpt = save_compressed(tmp_path / "c", healthy_state())
    bomb = zstd(torch_save_bytes(torch.zeros(2 << 20, dtype=torch.uint8)))  # 2 MiB for a 128-byte tensor
    assert len(bomb) < 4096
    reitem(ckpt, "w", bomb)
    deep = audit(ckpt, AuditOptions(deep=True))
    s = scan_path(ckpt, "s")
    for r in (deep, s):
        assert r.status is Status.CORRUPT, r.findings
        assert any(f.code == "CK603" and f.subject.startswith("w") for f in r.findings), r.findings


def test_a_byte_item_decoding_past_its_bound_stops_there() -> None:
    from ckptinspect.formats.transforms import decode_item

    data = zstd(b"\0" * (8 << 20))
    with pytest.raises(LimitExceeded):
        decode_item(io.BytesIO(data), 0, len(data), ["stream.zstd/1"], bound=1 << 20)
    with decode_item(io.BytesIO(b"xx" + data), 2, len(data), ["stream.zstd/1"], bound=8 << 20) as out:
        assert out.read() == b"\0" * (8 << 20)


def test_a_compressed_tensor_item_of_the_wrong_size_is_corrupt_under_deep(tmp_path: Path) -> None:
    ckpt = save_compressed(tmp_path / "c", healthy_state())
    reitem(ckpt, "w", zstd(torch_save_bytes(torch.zeros(8, 3))))
    assert audit(ckpt).status is Status.COMPLETE  # the payload is only read under --deep
    deep = audit(ckpt, AuditOptions(deep=True))
    assert deep.status is Status.CORRUPT
    assert any(f.code == "CK205" and "payload is 96 bytes, expected 128" in f.message for f in deep.findings), \
        deep.findings


def test_a_compressed_item_that_is_not_zstd_is_corrupt_under_deep(tmp_path: Path) -> None:
    ckpt = save_compressed(tmp_path / "c", healthy_state())
    reitem(ckpt, "w", b"\x28\xb5\x2f\xfd" + b"garbage" * 20)
    deep = audit(ckpt, AuditOptions(deep=True))
    assert deep.status is Status.CORRUPT
    assert any(f.code == "CK205" and f.subject == "w" and "not a valid stream.zstd/1 stream" in f.message
               for f in deep.findings), deep.findings


# --- not decodable here: CK208, never complete -----------------------------------------------------------------------


def test_an_unknown_transform_descriptor_is_ck208_incomplete(tmp_path: Path) -> None:
    ckpt = save_compressed(tmp_path / "c", healthy_state())
    set_descriptors(ckpt, ["stream.lz4/1"])
    from ckptinspect.formats.transforms import unsupported

    assert unsupported(["stream.zstd/2"]) is not None
    a, deep, s = verdicts(ckpt)
    for r in (a, deep, s):
        assert r.status is Status.INCOMPLETE, r.findings  # type: ignore[attr-defined]
        assert "CK208" in codes(r.findings)  # type: ignore[attr-defined]
        assert "CK205" not in codes(r.findings)  # type: ignore[attr-defined]


_WITHOUT_ZSTD = """
import json, sys
sys.modules['zstandard'] = None  # the zstd extra not installed: `import zstandard` raises ImportError
from pathlib import Path
from ckptinspect.commands.audit.audit import AuditOptions, audit
from ckptinspect.commands.scan.scan import scan_path
p = Path(sys.argv[1])
out = {}
for name, r in (("audit", audit(p)), ("deep", audit(p, AuditOptions(deep=True))), ("scan", scan_path(p, "s"))):
    out[name] = [r.status.value, sorted({f.code for f in r.findings}), [f.message for f in r.findings]]
out["torch"] = "torch" in sys.modules
print(json.dumps(out))
"""


@pytest.mark.parametrize("hostile", [False, True], ids=["healthy", "hostile"])
def test_without_the_zstd_extra_compressed_items_are_ck208_never_complete(tmp_path: Path, hostile: bool) -> None:
    ckpt = tmp_path / "c"
    state = healthy_state()
    if hostile:
        state["evil"] = Reduce(os.system, (f"touch {tmp_path / 'pwned'}",))
    save_compressed(ckpt, state)
    r = subprocess.run([sys.executable, "-c", _WITHOUT_ZSTD, str(ckpt)], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("torch") is False  # the core still runs without torch
    for name, (status, found, messages) in out.items():
        assert status == "incomplete", (name, messages)
        assert "CK208" in found, (name, messages)
        assert any("zstd extra" in m and "not scanned" in m for m in messages), messages
    assert not (tmp_path / "pwned").exists()
