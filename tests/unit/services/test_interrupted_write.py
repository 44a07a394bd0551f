"""Interrupted writes leave nothing behind that poisons the next run (issue 25 §3).

`manifest write` writes a temp file beside the target, fsyncs it and renames it over the target. These tests really
SIGKILL a `python -m ckptinspect manifest write` subprocess: in its write window (its `os.fsync` is slowed from
outside by a wrapper, so the window is wide enough to hit on a loaded machine; the CLI code is unchanged), and at
random moments. After every kill: the old manifest is intact (or still absent), the leftover temp file is reported
by `manifest verify` and `audit` (CK406, a warning, never CK403), the next `manifest write` never lists it and
removes it, and Megatron's own verifier accepts the result. Into object storage the manifest is one PUT: a killed
write leaves no temp object and never a partial manifest (moto's S3 server).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from s3_server import S3Server, s3_server, upload  # noqa: F401 - the fixture
from test_manifest import megatron_verify

REPO = Path(__file__).resolve().parents[3]
ITER = REPO / "sample_ckpts" / "mcore_0_19_2" / "iter_0000400"
TEMP = re.compile(r"^\.integrity\.json\.[0-9]+\.[0-9a-f]{8}\.tmp$")

# The real CLI, with `os.fsync` slowed by SLOW_FSYNC seconds: a disk (or NFS server) slow to commit the temp file.
SLOW_CLI = """
import os, runpy, sys, time
_fsync = os.fsync
def slow_fsync(fd):
    time.sleep(float(os.environ["SLOW_FSYNC"]))
    return _fsync(fd)
