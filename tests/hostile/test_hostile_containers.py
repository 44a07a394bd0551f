"""Containers torch.load opens other than a `torch.save` zip (issue 24 §2): TorchScript archives, which `torch.load`
hands to `torch.jit.load` (it runs their TorchScript `__setstate__`; their `data.pkl` can be an allowlisted
create-and-fill), and pre-1.6 tar files (`_legacy_load` unpickles their `storages`, `tensors` and `pickle` members).

Each sample is first judged by ckptinspect (`audit` and `scan`: the payload's marker must not appear), then loaded by
the real loader in one subprocess (the marker must appear): the verdict is about what the loader really does.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.audit import audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.findings import Finding, Status
from fuzz_hostile_ops import op_tar_container, op_torchscript_member
from hostile_samples import (payload, relay_item, run_real_loaders, torch_save_bytes, torch_tar_bytes,
                             torchscript_bytes)

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_ckpts"
DCP_KEY = "lr_scheduler.last_epoch"  # a byte item of the DCP sample
UNSAFE_CODES = {"CK601", "CK604", "CK605", "CK606"}


@dataclass(frozen=True)
class Judged:
    path: Path  # what ckptinspect was pointed at
    marker: Path | None
    scan: tuple[Status, tuple[Finding, ...]]
    audit: tuple[Status, tuple[Finding, ...]]
    ran_before_loader: bool  # the marker existed after ckptinspect, before the real loader
    loader_error: str | None


def _state() -> dict[str, object]:
    import torch

    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "iteration": 3}


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Judged]:
    root = tmp_path_factory.mktemp("containers")
    built: dict[str, tuple[Path, Path | None, tuple[str, list[str]] | None]] = {}

    def copy(sample: str, name: str) -> Path:
        dst = root / name / Path(sample).name
        shutil.copytree(SAMPLES / sample, dst)
        return dst

    m = root / "ran-ts-file"
    (root / "ts.pt").write_bytes(torchscript_bytes(m))
    built["ts:file"] = (root / "ts.pt", m, ("torch.load", [str(root / "ts.pt")]))
    m = root / "ran-ts-common"
    ckpt = copy("torch_dist_fully/iter_0000001", "ts-common")
    (ckpt / "common.pt").write_bytes(torchscript_bytes(m))
    built["ts:common.pt"] = (ckpt, m, ("torch.load", [str(ckpt / "common.pt")]))
    m = root / "ran-ts-legacy"
    ckpt = copy("legacy/iter_0000001", "ts-legacy")
    target = ckpt / "mp_rank_00_000" / "model_optim_rng.pt"
    target.write_bytes(torchscript_bytes(m))
    built["ts:legacy"] = (ckpt, m, ("torch.load", [str(target)]))
    m = root / "ran-ts-distcp"
    ckpt = copy("dcp/step-10", "ts-distcp")
    relay_item(ckpt, DCP_KEY, torchscript_bytes(m))
    built["ts:distcp"] = (ckpt, m, ("dcp", [str(ckpt), DCP_KEY]))
    (root / "linear.pt").write_bytes(torchscript_bytes(None))
    built["ts:benign"] = (root / "linear.pt", None, ("torch.load", [str(root / "linear.pt")]))

    m = root / "ran-tar"
    (root / "hostile.tar.pt").write_bytes(torch_tar_bytes(_state(), payload(m)))
    built["tar:hostile"] = (root / "hostile.tar.pt", m, ("torch.load", [str(root / "hostile.tar.pt")]))
    m = root / "ran-tar-timeit"
    (root / "hostile-timeit.tar.pt").write_bytes(torch_tar_bytes(_state(), payload(m, "timeit")))
    built["tar:timeit"] = (root / "hostile-timeit.tar.pt", m, ("torch.load", [str(root / "hostile-timeit.tar.pt")]))
    benign = torch_tar_bytes(_state())
    (root / "benign.tar.pt").write_bytes(benign)
    built["tar:benign"] = (root / "benign.tar.pt", None, ("torch.load", [str(root / "benign.tar.pt")]))
    (root / "benign.zip.pt").write_bytes(torch_save_bytes(_state()))
    built["zip:benign"] = (root / "benign.zip.pt", None, None)
    with tarfile.open(root / "benign.tar.pt") as t:
        cut = t.getmember("storages").offset_data + 20
    (root / "truncated.pt").write_bytes(benign[:cut])
    built["tar:truncated"] = (root / "truncated.pt", None, ("torch.load", [str(root / "truncated.pt")]))

    verdicts = {}
    for name, (path, marker, _) in built.items():
        s, a = scan_path(path, "s"), audit(path)
        verdicts[name] = ((s.status, tuple(s.findings)), (a.status, tuple(a.findings)),
                          marker is not None and marker.exists())
    errors = run_real_loaders([job for _, _, job in built.values() if job is not None])
    return {name: Judged(path, marker, *verdicts[name], errors.get(job[1][0]) if job else None)
            for name, (path, marker, job) in built.items()}


def _codes(findings: tuple[Finding, ...]) -> set[str]:
    return {f.code for f in findings}


TORCHSCRIPT = ("ts:file", "ts:common.pt", "ts:legacy", "ts:distcp")


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCHSCRIPT)
def test_a_torchscript_archive_runs_under_torch_load_and_is_ck606(name: str, judged: dict[str, Judged]) -> None:
    j = judged[name]
    assert not j.ran_before_loader, "ckptinspect ran the payload"
    assert j.marker is not None and j.marker.exists(), f"the real loader did not run it: {j.loader_error}"
    for status, findings in (j.scan, j.audit):
        assert status is Status.UNSAFE, findings
        assert "CK606" in _codes(findings), findings
        msg = next(f.message for f in findings if f.code == "CK606")
        assert "torch.jit.load" in msg and "runs its code" in msg


@pytest.mark.slow
def test_the_disguised_data_pkl_alone_is_an_allowed_create_and_fill(judged: dict[str, Judged]) -> None:
    # Nothing but CK606 says anything: the pickles of the archive are inert to a pickle judge.
    for status, findings in (judged["ts:file"].scan, judged["ts:file"].audit):
        assert _codes(findings) == {"CK606"}, findings


@pytest.mark.slow
def test_a_benign_scripted_module_is_still_unsafe(judged: dict[str, Judged]) -> None:
    j = judged["ts:benign"]
    assert j.loader_error is None  # torch.load returns the ScriptModule (through torch.jit.load)
    for status, findings in (j.scan, j.audit):
        assert status is Status.UNSAFE and "CK606" in _codes(findings), findings


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tar:hostile", "tar:timeit"])
def test_a_tar_checkpoint_with_a_hostile_pickle_is_unsafe(name: str, judged: dict[str, Judged]) -> None:
    j = judged[name]
    assert not j.ran_before_loader, "ckptinspect ran the payload"
    assert j.marker is not None and j.marker.exists(), f"the real loader did not run it: {j.loader_error}"
    for status, findings in (j.scan, j.audit):
        assert status is Status.UNSAFE, findings
        assert _codes(findings) & {"CK601", "CK604"}, findings


@pytest.mark.slow
def test_a_benign_tar_written_in_torchs_layout_loads_and_is_judged_like_its_zip(judged: dict[str, Judged]) -> None:
    tar, zipped = judged["tar:benign"], judged["zip:benign"]
    assert tar.loader_error is None, tar.loader_error  # the real torch 2.13 loader takes the layout...
    code = ("import sys, torch; s = torch.load(sys.argv[1], weights_only=False); "
            "assert s['iteration'] == 3 and s['w'].tolist() == [[0, 1, 2], [3, 4, 5]], s")
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code, str(tar.path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-500:]  # ...and rebuilds the tensors from it
    assert tar.scan[0] is zipped.scan[0] is Status.COMPLETE, tar.scan
    assert not _codes(tar.audit[1]) & (UNSAFE_CODES | {"CK602", "CK603"}), tar.audit


@pytest.mark.slow
def test_a_truncated_tar_is_a_clean_corrupt(judged: dict[str, Judged]) -> None:
    j = judged["tar:truncated"]
    assert j.loader_error is not None  # torch.load fails on it too
    for status, findings in (j.scan, j.audit):
        assert status is Status.CORRUPT, findings
        assert "CK206" in _codes(findings)
        # says it is a tar that breaks off (before: "non-zip torch serialization is not supported")
        assert any("tar archive unreadable" in f.message for f in findings if f.code == "CK206"), findings
    result = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", str(j.path)], capture_output=True,
                            text=True, timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in result.stderr, result.stderr[-1000:]
    assert result.returncode == 1, (result.returncode, result.stdout[-500:], result.stderr[-500:])


# --- the fuzz operators of these containers (tests/support/fuzz_hostile_ops.py) ------------------------------------------------


def _applied(op: Any, want: str, tmp_path: Path) -> Path:
    """A copy of the legacy sample after `op`, with the first seed whose description contains `want`."""
    for seed in range(200):
        work = tmp_path / f"case{seed}"
        shutil.copytree(SAMPLES / "legacy" / "iter_0000001", work)
        files = sorted(p for p in work.rglob("*") if p.is_file())
        desc = op(random.Random(seed), work, None, files, [])
        if desc is not None and want in desc:
            return work
        shutil.rmtree(work)
    raise AssertionError(f"{op.__name__} never gave {want!r}")


def test_the_fuzz_torchscript_member_operator_is_ck606(tmp_path: Path) -> None:
    work = _applied(op_torchscript_member, "constants.pkl", tmp_path)
    for report in (scan_path(work, "s"), audit(work)):
        assert report.status is Status.UNSAFE and "CK606" in _codes(tuple(report.findings)), report.findings


@pytest.mark.parametrize("kind", ["evil-pickle", "evil-storages"])
def test_the_fuzz_tar_container_operator_with_a_payload_is_unsafe(kind: str, tmp_path: Path) -> None:
    work = _applied(op_tar_container, f"({kind})", tmp_path)
    for report in (scan_path(work, "s"), audit(work)):
        assert report.status is Status.UNSAFE, report.findings
        assert _codes(tuple(report.findings)) & {"CK601", "CK604"}, report.findings


def test_the_fuzz_tar_container_operator_keeps_a_benign_pickle_benign(tmp_path: Path) -> None:
    work = _applied(op_tar_container, "(benign)", tmp_path)
    assert not _codes(tuple(scan_path(work, "s").findings)) & (UNSAFE_CODES | {"CK206"})


def test_a_tar_pickle_stopped_by_a_scanner_bound_fails_closed(tmp_path: Path) -> None:
    """A tar's `pickle` member whose walk stops at the memo bound before its end was not judged: CK605 (unsafe), as
    the same pickle in a zip archive is, not CK603."""
    from fuzz_hostile_ops import tar_container

    memo_bomb = b"\x80\x04N" + b"r" + (0x7FFFFFF0).to_bytes(4, "little") + b"."
    path = tmp_path / "bound.pt"
    path.write_bytes(tar_container(memo_bomb))
    for r in (scan_path(path, "s"), audit(path)):
        assert r.status is Status.UNSAFE and "CK605" in _codes(tuple(r.findings)), r.findings
