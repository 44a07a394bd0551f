"""`--progress` (`ckptinspect/cli/progress_jsonl.py`, `cli/shell.py`): JSON-lines progress on stderr when it is not a
terminal, read from the stderr of real long commands run as subprocesses (`manifest verify` / `write`, `audit
--deep`, `diff --values`) over copies of the real samples; a bar (no JSON) on a terminal; nothing with `none` or
for short work. stdout stays the command's document."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES

M19 = SAMPLES / "mcore_0_19_2" / "iter_0000400"


def run(*args: str, interval: str | None = "0", stderr_tty: bool = False) -> tuple[int, str, str]:
    env = {**os.environ, "CKPTINSPECT_WIDTH": "120"}
    env.pop("CKPTINSPECT_PROGRESS_INTERVAL", None)
    if interval is not None:
        env["CKPTINSPECT_PROGRESS_INTERVAL"] = interval
    if not stderr_tty:
        p = subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, timeout=300,
                           env=env)
        return p.returncode, p.stdout, p.stderr
    master, slave = pty.openpty()
    try:
        p2 = subprocess.run([sys.executable, "-m", "ckptinspect", *args], stdout=subprocess.PIPE, stderr=slave,
                            text=True, timeout=300, env=env)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        return p2.returncode, p2.stdout, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def events(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line is one JSON event; they are in order, the bytes never go back, `done` comes last once."""
    out = [json.loads(line) for line in stderr.splitlines()]
    assert out and out[-1]["event"] == "done" and [e["event"] for e in out[:-1]] == ["progress"] * (len(out) - 1)
    for a, b in zip(out, out[1:]):
        if b["bytes_total"] == a["bytes_total"]:  # within a phase (each has its own total)
            assert b["bytes_done"] >= a["bytes_done"] and b["elapsed_s"] >= a["elapsed_s"]
    for e in out:
        assert set(e) == {"event", "command", "phase", "bytes_done", "bytes_total", "elapsed_s", "rate_bytes_per_s",
                          "eta_s"}
        assert 0 <= e["bytes_done"] <= e["bytes_total"]
        if e["rate_bytes_per_s"] is not None:
            assert e["eta_s"] is not None and e["eta_s"] >= 0
    return out


def test_manifest_verify_without_a_terminal_writes_json_lines(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(M19, ckpt)
    code, out, err = run("manifest", "verify", str(ckpt), "-o", "json")
    assert code == 0
    doc = json.loads(out)  # stdout is the document alone
    evs = events(err)
    assert {e["command"] for e in evs} == {"manifest verify"} and all(e["phase"].startswith("sha256") for e in evs)
    assert len(evs) >= 3  # interval 0: every call of the library's callback
    assert evs[-1]["bytes_done"] == evs[-1]["bytes_total"] == doc["bytes_hashed"] > 0
    assert evs[-1]["eta_s"] == 0


@pytest.mark.slow
def test_events_are_rate_limited(tmp_path: Path) -> None:
    """A 256 MiB file hashed by `manifest write`: with a 0.1 s interval, progress events are at least 0.1 s apart,
    and the first comes with the first bytes."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(M19, ckpt)
    (ckpt / "integrity.json").unlink()
    with open(ckpt / "big.bin", "wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
    code, out, err = run("manifest", "write", str(ckpt), "-o", "json", interval="0.1")
    assert code == 0 and json.loads(out)["bytes_hashed"] >= 256 << 20
    evs = events(err)
    progress = [e for e in evs if e["event"] == "progress"]
    assert len(progress) >= 2, evs  # hashing 256 MiB takes longer than 0.1 s on this machine
    assert all(b["elapsed_s"] - a["elapsed_s"] >= 0.099 for a, b in zip(progress, progress[1:])), progress
    assert evs[-1]["bytes_done"] == json.loads(out)["bytes_hashed"]
    assert evs[-1]["elapsed_s"] / 0.1 + 2 >= len(progress)


@pytest.mark.slow
def test_audit_deep_and_diff_values_report_their_bytes() -> None:
    code, out, err = run("audit", str(SAMPLES / "dcp"), "--deep", "-o", "json")
    assert code == 0 and json.loads(out)["status"] == "complete"
    evs = events(err)
    assert evs[-1]["command"] == "audit" and evs[-1]["bytes_done"] == evs[-1]["bytes_total"] > 0
    # with a manifest, two phases, each counted against its own total: the stored items read, then the files hashed
    code, out, err = run("audit", str(M19), "--deep", "-o", "json")
    assert code == 0
    evs = events(err)
    phases = [e["phase"].split()[0] for e in evs]
    assert phases[0] == "deep" and phases[-1] == "sha256" and phases == sorted(phases)
    last_deep = [e for e in evs if e["phase"] == "deep read"][-1]
    assert last_deep["bytes_done"] == last_deep["bytes_total"]
    assert evs[-1]["bytes_done"] == evs[-1]["bytes_total"] == sum(p.stat().st_size for p in M19.iterdir()
                                                                  if p.name != "integrity.json")
    a, b = SAMPLES / "torch_dist" / "iter_0000001", SAMPLES / "torch_dist" / "iter_0000002"
    code, out, err = run("diff", str(a), str(b), "--values", "-o", "json")
    assert code in (0, 1) and json.loads(out)["values"] is not None
    evs = events(err)
    assert {e["command"] for e in evs} == {"diff"} and evs[-1]["bytes_done"] == evs[-1]["bytes_total"] > 0


@pytest.mark.slow
def test_short_work_and_none_write_nothing_and_jsonl_can_be_forced(tmp_path: Path) -> None:
    assert run("audit", str(SAMPLES / "dcp"), "-o", "json")[2] == ""  # metadata-level: not long work
    assert run("diff", str(SAMPLES / "dcp"), str(SAMPLES / "dcp"), "-o", "json")[2] == ""
    code, out, err = run("audit", str(SAMPLES / "dcp"), "--deep", "-o", "json", "--progress", "none")
    assert code == 0 and err == "" and json.loads(out)["status"] == "complete"
    # on a terminal `auto` draws a bar (no JSON); `--progress jsonl` writes JSON lines there too
    code, out, err = run("manifest", "verify", str(M19), interval="0", stderr_tty=True)
    assert code == 0 and '"event"' not in err
    code, out, err = run("manifest", "verify", str(M19), "--progress", "jsonl", interval="0", stderr_tty=True)
    assert code == 0 and events(err.replace("\r\n", "\n"))[-1]["bytes_done"] > 0
    code, _, err = run("manifest", "verify", str(M19), "--progress", "sometimes")
    assert code == 2 and "Traceback" not in err


def test_the_api_takes_the_same_callback() -> None:
    """`ckptinspect.verify_manifest(..., progress=cb)`: cb(advance_bytes, total_bytes, description), the bytes adding
    up to what was hashed (the CLI's hooks are such callbacks)."""
    import ckptinspect

    calls: list[tuple[int, int, str]] = []
    r = ckptinspect.verify_manifest(M19, progress=lambda n, total, what: calls.append((n, total, what)))
    assert calls and sum(n for n, _, _ in calls) == r.report.bytes_hashed == calls[-1][1]
