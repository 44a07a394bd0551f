"""Tests of `ckptinspect.commands.scan.scan` (the pickle-safety scan) and the `scan` CLI command (`cli/scan_cmd.py`).

Positive: every real checkpoint (megatron-core 0.16.1 torch_dist / legacy, torch DCP, the megatron-core 0.19.2
fixture) scans `complete` with every pickle it holds counted — `.metadata`, `common.pt`, every stored item inside
the `.distcp` files, every `.pt` file — and no global outside the allowlist.
Negative: a hostile pickle planted in every place a checkpoint keeps one (`.metadata`, `common.pt`, legacy
`model_optim_rng.pt` / `distrib_optim.pt`, a byte item and a tensor archive inside a `.distcp` — rewritten in place
with a same-length payload, or re-laid-out with `.metadata` rewritten through torch's own classes —, Megatron-Bridge's
`latest_train_state.pt`, a nested archive, a `.distcp` without `.metadata`) is reported as CK601, status `unsafe`,
exit code 1, and nothing runs. Copies only: the samples are never modified.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import typer
from typer.testing import CliRunner

from ckptinspect.cli.scan_cmd import register
from ckptinspect.findings import Status
from ckptinspect.formats.dcp.metadata import read_dcp_metadata
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.services.safety_scan import ScanReport, scan_stored_items, stored_items

REPO = Path(__file__).resolve().parents[3]
SAMPLES = Path(os.environ.get("CKPTINSPECT_SAMPLES", REPO / "sample_ckpts"))
FIXTURE_0192 = SAMPLES / "mcore_0_19_2"


# --- helpers ---------------------------------------------------------------------------------------------------------


def need(path: Path) -> Path:
    """`path` if it is a populated dir (samples may be mid-regeneration), else skip."""
    if not path.is_dir() or not any(path.iterdir()):
        pytest.skip(f"{path} not available")
    return path


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(need(src), dst, symlinks=True)
    return dst


class Reduce:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def hostile(marker: Path, proto: int = 2) -> bytes:
    """A pickle that, if loaded for real, runs `touch marker` (`posix.system`)."""
    return pickle.dumps({"args": Reduce(os.system, (f"touch {marker}",)), "iteration": 1}, protocol=proto)


def torch_zip(data_pkl: bytes, prefix: str = "archive", extra: dict[str, bytes] | None = None) -> bytes:
    """A `torch.save`-shaped zip (torch 2.x member layout) around `data_pkl`, built without torch."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        z.writestr(f"{prefix}/byteorder", "little")
        z.writestr(f"{prefix}/version", "3\n")
        for name, blob in (extra or {}).items():
            z.writestr(name, blob)
    return buf.getvalue()


def padded(blob: bytes, length: int) -> bytes:
    """`blob` (a zip) grown to exactly `length` bytes through its end-record comment."""
    pad = length - len(blob)
    assert 0 <= pad <= 0xFFFF, f"payload of {len(blob)} bytes does not fit an item of {length}"
    assert blob[-22:-18] == b"PK\x05\x06" and blob[-2:] == b"\0\0"
    return blob[:-2] + pad.to_bytes(2, "little") + b"#" * pad


def items_of(ckpt: Path) -> dict[str, Any]:
    md = read_dcp_metadata((ckpt / ".metadata").read_bytes())
    return dict(stored_items(md.tensors, md.objects))


def plant_same_length(ckpt: Path, key: str, payload: bytes) -> Any:
    """Overwrite the stored item `key` in place with a same-length zip around `payload`; `.metadata` unchanged."""
    item = items_of(ckpt)[key]
    blob = padded(torch_zip(payload), item.length)
    with open(ckpt / item.file, "r+b") as f:
        f.seek(item.offset)
        f.write(blob)
    return item


