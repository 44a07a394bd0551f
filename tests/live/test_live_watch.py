"""`watch` following a real megatron-core save (issue 29 §3 "Evidence"), and `--fail-fast` on a real iteration
broken while it is watched.

The save (`tests/support/live_save.py`: world size 1, iterations 1 and 2, plain `open()` writes) is stopped by the
gate (`tools/_write_gate.py`) just before iteration 2's `metadata.json` is created — its data files and
`.metadata` written, its final marker not. The watcher is the console script in a subprocess (`-o jsonl`, every
line validated against its schema), started as soon as the save dir exists. It must report iteration 1 complete and
audited, iteration 2 in flight, one `stalled` event (CK530) while the gate holds the save, then — released —
iteration 2 complete and audited and the tracker moved to 2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from live_save import GatedSave
from schemas import validate_document

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_ckpts" / "torch_dist"
IT1, IT2 = "iter_0000001", "iter_0000002"


class Watch:
    """`ckptinspect watch` in a subprocess; its JSON lines collected by a thread as they are printed."""

    def __init__(self, save: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckptinspect", "watch", str(save), "-o", "jsonl", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[dict[str, Any]] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def wait_for(self, event: str, name: str | None, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for d in list(self.lines):
                if d["event"] == event and (name is None or d["name"] == name):
                    return d
            if self.proc.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {event} {name} in {self.lines}; stderr: {self._stderr()}")

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._t.join(10)


@pytest.mark.live
def test_watch_follows_a_real_save_through_a_stall(tmp_path: Path) -> None:
    out = tmp_path / "save"
    save = GatedSave(out, tmp_path / "gate", stops=[(r"^metadata\.json$", None)], msc=False).start()
    watch = None
    try:
        deadline = time.monotonic() + 120
        while not out.is_dir():
            assert time.monotonic() < deadline and save.running(), save.tail()
            time.sleep(0.05)
        watch = Watch(out, "--interval", "0.2", "--stall-after", "3", "--timeout", "400")
        info = save.wait_stop(0, timeout=300)
        first = watch.wait_for("iteration_complete", IT1)
        assert first["status"] == "complete"
        watch.wait_for("audited", IT1)
        flight = watch.wait_for("iteration_in_flight", IT2)
        stall = watch.wait_for("stalled", IT2, timeout=60)
        assert "CK530" in stall["codes"] and stall["seconds"] >= 3, stall
        assert not any(d["event"] in ("iteration_complete", "audited") and d["name"] == IT2 for d in watch.lines)
        assert not (out / IT2 / "metadata.json").exists()  # the gate held it: the stall was real
        save.resume(info)
        save.wait()
        done = watch.wait_for("audited", IT2)
        assert done["status"] == "complete", done
        moved = [d["iteration"] for d in watch.lines if d["event"] == "tracker_moved"]
        deadline = time.monotonic() + 30
        while 2 not in moved and time.monotonic() < deadline:
            time.sleep(0.2)
            moved = [d["iteration"] for d in watch.lines if d["event"] == "tracker_moved"]
        assert moved[-1] == 2, watch.lines
    finally:
        save.end()
        if watch is not None:
            watch.stop()
    assert watch is not None
    for d in watch.lines:
        validate_document(d)
    kinds = [(d["event"], d["name"]) for d in watch.lines]
    assert kinds.count(("stalled", IT2)) == 1, kinds  # once per stall
    assert kinds.index(("iteration_in_flight", IT2)) < kinds.index(("stalled", IT2)) < kinds.index(
        ("iteration_complete", IT2)), kinds
    assert flight["codes"] and flight["status"] == "incomplete", flight
    assert not any(d["event"] == "error" for d in watch.lines), kinds


def test_fail_fast_on_an_iteration_broken_while_watched(tmp_path: Path) -> None:
    """A copy of the real torch_dist save dir whose iteration 3 lacks its `metadata.json` (a real save stopped
    there): watched with --fail-fast, a data file of iteration 3 is cut short, then the marker is written: the
    audit at the marker finds it corrupt and watch exits 1 at that event."""
    save = tmp_path / "run"
    shutil.copytree(SAMPLE, save)
    watch = Watch(save, "--interval", "0.1", "--fail-fast", "--timeout", "120")
    try:
        watch.wait_for("iteration_in_flight", "iter_0000003")
        with open(save / "iter_0000003" / "__5_1.distcp", "r+b") as f:
            f.truncate(500)
        shutil.copy2(save / IT1 / "metadata.json", save / "iter_0000003" / "metadata.json")
        rc = watch.proc.wait(60)
    finally:
        watch.stop()
    assert rc == 1
    last = watch.lines[-1]
    assert (last["event"], last["name"], last["status"]) == ("audited", "iter_0000003", "corrupt"), watch.lines
    assert "CK206" in last["codes"] or any(c.startswith("CK2") for c in last["codes"]), last
