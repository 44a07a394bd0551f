"""Tests of `ckptinspect.services.integrity_verify`, `ckptinspect.commands.manifest` and `ckptinspect.checks.integrity` on a real Megatron-Core 0.19.2 checkpoint.

The fixture (written by megatron-core 0.19.2 with `--verify-integrity`) is copied to `tmp_path` for every negative
case; the read-only original is only ever verified, and is checked to be byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.checks import CheckContext
from ckptinspect.checks import integrity
from ckptinspect.errors import ReadError, UsageError
from ckptinspect.findings import CODES, Severity, Status
from ckptinspect.commands.manifest.manifest import write_manifest
from ckptinspect.commands.manifest.report import merge_reports
from ckptinspect.services.integrity_report import ManifestReport, sizes_from_report
from ckptinspect.services.integrity_verify import EMPTY_SHA256, manifest_is_stale, shard_of, verify_manifest
from ckptinspect.model import Checkpoint, Format

FIXTURE = Path(__file__).resolve().parents[3] / "sample_ckpts" / "mcore_0_19_2" / "iter_0000400"


# --- helpers ---------------------------------------------------------------------------------------------------------


class MegatronIntegrityError(Exception):
    """Stands in for megatron.core's CheckpointingException."""


def megatron_verify(checkpoint_dir: str) -> int:
    """Re-implementation of `_verify_integrity_manifest_impl` (megatron/core/dist_checkpointing/validation.py,
    non-MSC branch, reference §2). Returns the number of files verified; raises like Megatron does."""
    integrity_path = os.path.join(checkpoint_dir, "integrity.json")
    if not os.path.exists(integrity_path):
        raise MegatronIntegrityError(f"Integrity manifest not found at {integrity_path}.")
    with open(integrity_path) as f:
        manifest_data = json.load(f)
    algorithm = manifest_data.get("algorithm", "sha256")
    if algorithm != "sha256":
        raise MegatronIntegrityError(f"Unsupported hash algorithm in integrity manifest: {algorithm!r}.")
    mismatches = []
    for filename, expected_hash in manifest_data["files"].items():
        h = hashlib.sha256()
        try:
            with open(os.path.join(checkpoint_dir, filename), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except OSError as exc:
            mismatches.append(f"  {filename}: file missing or unreadable ({exc})")
            continue
        if h.hexdigest() != expected_hash:
            mismatches.append(f"  {filename}: hash mismatch")
    if mismatches:
        raise MegatronIntegrityError("\n".join(mismatches))
    return len(manifest_data["files"])


def tree_digest(root: Path) -> dict[str, tuple[str, int, float]]:
    """Every entry under `root`: (sha256, mode, mtime), to prove nothing was touched."""
    out: dict[str, tuple[str, int, float]] = {}
    for p in sorted(root.rglob("*")) + [root]:
        st = os.lstat(p)
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out[str(p.relative_to(root))] = (digest, st.st_mode, st.st_mtime)
    return out


def codes(report: ManifestReport) -> list[str]:
    return [f.code for f in report.findings]


def listed(ckpt: Path) -> dict[str, str]:
    files: dict[str, str] = json.loads((ckpt / "integrity.json").read_text())["files"]
    return files


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A writable copy of the fixture (mtimes preserved)."""
    dst = tmp_path / "iter_0000400"
    shutil.copytree(FIXTURE, dst)
    for p in [dst, *dst.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


# --- verify: the clean fixture ---------------------------------------------------------------------------------------


def test_fixture_verifies_clean_and_untouched() -> None:
    before = tree_digest(FIXTURE)
    report = verify_manifest(FIXTURE)
    assert tree_digest(FIXTURE) == before
    names = listed(FIXTURE)
    assert report.status is Status.COMPLETE
    assert report.findings == ()
    assert report.files_checked == len(names) == 10
    assert report.bytes_hashed == sum((FIXTURE / n).stat().st_size for n in names)
    assert [r.name for r in report.files] == list(names)
    assert all(r.ok and r.actual == names[r.name] for r in report.files)
    d = report.to_dict()
    assert {"status", "findings", "files_checked", "bytes_hashed"} <= d.keys()
    assert d["status"] == "complete" and d["findings"] == [] and d["shard"] is None
    json.dumps(d)


@pytest.mark.parametrize("workers", [1, 3, 32])
def test_worker_count_does_not_change_the_result(workers: int) -> None:
    base = verify_manifest(FIXTURE)
    other = verify_manifest(FIXTURE, workers=workers)
    assert other.files == base.files and other.bytes_hashed == base.bytes_hashed


def test_progress_hook_sums_to_bytes_hashed() -> None:
    calls: list[tuple[int, int, str]] = []
    report = verify_manifest(FIXTURE, progress=lambda a, t, d: calls.append((a, t, d)))
    assert sum(a for a, _, _ in calls) == report.bytes_hashed
    assert {t for _, t, _ in calls} == {report.bytes_hashed}


def test_agrees_with_megatron_on_the_fixture() -> None:
    assert megatron_verify(str(FIXTURE)) == verify_manifest(FIXTURE).files_checked


# --- verify: damaged files -------------------------------------------------------------------------------------------


def test_byte_flip_is_ck401(ckpt: Path) -> None:
    target = ckpt / "__3_0.distcp"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK401"]
    f = report.findings[0]
    expected, actual = listed(ckpt)["__3_0.distcp"], hashlib.sha256(data).hexdigest()
    assert f.subject == "__3_0.distcp" and f.severity is Severity.ERROR and f.path == str(ckpt)
    assert f.details["expected"] == expected[:16] and f.details["actual"] == actual[:16]
    assert f.details["expected_sha256"] == expected and f.details["actual_sha256"] == actual
    assert expected[:16] in f.message and actual[:16] in f.message
    assert report.status is Status.CORRUPT
    with pytest.raises(MegatronIntegrityError):
        megatron_verify(str(ckpt))


def test_truncation_is_ck401(ckpt: Path) -> None:
    target = ckpt / "__0_0.distcp"
    os.truncate(target, target.stat().st_size - 100)
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK401"] and report.status is Status.CORRUPT
    assert report.findings[0].details["size"] == target.stat().st_size


def test_truncated_to_zero_is_found_without_reading(ckpt: Path) -> None:
    os.truncate(ckpt / "__5_0.distcp", 0)
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK401"]
    assert report.findings[0].details["actual_sha256"] == EMPTY_SHA256
    assert report.bytes_hashed == sum(r.size or 0 for r in report.files)  # the empty file was not opened


def test_size_known_from_an_earlier_report_short_circuits_hashing(ckpt: Path) -> None:
    sizes = sizes_from_report(verify_manifest(ckpt).to_dict())
    assert sizes["__1_0.distcp"] == (ckpt / "__1_0.distcp").stat().st_size
    with open(ckpt / "__1_0.distcp", "ab") as f:
        f.write(b"x")
    report = verify_manifest(ckpt, known_sizes=sizes)
    assert codes(report) == ["CK401"]
    assert report.findings[0].details["expected_size"] == sizes["__1_0.distcp"]
    assert next(r for r in report.files if r.name == "__1_0.distcp").actual is None
    assert report.bytes_hashed == sum(v for k, v in sizes.items() if k != "__1_0.distcp")


def test_deleted_file_is_ck402(ckpt: Path) -> None:
    (ckpt / "__7_0.distcp").unlink()
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK402"] and report.status is Status.CORRUPT
    assert report.findings[0].subject == "__7_0.distcp"
    assert report.files_checked == 10


def test_extra_file_is_ck403_warning_only(ckpt: Path) -> None:
    (ckpt / "__8_0.distcp").write_bytes(b"stale leftover")
    (ckpt / "tokenizer").mkdir()  # sub-dirs are not Megatron manifest material: not reported
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK403"]
    assert report.findings[0].severity is Severity.WARNING and report.findings[0].subject == "__8_0.distcp"
    assert report.status is Status.COMPLETE


def test_listed_name_that_is_a_directory_is_ck402(ckpt: Path) -> None:
    (ckpt / "__2_0.distcp").unlink()
    (ckpt / "__2_0.distcp").mkdir()
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK402"] and "directory" in report.findings[0].message


def deny_reads(path: Path) -> None:
    """chmod 000 `path`; skip when that does not stop us (root with CAP_DAC_OVERRIDE reads anyway)."""
    path.chmod(0)
    try:
        path.open("rb").close()
    except PermissionError:
        return
    pytest.skip("chmod 000 does not deny reads here (root ignores modes); tests/acceptance/test_permissions.py runs these cases "
                "through the CLI as an unprivileged user")


def test_unreadable_file_is_ck209(ckpt: Path) -> None:
    """A listed file this user may not read is not verified, not broken (issue 25: CK209, incomplete; it was CK402,
    corrupt). tests/acceptance/test_permissions.py runs the same as an unprivileged user where the suite runs as root."""
    deny_reads(ckpt / "__4_0.distcp")
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK209"] and "Permission denied" in report.findings[0].message
    assert report.status is Status.INCOMPLETE


@pytest.mark.parametrize("kind", ["broken", "loop"])
def test_bad_symlink_is_ck402(ckpt: Path, kind: str) -> None:
    target = ckpt / "__4_0.distcp"
    target.unlink()
    if kind == "broken":
        target.symlink_to(ckpt / "nowhere")
    else:
        (ckpt / "loop").symlink_to(target)
        target.symlink_to(ckpt / "loop")
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK402"] and report.findings[0].subject == "__4_0.distcp"


def test_fifo_is_ck402_and_does_not_hang(ckpt: Path) -> None:
    (ckpt / "__6_0.distcp").unlink()
    os.mkfifo(ckpt / "__6_0.distcp")
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK402"] and "regular" in report.findings[0].message


def test_symlink_to_a_regular_file_is_followed(ckpt: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere.distcp"
    shutil.move(ckpt / "__6_0.distcp", moved)
    (ckpt / "__6_0.distcp").symlink_to(moved)
    assert verify_manifest(ckpt).findings == ()


# --- verify: the manifest itself -------------------------------------------------------------------------------------

GOOD = "0" * 64
BROKEN_MANIFESTS: dict[str, bytes] = {
    "garbage": b"{not json",
    "truncated": b'{"algorithm": "sha256", "files": {".metadata": "84f2',
    "not-utf8": b'{"files": {"\xff": "' + GOOD.encode() + b'"}}',
    "list": b"[]",
    "string": b'"sha256"',
    "no-files": b'{"algorithm": "sha256"}',
    "files-list": b'{"files": [".metadata"]}',
    "files-null": b'{"files": null}',
    "md5": b'{"algorithm": "md5", "files": {}}',
    "algorithm-null": b'{"algorithm": null, "files": {}}',
    "empty": b"",
    "whitespace": b" \n",
}


@pytest.mark.parametrize("content", BROKEN_MANIFESTS.values(), ids=BROKEN_MANIFESTS.keys())
def test_broken_manifest_is_ck404(ckpt: Path, content: bytes) -> None:
    (ckpt / "integrity.json").write_bytes(content)
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK404"] and report.status is Status.CORRUPT
    assert report.files_checked == 0 and report.bytes_hashed == 0


BAD_ENTRIES: dict[str, Any] = {
    "short-hex": "abc123",
    "upper-hex": "84F2790F19F7DCC96A3391A1D0B788E215856ED56F28464A2763635337B21478",
    "not-hex": "z" * 64,
    "number": 12,
    "null": None,
    "object": {"sha256": GOOD},
}


@pytest.mark.parametrize("value", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_malformed_entry_is_ck404_and_the_rest_is_verified(ckpt: Path, value: Any) -> None:
    files = listed(ckpt)
    files[".metadata"] = value
    (ckpt / "integrity.json").write_text(json.dumps({"algorithm": "sha256", "files": files}))
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK404"] and report.findings[0].subject == ".metadata"
    assert report.files_checked == 9


@pytest.mark.parametrize("name", ["../iter_0000400/.metadata", "/etc/hostname", ""])
def test_entry_escaping_the_dir_is_ck404_and_not_read(ckpt: Path, name: str) -> None:
    files = listed(ckpt)
    files[name] = GOOD
    (ckpt / "integrity.json").write_text(json.dumps({"files": files}))  # `algorithm` absent = sha256
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK404"] and report.files_checked == 10


def test_manifest_that_is_a_directory_is_ck404(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "integrity.json").unlink()
    (ckpt / "integrity.json").mkdir()
    assert codes(verify_manifest(ckpt)) == ["CK404"]
    assert codes(verify_manifest(ckpt, tmp_path)) == ["CK404"]


def test_manifest_that_is_a_fifo_is_ck404_without_hanging(ckpt: Path) -> None:
    (ckpt / "integrity.json").unlink()
    os.mkfifo(ckpt / "integrity.json")
    assert codes(verify_manifest(ckpt)) == ["CK404"]


def test_no_manifest_is_ck400_info(ckpt: Path) -> None:
    (ckpt / "integrity.json").unlink()
    report = verify_manifest(ckpt)
    assert codes(report) == ["CK400"] and report.findings[0].severity is Severity.INFO
    assert report.status is Status.COMPLETE and report.manifest_path is None


def test_explicit_manifest_missing_is_ck404(ckpt: Path, tmp_path: Path) -> None:
    assert codes(verify_manifest(ckpt, tmp_path / "nope.json")) == ["CK404"]


def test_explicit_manifest_elsewhere_and_empty_files_map(ckpt: Path, tmp_path: Path) -> None:
    other = tmp_path / "m.json"
    other.write_text('{"algorithm": "sha256", "files": {}}')
    report = verify_manifest(ckpt, other)
    assert report.files_checked == 0
    assert sorted(f.subject or "" for f in report.findings) == sorted(listed(ckpt))  # all CK403
    assert set(codes(report)) == {"CK403"} and report.status is Status.COMPLETE


def test_stale_manifest(ckpt: Path) -> None:
    meta = (ckpt / "metadata.json").stat().st_mtime
    assert not manifest_is_stale(ckpt, ckpt / "integrity.json")
    os.utime(ckpt / "integrity.json", (meta - 3600, meta - 3600))
    assert manifest_is_stale(ckpt, ckpt / "integrity.json")
    assert verify_manifest(ckpt).findings == ()  # stale by mtime but every digest matches: nothing to say
    os.truncate(ckpt / "__0_0.distcp", 10)
    expected = ["CK401", "CK405"] if "CK405" in CODES else ["CK401"]
    assert codes(verify_manifest(ckpt)) == expected


def test_verify_refuses_a_path_that_is_not_a_dir(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        verify_manifest(tmp_path / "missing")
    with pytest.raises(UsageError):
        verify_manifest(FIXTURE / ".metadata")


def test_dot_slash_keys_are_listed_names(ckpt: Path) -> None:
    files = {f"./{k}": v for k, v in listed(ckpt).items()}
    (ckpt / "integrity.json").write_text(json.dumps({"files": files}))
    assert verify_manifest(ckpt).findings == ()


# --- shards ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_cover_the_manifest_once(ckpt: Path, n: int) -> None:
    (ckpt / "extra.bin").write_bytes(b"unlisted")
    os.truncate(ckpt / "__2_0.distcp", 5)
    full = verify_manifest(ckpt)
    parts = [verify_manifest(ckpt, shard=(k, n)) for k in range(n)]
    names = [r.name for p in parts for r in p.files]
    assert sorted(names) == sorted(r.name for r in full.files)
    assert sum(p.files_checked for p in parts) == full.files_checked
    assert sum(p.bytes_hashed for p in parts) == full.bytes_hashed
    assert [p.shard for p in parts] == [(k, n) for k in range(n)]
    assert all("CK403" not in codes(p) for p in parts[1:])
    merged = merge_reports([p.to_dict() for p in reversed(parts)])
    assert merged.status is full.status is Status.CORRUPT
    assert sorted(codes(merged)) == sorted(codes(full)) == ["CK401", "CK403"]
    assert (merged.files_checked, merged.bytes_hashed) == (full.files_checked, full.bytes_hashed)
    assert merged.manifest_sha256 == full.manifest_sha256 is not None


def test_shard_assignment_is_stable() -> None:
    assert [shard_of(n, 4) for n in ("__0_0.distcp", ".metadata", "metadata.json")] == [
        int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") % 4
        for n in ("__0_0.distcp", ".metadata", "metadata.json")
    ]


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
def test_invalid_shard_is_a_usage_error(shard: tuple[int, int]) -> None:
    with pytest.raises(UsageError):
        verify_manifest(FIXTURE, shard=shard)


def test_merge_reports_missing_duplicate_and_inconsistent_shards(tmp_path: Path) -> None:
    parts = [verify_manifest(FIXTURE, shard=(k, 3)).to_dict() for k in range(3)]
    assert merge_reports(parts).status is Status.COMPLETE
    missing = merge_reports(parts[:2])
    assert codes(missing) == ["CK404"] and missing.findings[0].details["shard"] == [2, 3]
    assert missing.findings[0].path == missing.path == str(FIXTURE)
    assert missing.status is Status.CORRUPT
    assert codes(merge_reports(parts + parts[:1])) == ["CK404"]
    four = verify_manifest(FIXTURE, shard=(3, 4)).to_dict()
    assert "CK404" in codes(merge_reports(parts + [four]))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"files": dict(list(listed(FIXTURE).items())[:3])}))
    mixed = [*parts[:2], verify_manifest(FIXTURE, other, shard=(2, 3)).to_dict()]
    assert "CK404" in codes(merge_reports(mixed))
    assert codes(merge_reports([])) == ["CK404"]
    assert codes(merge_reports([{"status": "complete"}, *parts])) == ["CK404"]
    assert merge_reports([verify_manifest(FIXTURE).to_dict()]).status is Status.COMPLETE


def test_merge_reports_round_trips_through_json(ckpt: Path) -> None:
    (ckpt / "__1_0.distcp").unlink()
    parts = [json.loads(json.dumps(verify_manifest(ckpt, shard=(k, 2)).to_dict())) for k in range(2)]
    merged = merge_reports(parts)
    assert codes(merged) == ["CK402"] and merged.findings[0].path == str(ckpt)


# --- write -----------------------------------------------------------------------------------------------------------


def test_write_reproduces_megatrons_manifest_byte_for_byte(ckpt: Path) -> None:
    original = (ckpt / "integrity.json").read_bytes()
    written = write_manifest(ckpt)
    assert written.path == str(ckpt / "integrity.json")
    assert (ckpt / "integrity.json").read_bytes() == original
    assert written.files == tuple(listed(ckpt).items())
    assert written.bytes_hashed == sum((ckpt / n).stat().st_size for n, _ in written.files)


def test_write_to_another_file_leaves_the_checkpoint_alone(tmp_path: Path) -> None:
    before = tree_digest(FIXTURE)
    out = tmp_path / "copy.json"
    write_manifest(FIXTURE, out)
    assert out.read_bytes() == (FIXTURE / "integrity.json").read_bytes()
    assert tree_digest(FIXTURE) == before


def test_write_then_verify_round_trip_and_megatron_accepts_it(ckpt: Path) -> None:
    (ckpt / "__0_0.distcp").write_bytes(os.urandom(9 * 1024 * 1024 + 17))  # spans several read buffers
    (ckpt / "common.pt").write_bytes(b"")
    (ckpt / "ünïcode name.bin").write_bytes(b"\x00" * 10)
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "x.bin").write_bytes(b"nested")
    (ckpt / "link.bin").symlink_to(ckpt / "metadata.json")
    written = dict(write_manifest(ckpt).files)
    assert written["__0_0.distcp"] == hashlib.sha256((ckpt / "__0_0.distcp").read_bytes()).hexdigest()
    assert written["common.pt"] == EMPTY_SHA256 and "link.bin" in written
    assert "sub" not in written and "sub/x.bin" not in written and "integrity.json" not in written
    report = verify_manifest(ckpt)
    assert report.status is Status.COMPLETE and report.findings == ()
    assert report.files_checked == len(written) == megatron_verify(str(ckpt))


def test_write_is_atomic_and_leaves_no_temp_file(ckpt: Path, tmp_path: Path) -> None:
    entries_before = sorted(p.name for p in ckpt.iterdir())
    write_manifest(ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == entries_before
    with pytest.raises(OSError):
        write_manifest(ckpt, tmp_path / "no-such-dir" / "integrity.json")
    assert sorted(p.name for p in ckpt.iterdir()) == entries_before
    assert not list((tmp_path).glob("**/*.tmp"))


def test_write_excludes_the_out_file_and_refuses_non_dirs(ckpt: Path) -> None:
    written = write_manifest(ckpt, ckpt / "mine.json")
    assert "mine.json" not in dict(written.files) and "integrity.json" not in dict(written.files)
    assert verify_manifest(ckpt, ckpt / "mine.json").findings == ()  # nor is it reported unlisted
    with pytest.raises(UsageError):
        write_manifest(ckpt / ".metadata")


def test_write_raises_on_an_unhashable_listed_file(ckpt: Path) -> None:
    deny_reads(ckpt / "__0_0.distcp")
    with pytest.raises(ReadError):
        write_manifest(ckpt)


def test_recursive_keys(ckpt: Path) -> None:
    (ckpt / "tokenizer").mkdir()
    (ckpt / "tokenizer" / "vocab.json").write_text("{}")
    (ckpt / "modelopt_state").mkdir()
    (ckpt / "modelopt_state" / "integrity.json").write_text("{}")  # a nested checkpoint's own manifest is content
    (ckpt / "tokenizer" / "loop").symlink_to(ckpt, target_is_directory=True)  # not entered
    written = write_manifest(ckpt, recursive=True)
    keys = [k for k, _ in written.files]
    assert keys == sorted(keys, key=lambda k: str(ckpt / k))
    assert {"tokenizer/vocab.json", "modelopt_state/integrity.json"} <= set(keys)
    assert not any(k.startswith("tokenizer/loop") for k in keys) and "integrity.json" not in keys
    assert verify_manifest(ckpt).findings == ()
    assert megatron_verify(str(ckpt)) == len(keys)  # Megatron joins dir/name, so it checks nested keys too
    (ckpt / "tokenizer" / "vocab.json").write_text("{ }")
    assert codes(verify_manifest(ckpt)) == ["CK401"]


# --- the audit check -------------------------------------------------------------------------------------------------


def _ckpt(path: Path) -> Checkpoint:
    return Checkpoint(path=str(path), format=Format.TORCH_DIST)


def test_check_runs_on_dirs_only(ckpt: Path, tmp_path: Path) -> None:
    assert list(integrity.run(_ckpt(ckpt), CheckContext())) == []
    assert list(integrity.run(_ckpt(ckpt / ".metadata"), CheckContext())) == []
    (ckpt / "__3_0.distcp").unlink()
    found = list(integrity.run(_ckpt(ckpt), CheckContext(workers=1)))
    assert [f.code for f in found] == ["CK402"] and found[0].path == str(ckpt)
    other = tmp_path / "m.json"
    other.write_text("[]")
    assert [f.code for f in integrity.run(_ckpt(ckpt), CheckContext(manifest=other))] == ["CK404"]


def test_check_reports_progress(ckpt: Path) -> None:
    seen: list[int] = []
    # audit hashes only with --hash / --deep (issue 18): metadata-level by default, nothing read, no progress
    assert list(integrity.run(_ckpt(ckpt), CheckContext(progress=lambda a, t, d: seen.append(a)))) == []
    assert seen == []
    ctx = CheckContext(hash=True, progress=lambda a, t, d: seen.append(a))
    found: Iterator[Any] = integrity.run(_ckpt(ckpt), ctx)
    assert list(found) == [] and sum(seen) == verify_manifest(ckpt).bytes_hashed