def plant_relaid(ckpt: Path, key: str, payload: bytes) -> None:
    """Replace the stored item `key` with a zip of another length: the bytes after it move, and `.metadata` is
    rewritten with torch's own classes (torch pickles its `Metadata`; the sample is trusted, so loading it with
    torch is fine here)."""
    torch_dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    target = next(i for i in md.storage_data if i.fqn == key)
    info = md.storage_data[target]
    blob = torch_zip(payload)
    delta = len(blob) - info.length
    path = ckpt / info.relative_path
    data = path.read_bytes()
    path.write_bytes(data[: info.offset] + blob + data[info.offset + info.length :])
    for idx, other in list(md.storage_data.items()):
        if other.relative_path != info.relative_path:
            continue
        if idx is target:
            md.storage_data[idx] = _StorageInfo(other.relative_path, other.offset, len(blob))
        elif other.offset > info.offset:
            md.storage_data[idx] = _StorageInfo(other.relative_path, other.offset + delta, other.length)
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    assert isinstance(md, torch_dcp.metadata.Metadata)


def scan_app() -> typer.Typer:
    """A typer app holding only `scan` (app.py registers it in the shipped CLI)."""
    t = typer.Typer()
    t.callback()(lambda: None)
    register(t)
    return t


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(scan_app(), ["scan", *args])


def expected_pickles(root: Path) -> int:
    """Every pickle a checkpoint tree really holds, counted independently of the scanner: one per `.metadata`, one
    per stored item it places in a data file, one per `.pt` file."""
    n = 0
    for d, _, files in os.walk(root):
        if ".metadata" in files:
            n += 1 + len(items_of(Path(d)))
        n += sum(1 for f in files if f.endswith(".pt"))
    return n


def assert_unsafe(report: ScanReport, subject: str, dangerous: str = "posix.system") -> None:
    assert report.status is Status.UNSAFE, report.findings
    hits = [f for f in report.findings if f.code == "CK601" and f.subject == subject]
    assert hits, [(f.code, f.subject) for f in report.findings]
    assert dangerous in hits[0].message and "not executed" in hits[0].message
    assert dangerous in hits[0].details["globals"]


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    m = tmp_path / "PWNED"
    yield m
    assert not m.exists(), "a hostile pickle was executed"


# --- real checkpoints scan clean -------------------------------------------------------------------------------------


CLEAN = [SAMPLES / "torch_dist", SAMPLES / "torch_dist_fully", SAMPLES / "legacy", SAMPLES / "dcp", FIXTURE_0192]


@pytest.mark.parametrize("root", CLEAN, ids=lambda p: p.name)
def test_real_save_dir_scans_complete_with_every_pickle_counted(root: Path) -> None:
    need(root)
    report = scan_path(root, str(root))
    assert report.status is Status.COMPLETE, report.findings
    assert report.findings == ()
    assert report.pickles_scanned == expected_pickles(root) > 0
    for p in report.pickles:
        assert p.problem is None, p
        assert set(p.globals.values()) <= {"allowed"}, p
    files = {p.file for p in report.pickles}
    assert not any(f.endswith(".txt") or f.endswith(".json") for f in files)  # trackers/manifests are text


@pytest.mark.parametrize("root", [SAMPLES / "torch_dist", SAMPLES / "torch_dist_fully", FIXTURE_0192],
                         ids=lambda p: p.name)
def test_torch_dist_checkpoint_every_metadata_item_is_a_scanned_pickle(root: Path) -> None:
    ckpt = next(p for p in sorted(need(root).iterdir()) if (p / ".metadata").is_file())
    items = items_of(ckpt)
    report = scan_path(ckpt, str(ckpt))
    scanned = {p.subject for p in report.pickles}
    assert set(items) <= scanned
    assert report.pickles_scanned >= len(items) + 1
    assert ".metadata" in scanned
    for key, item in items.items():
        p = next(p for p in report.pickles if p.subject == key)
        assert (p.file, p.offset, p.length) == (item.file, item.offset, item.length)
        assert p.member is not None and p.member.endswith("/data.pkl")