os.fsync = slow_fsync
sys.argv = ["ckptinspect"] + sys.argv[1:]
runpy.run_module("ckptinspect", run_name="__main__", alter_sys=True)
"""


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e.update(extra)
    return e


def cli(*args: str) -> tuple[int, dict[str, Any] | None, str]:
    p = subprocess.run([sys.executable, "-m", "ckptinspect", *args, "-o", "json"], capture_output=True, text=True,
                       env=env(), timeout=600, cwd=REPO)
    assert p.returncode != 3 and "internal error" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else None, p.stderr


def temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if TEMP.match(p.name))


def wait_for_temp(d: Path, proc: subprocess.Popen[bytes], timeout: float = 300) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = temps(d)
        if found:
            return found[0]
        assert proc.poll() is None, "the write finished before its temp file was seen"
        time.sleep(0.005)
    raise AssertionError("no temp file appeared")


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def fresh(tmp_path: Path, name: str, with_manifest: bool) -> Path:
    ckpt = tmp_path / name / ITER.name
    shutil.copytree(ITER, ckpt)
    if not with_manifest:
        (ckpt / "integrity.json").unlink()
    return ckpt


def assert_next_write_heals(ckpt: Path, leftover: str) -> None:
    """The leftover is reported, never listed, and gone after the next write; the result is a valid manifest."""
    code, doc, _ = cli("manifest", "verify", str(ckpt))
    assert doc is not None
    left = [f for f in doc["findings"] if f["code"] == "CK406"]
    assert [f["subject"] for f in left] == [leftover] and left[0]["severity"] == "warning"
    assert "CK403" not in {f["code"] for f in doc["findings"]}
    code, doc, _ = cli("audit", str(ckpt))
    assert doc is not None and "CK406" in {f["code"] for f in doc["findings"]}
    code, doc, err = cli("manifest", "write", str(ckpt))
    assert code == 0, err
    listed = json.loads((ckpt / "integrity.json").read_text())["files"]
    assert not [k for k in listed if TEMP.match(k)], sorted(listed)
    assert temps(ckpt) == []
    code, doc, _ = cli("manifest", "verify", str(ckpt))
    assert code == 0 and doc is not None and doc["findings"] == [] and doc["status"] == "complete"
    assert megatron_verify(str(ckpt)) == len(listed)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(4))
def test_a_write_killed_in_its_write_window(tmp_path: Path, trial: int) -> None:
    """Before: the leftover `.integrity.json.<pid>.<hex>.tmp` went unreported, and the next write listed it in
    `integrity.json` (deleting it later made the checkpoint corrupt, CK402)."""
    with_manifest = trial % 2 == 0  # a rewrite over Megatron's manifest, or the first write of one
    ckpt = fresh(tmp_path, f"t{trial}", with_manifest)
    before = (ckpt / "integrity.json").read_bytes() if with_manifest else None
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "manifest", "write", str(ckpt)],
                            env=env(SLOW_FSYNC="60"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        leftover = wait_for_temp(ckpt, proc)
        time.sleep(random.Random(trial).uniform(0, 0.3))  # anywhere inside the (slowed) fsync
    finally:
        kill(proc)
    assert temps(ckpt) == [leftover]
    if before is None:
        assert not (ckpt / "integrity.json").exists()
    else:
        assert (ckpt / "integrity.json").read_bytes() == before  # atomic: the old manifest, whole
    assert_next_write_heals(ckpt, leftover)


@pytest.mark.slow
def test_writes_killed_at_random_moments(tmp_path: Path) -> None:
    """Kills anywhere in the run (listing, hashing, writing): the manifest is always the old one or a whole new one,
    and whatever is left is healed by the next write."""
    rng = random.Random(25)
    started = time.monotonic()
    run_slow(fresh(tmp_path, "timing", True)).wait(timeout=600)
    duration = time.monotonic() - started  # a whole run on this machine now
    killed = 0
    for trial in range(6):
        ckpt = fresh(tmp_path, f"r{trial}", trial % 2 == 0)
        before = (ckpt / "integrity.json").read_bytes() if (ckpt / "integrity.json").exists() else None
        proc = run_slow(ckpt)
        time.sleep(rng.uniform(0.0, 0.9 * duration))
        if proc.poll() is None:
            kill(proc)
            killed += 1
        now = (ckpt / "integrity.json").read_bytes() if (ckpt / "integrity.json").exists() else None
        assert now == before or (now is not None and json.loads(now)["algorithm"] == "sha256")
        left = temps(ckpt)
        assert len(left) <= 1
        if left:
            assert_next_write_heals(ckpt, left[0])
        else:
            code, _, err = cli("manifest", "write", str(ckpt))
            assert code == 0, err
            assert megatron_verify(str(ckpt)) > 0
    assert killed >= 3, f"only {killed} of 6 runs were still running when killed"


def run_slow(ckpt: Path) -> subprocess.Popen[bytes]:
    """`manifest write` whose fsync takes 0.2 s longer: the write window is a good part of the run."""
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, "manifest", "write", str(ckpt)],
                            env=env(SLOW_FSYNC="0.2"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_live_writers_temp_is_left_alone_and_never_listed(tmp_path: Path) -> None:
    """A temp file whose pid is a live process (a concurrent writer) is not removed; no temp is ever listed."""
    ckpt = fresh(tmp_path, "live", True)
    live = ckpt / f".integrity.json.{os.getpid()}.0123abcd.tmp"
    live.write_text("{}")
    other = ckpt / ".mine.json.999999999.89abcdef.tmp"  # another target's leftover (`--out mine.json`)
    other.write_text("{")
    code, doc, err = cli("manifest", "write", str(ckpt))
    assert code == 0, err
    listed = json.loads((ckpt / "integrity.json").read_text())["files"]
    assert live.name not in listed and other.name not in listed
    assert live.exists() and other.exists()  # neither is a dead writer of integrity.json
    code, doc, _ = cli("manifest", "verify", str(ckpt))
    assert code == 0 and doc is not None and sorted(f["code"] for f in doc["findings"]) == ["CK406", "CK406"]
    code, doc, err = cli("manifest", "write", str(ckpt), "--out", str(ckpt / "mine.json"))
    assert code == 0 and not other.exists() and live.exists(), err


# --- object storage ------------------------------------------------------------------------------------------------


def _keys(s3: S3Server, prefix: str) -> list[str]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1:] for o in listed.get("Contents", []))


def test_s3_write_lists_no_temp_and_a_killed_put_leaves_none(tmp_path: Path, s3_server: S3Server) -> None:  # noqa: F811
    """A checkpoint uploaded with a leftover temp file (a local write was killed, then the dir was synced): the
    write into the bucket does not list it, verify reports it (CK406). Kills during the PUT leave the manifest
    object absent or whole, and no temp object."""
    ckpt = fresh(tmp_path, "s3", False)
    (ckpt / ".integrity.json.999999999.0badcafe.tmp").write_text('{"algorithm": "sha256", "files": {')
    upload(s3_server, ckpt, "interrupted/ck")
    url = s3_server.url("interrupted/ck")
    code, _, err = cli("manifest", "write", url, "--out", f"{url}/integrity.json")
    assert code == 0, err
    body = s3_server.client.get_object(Bucket=s3_server.bucket, Key="interrupted/ck/integrity.json")["Body"].read()
    assert ".integrity.json.999999999.0badcafe.tmp" not in json.loads(body)["files"]
    code, doc, _ = cli("manifest", "verify", url)
    assert code == 0 and doc is not None and [f["code"] for f in doc["findings"]] == ["CK406"]
    rng = random.Random(3)
    started = time.monotonic()
    s3_write(s3_server, tmp_path, "interrupted/timing").wait(timeout=600)
    duration = time.monotonic() - started
    killed = 0
    for trial in range(4):
        prefix = f"interrupted/k{trial}"
        upload(s3_server, fresh(tmp_path, f"k{trial}", False), prefix)
        before = _keys(s3_server, prefix)
        proc = s3_write(s3_server, tmp_path, prefix, upload_first=False)
        time.sleep(rng.uniform(0.0, 0.9 * duration))
        if proc.poll() is None:
            kill(proc)
            killed += 1
        after = _keys(s3_server, prefix)
        assert set(after) - set(before) <= {"integrity.json"}, after
        if "integrity.json" in after:
            got = s3_server.client.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/integrity.json")["Body"].read()
            assert set(json.loads(got)["files"]) == set(before)
    assert killed >= 2, f"only {killed} of 4 writes were still running when killed"


def s3_write(s3: S3Server, tmp_path: Path, prefix: str, upload_first: bool = True) -> subprocess.Popen[bytes]:
    if upload_first:
        upload(s3, fresh(tmp_path, prefix.replace("/", "-"), False), prefix)
    target = s3.url(prefix)
    return subprocess.Popen([sys.executable, "-m", "ckptinspect", "manifest", "write", target, "--out",
                             f"{target}/integrity.json"], env=env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
