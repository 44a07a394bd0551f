"""A real megatron-core save run from the outside: slowed, or stopped at chosen points (`tools/_write_gate.py`).

`GatedSave` starts `tools/make_sample_ckpts.py`'s `make_checkpoint` in a subprocess (its own session, so every
process of the save — the rank workers and Megatron's forked writers — can be stopped and ended together) with
`CKPTINSPECT_WRITE_GATE` in its environment. The save dir gets iteration 1 (finished, tracked) and iteration 2,
the one the gate watches: its files, and the tracker write that follows it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
WATCHED = "iter_0000002"
TRACKER = "latest_checkpointed_iteration.txt"


class GatedSave:
    """One save of iterations 1 and 2 at world size 1 into `out`, with the gate's `stops` / `slow` on iteration 2;
    `msc` False is Megatron-LM's `--disable-msc` (plain `open()` writes instead of multistorageclient's atomic
    `.<name>.tmp` + rename). `format` "legacy": Megatron's `--ckpt-format torch` save (`mp_rank_00/`:
    `distrib_optim.pt` then `model_optim_rng.pt`, both `torch.save`) instead of torch_dist."""

    def __init__(self, out: Path, gate_dir: Path, stops: list[tuple[str, int | None]] | None = None,
                 slow: dict[str, float] | None = None, msc: bool = True, format: str = "torch_dist") -> None:
        self.out, self.gate_dir, self.msc, self.format = out, gate_dir, msc, format
        gate_dir.mkdir(parents=True, exist_ok=True)
        self.config = {"watch": [WATCHED, TRACKER], "stops": [list(s) for s in (stops or [])],
                       "slow": slow or {}, "dir": str(gate_dir)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = gate_dir / "save.log"

    def start(self) -> GatedSave:
        code = (f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import make_sample_ckpts as m; "
                f"m.make_checkpoint({str(self.out)!r}, format={self.format!r}, tp=1, pp=1, dp=1, iterations=(1, 2), "
                f"seed=1234, timeout=600, msc={self.msc!r})")
        env = {**os.environ, "CKPTINSPECT_WRITE_GATE": json.dumps(self.config), "PYTHONWARNINGS": "ignore"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=str(ROOT))
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_stop(self, index: int, timeout: float = 120.0) -> dict[str, Any]:
        """The marker of stop `index` once its process is stopped (raises when the save ends or time runs out)."""
        marker = self.gate_dir / f"stop-{index}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.exists():
                info: dict[str, Any] = json.loads(marker.read_text())
                if _stopped(int(info["pid"])):
                    return info
            elif not self.running():
                raise RuntimeError(f"the save ended before stop {index}: {self.tail()}")
            time.sleep(0.02)
        raise TimeoutError(f"stop {index} not reached in {timeout:.0f} s: {self.tail()}")

    def resume(self, info: dict[str, Any]) -> None:
        os.kill(int(info["pid"]), signal.SIGCONT)

    def wait(self, timeout: float = 300.0) -> None:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        if rc != 0:
            raise RuntimeError(f"the save failed (exit {rc}): {self.tail()}")

    def end(self) -> None:
        """End every process of the save (its session): continued first, so a stopped one can take the signal."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
        self.proc.wait(30)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state T in /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"


def observe_each_stop(save: GatedSave, n: int, observe: Any, keep_root: Path | None = None,
                      timeout: float = 120.0) -> list[Any]:
    """Run a started gated save through its `n` stops: at each, `observe(save.out)`, and copy the save dir to
    `keep_root / f"state{i}"` (times kept) when given; then once more when the save is done. Always ends the save."""
    import shutil

    seen = []
    try:
        for i in range(n):
            info = save.wait_stop(i, timeout=timeout)
            seen.append(observe(save.out))
            if keep_root is not None:
                shutil.copytree(save.out, keep_root / f"state{i}", symlinks=True)  # copy2: the times are kept
            save.resume(info)
        save.wait()
    finally:
        save.end()
    seen.append(observe(save.out))
    return seen