def test_0192_common_state_item_and_save_dir_labels() -> None:
    root = need(FIXTURE_0192)
    report = scan_path(root, "run")
    common = [p for p in report.pickles if p.subject == "common_state/shard_0_1"]
    assert len(common) == 1 and common[0].file == "iter_0000400/__0_0.distcp"
    assert "argparse.Namespace" in common[0].globals
    assert not (root / "common.pt").exists()


def test_legacy_subjects_are_relative_to_the_iteration_dir() -> None:
    root = need(SAMPLES / "legacy")
    report = scan_path(root, "save")
    subjects = sorted(p.subject for p in report.pickles)
    assert "mp_rank_00_000/model_optim_rng.pt" in subjects
    assert all(p.file.startswith("iter_0000001/") for p in report.pickles)


# --- hostile pickles in every place ----------------------------------------------------------------------------------


def _verdicts(target: Path, label: str, subject: str) -> None:
    report = scan_path(target, label)
    assert_unsafe(report, subject)
    r = run_cli(str(target), "-o", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "unsafe" and doc["command"] == "scan" and doc["schema_version"] == 1
    assert any(f["code"] == "CK601" for f in doc["findings"])
    r = run_cli(str(target))
    assert r.exit_code == 1 and "unsafe" in r.stdout and "posix.system" in r.stdout


def test_hostile_metadata(tmp_path: Path, marker: Path) -> None:
    root = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    (root / "iter_0000001" / ".metadata").write_bytes(hostile(marker, 4))
    _verdicts(root, str(root), ".metadata")
    report = scan_path(root / "iter_0000001", "ck")
    assert report.findings[0].path == "ck"


def test_pickle_hidden_after_a_valid_metadata(tmp_path: Path, marker: Path) -> None:
    ckpt = copy_of(SAMPLES / "torch_dist_fully", tmp_path) / "iter_0000001"
    with open(ckpt / ".metadata", "ab") as f:
        f.write(hostile(marker, 4))
    report = scan_path(ckpt, "ck")
    assert_unsafe(report, ".metadata")
    meta = next(p for p in report.pickles if p.subject == ".metadata")
    assert meta.segments == 2
    assert len(items_of(ckpt)) + 1 <= report.pickles_scanned  # the items were still located and scanned


def test_hostile_common_pt(tmp_path: Path, marker: Path) -> None:
    root = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    (root / "iter_0000001" / "common.pt").write_bytes(torch_zip(hostile(marker), prefix="common"))
    _verdicts(root, str(root), "common.pt")
    assert scan_path(root, "save").findings[0].path == "save/iter_0000001"


@pytest.mark.parametrize("name", ["model_optim_rng.pt", "distrib_optim.pt"])
def test_hostile_legacy_file(name: str, tmp_path: Path, marker: Path) -> None:
    root = copy_of(SAMPLES / "legacy", tmp_path)
    (root / "iter_0000001" / "mp_rank_01_001" / name).write_bytes(
        torch_zip(hostile(marker, 2), prefix=name.removesuffix(".pt")))
    _verdicts(root, str(root), f"mp_rank_01_001/{name}")


def test_hostile_legacy_pre_zip_torch_save_stream(tmp_path: Path, marker: Path) -> None:
    # torch < 1.6 wrote a sequence of raw pickles: magic number, protocol, sys info, the state dict, storage keys.
    root = copy_of(SAMPLES / "legacy", tmp_path)
    stream = b"".join(pickle.dumps(x, protocol=2) for x in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}))
    stream += hostile(marker, 2) + pickle.dumps(["0"], protocol=2) + b"\x10\0\0\0\0\0\0\0" + b"\0" * 64
    (root / "iter_0000001" / "mp_rank_00_000" / "model_optim_rng.pt").write_bytes(stream)
    report = scan_path(root, "save")
    assert_unsafe(report, "mp_rank_00_000/model_optim_rng.pt")
    p = next(p for p in report.pickles if p.subject == "mp_rank_00_000/model_optim_rng.pt")
    assert p.segments == 5 and p.member is None


@pytest.mark.parametrize("root,key", [
    (SAMPLES / "torch_dist_fully", "rng_state/shard_0.0_1.2"),
    (SAMPLES / "torch_dist_fully", "decoder.layers.mlp.linear_fc1._extra_state/shard_0_2"),
    (SAMPLES / "dcp", "optimizer.param_groups.0.lr"),
    (FIXTURE_0192, "common_state/shard_0_1"),
    (FIXTURE_0192, "rng_state/shard_0.0_2.2"),
], ids=lambda x: x if isinstance(x, str) else x.name)
def test_hostile_byte_item_inside_distcp_same_length(root: Path, key: str, tmp_path: Path, marker: Path) -> None:
    save = copy_of(root, tmp_path)
    ckpt = next(p for p in sorted(save.iterdir()) if (p / ".metadata").is_file())
    if key not in items_of(ckpt):
        pytest.skip(f"{key} not in this sample")
    plant_same_length(ckpt, key, hostile(marker, 4))
    _verdicts(save, str(save), key)
    hit = next(f for f in scan_path(save, "s").findings if f.code == "CK601")
    assert hit.details["file"].endswith(".distcp") and hit.path == f"s/{ckpt.name}"


def test_hostile_byte_item_relaid_out_with_metadata_rewritten(tmp_path: Path, marker: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    key = "rerun_state_machine_state/shard_0_4"
    before = items_of(ckpt)
    plant_relaid(ckpt, key, hostile(marker, 4) * 3)  # a longer payload: later items move
    after = items_of(ckpt)
    assert after[key].length != before[key].length
    report = scan_path(save, "s")
    assert_unsafe(report, key)
    assert [f.code for f in report.findings] == ["CK601"]  # every other item still found where .metadata says
    assert report.pickles_scanned == expected_pickles(save)


def test_hostile_tensor_archive_inside_distcp(tmp_path: Path, marker: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    key = next(k for k, v in items_of(ckpt).items() if "@" in k and v.length > 1500)
    plant_same_length(ckpt, key, hostile(marker, 4))
    _verdicts(save, str(save), key)
    # the same through the audit-integration entry point
    ckpt_items = items_of(ckpt)
    report = scan_stored_items(ckpt, "ck", ckpt_items.items())
    assert_unsafe(report, key)
    assert all(f.code in ("CK601", "CK602", "CK603") for f in report.findings)


def test_hostile_latest_train_state_at_save_dir_root(tmp_path: Path, marker: Path) -> None:
    # Megatron-Bridge keeps its train state (the tracker variant) as a torch.save file next to the iteration dirs.
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    (save / "latest_train_state.pt").write_bytes(torch_zip(hostile(marker, 2), prefix="latest_train_state"))
    (save / "iter_0000001" / "train_state.pt").write_bytes(torch_zip(pickle.dumps({"step": 1}), prefix="ts"))
    report = scan_path(save, "save")
    assert_unsafe(report, "latest_train_state.pt")
    hit = next(f for f in report.findings if f.code == "CK601")
    assert hit.path == "save"
    assert report.pickles_scanned == expected_pickles(save)
    _verdicts(save, str(save), "latest_train_state.pt")


def test_hostile_archive_nested_in_an_archive_and_extra_pkl_member(tmp_path: Path, marker: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    inner = torch_zip(hostile(marker, 4), prefix="inner")
    outer = torch_zip(pickle.dumps({"ok": 1}, protocol=2), prefix="common",
                      extra={"common/extra/inner.pt": inner, "common/extra/state.pkl": hostile(marker, 0)})
    (save / "iter_0000001" / "common.pt").write_bytes(outer)
    report = scan_path(save, "s")
    subjects = {f.subject for f in report.findings if f.code == "CK601"}
    assert subjects == {"common.pt!common/extra/inner.pt", "common.pt!common/extra/state.pkl"}, report.findings
    assert report.status is Status.UNSAFE


def test_hostile_item_in_a_distcp_without_metadata(tmp_path: Path, marker: Path) -> None:
    # A save that crashed before .metadata: the data files are split at their zip end records and scanned anyway.
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    key = "rng_state/shard_0.0_1.2"
    item = plant_same_length(ckpt, key, hostile(marker, 4))
    clean = scan_path(save, "s")
    (ckpt / ".metadata").unlink()
    report = scan_path(save, "s")
    assert report.status is Status.UNSAFE
    hits = [f for f in report.findings if f.code == "CK601"]
    assert len(hits) == 1 and hits[0].details["offset"] == item.offset and hits[0].details["file"].endswith(item.file)
    # every archive is still found: all items but .metadata itself
    assert report.pickles_scanned == clean.pickles_scanned - 1


def test_unknown_global_is_a_warning_not_unsafe(tmp_path: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    # Referenced, never called (a class kept as a value). Issue 18: a CALLED unknown global is CK604 (unsafe),
    # see tests/hostile/test_hostile_verdict.py.
    payload = b"\x80\x02}X\x03\x00\x00\x00clscmy_private_pkg.module\nThing\ns."
    (save / "iter_0000001" / "common.pt").write_bytes(torch_zip(payload, prefix="common"))
    report = scan_path(save, "s")
    assert [f.code for f in report.findings] == ["CK602"]
    assert report.status is Status.COMPLETE
    assert run_cli(str(save)).exit_code == 0
    assert run_cli(str(save), "--fail-on", "warning").exit_code == 1


# --- broken and pathological input ------------------------------------------------------------------------------------


def test_resource_bounds_are_ck603_or_fail_closed(tmp_path: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    (ckpt / ".metadata").write_bytes(b"\x80\x04\x8d" + (100 << 30).to_bytes(8, "little") + b"abc.")
    blob = bytearray(torch_zip(b"\x80\x02K\x01.", prefix="common"))
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # data.pkl claims 4 GiB uncompressed
        k = blob.find(sig)
        blob[k + at : k + at + 4] = (0xFFFF_FFF0).to_bytes(4, "little")
    (ckpt / "common.pt").write_bytes(bytes(blob))
    report = scan_path(save, "s")
    codes = sorted(f.code for f in report.findings)
    # the absurd length claim in `.metadata` is the end of its data (CK603); common.pt's data.pkl was not inflated
    # past the bound, so it was never judged: fail closed (CK605, unsafe)
    assert codes == ["CK603", "CK605"], report.findings
    assert report.status is Status.UNSAFE
    assert run_cli(str(save)).exit_code == 1


def test_deep_nesting_pickles_walk_without_recursion(tmp_path: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    deep = b"\x80\x02" + b"(" * 100_000 + b"l" * 100_000 + b"."
    (save / "iter_0000001" / ".metadata").write_bytes(deep)
    (save / "iter_0000001" / "common.pt").write_bytes(torch_zip(b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."))
    report = scan_path(save, "s")
    # Walked without recursion to the end (issue 24: judged past the nesting bound), and the nesting is bounded for
    # the unpickler (issue 18): CK603 for both, nothing else.
    assert sorted(f.code for f in report.findings) == ["CK603", "CK603"], report.findings
    assert all("nesting deeper than" in (p.problem or "") for p in report.pickles if p.subject in (".metadata",
                                                                                                    "common.pt"))


@pytest.mark.parametrize("victim,code", [(".metadata", "CK106"), ("common.pt", "CK206"), ("__0_0.distcp", "CK202")])
def test_truncated_files_are_reported_with_the_reader_codes(victim: str, code: str, tmp_path: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    path = save / "iter_0000001" / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    report = scan_path(save, "s")
    assert code in {f.code for f in report.findings}, report.findings
    assert report.status is Status.CORRUPT
    assert run_cli(str(save), "-o", "json").exit_code == 1


def test_symlinks_loops_fifos_and_directories_do_not_hang(tmp_path: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    (ckpt / "loop").symlink_to(ckpt)  # a dir symlink loop
    (ckpt / "self.pt").symlink_to(ckpt / "self.pt")  # a file symlink loop
    (ckpt / "dangling.pt").symlink_to(tmp_path / "nowhere")
    (ckpt / "common.pt").unlink()
    (ckpt / "common.pt").mkdir()  # a directory where a file belongs
    os.mkfifo(ckpt / "fifo.pt")  # opening it for reading would block
    (ckpt / "empty.pt").write_bytes(b"")
    report = scan_path(save, "s")
    assert {f.subject for f in report.findings} == {"empty.pt"}
    assert report.findings[0].code == "CK206"


def test_single_file_and_metadata_paths(tmp_path: Path, marker: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    ckpt = save / "iter_0000001"
    r = scan_path(ckpt / ".metadata", "m")
    assert r.pickles_scanned == 1 and r.status is Status.COMPLETE
    (ckpt / "x.pkl").write_bytes(hostile(marker, 0))
    assert_unsafe(scan_path(ckpt / "x.pkl", "x"), "x.pkl")


# --- the CLI --------------------------------------------------------------------------------------------------------


def test_cli_clean_outputs_and_options(tmp_path: Path, marker: Path) -> None:
    save = copy_of(SAMPLES / "torch_dist_fully", tmp_path)
    r = run_cli(str(save))
    assert r.exit_code == 0 and "complete" in r.stdout and "pickle(s) scanned" in r.stdout
    doc = json.loads(run_cli(str(save), "-o", "json").stdout)
    assert {"schema_version", "tool", "status", "findings", "pickles_scanned", "pickles"} <= set(doc)
    assert doc["tool"] == "ckptinspect" and doc["status"] == "complete"
    assert doc["pickles_scanned"] == expected_pickles(save)
    (save / "iter_0000001" / "common.pt").write_bytes(torch_zip(hostile(marker), prefix="common"))
    assert run_cli(str(save), "--ignore", "CK6").exit_code == 0
    assert run_cli(str(save), "--select", "CK2").exit_code == 0
    assert run_cli(str(save), "--select", "CK601").exit_code == 1
    assert run_cli(str(save), "--fail-on", "never").exit_code == 0
    r = run_cli(str(save), "-o", "junit")
    assert r.exit_code == 1
    xml = ElementTree.fromstring(r.stdout.split("?>", 1)[1])
    assert any(f.get("type") == "CK601" for f in xml.iter("failure"))
    md = run_cli(str(save), "-o", "markdown")
    assert md.exit_code == 1 and md.stdout.startswith("## ckptinspect scan: `unsafe`")
    assert "| `iter_0000001/common.pt` | `common.pt` | posix.system |" in md.stdout
    ignored = json.loads(run_cli(str(save), "-o", "json", "--ignore", "CK601").stdout)
    assert ignored["status"] == "complete" and ignored["findings"] == []


def test_cli_usage_errors_are_exit_2(tmp_path: Path) -> None:
    assert run_cli(str(tmp_path / "missing")).exit_code == 2
    assert run_cli(str(tmp_path), "-o", "yaml").exit_code == 2
    assert run_cli(str(tmp_path), "--bogus").exit_code == 2


def test_cli_empty_dir_is_complete_with_nothing_scanned(tmp_path: Path) -> None:
    doc = json.loads(run_cli(str(tmp_path), "-o", "json").stdout)
    assert doc["pickles_scanned"] == 0 and doc["status"] == "complete"
