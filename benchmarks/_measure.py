"""Shared helper of the benchmark scripts: run a command in a fresh process, report wall time and peak RSS."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

# The wrapper runs the command as its child and reports the child's peak RSS (ru_maxrss of RUSAGE_CHILDREN).
_WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
r = subprocess.run(json.loads(sys.argv[1]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "rss_mb": ru.ru_maxrss / 1024, "cpu": ru.ru_utime + ru.ru_stime,
                  "rc": r.returncode, "stderr": r.stderr.decode(errors="replace")[-500:]}))
"""


def measure(cmd: list[str], repeat: int = 3, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Median wall time / peak RSS / CPU of `cmd` over `repeat` fresh runs."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps(cmd)], capture_output=True, text=True,
                             env={**os.environ, **(env or {})}, check=True)
        runs.append(json.loads(out.stdout))
    return {
        "wall": statistics.median(r["wall"] for r in runs),
        "rss_mb": statistics.median(r["rss_mb"] for r in runs),
        "cpu": statistics.median(r["cpu"] for r in runs),
        "rc": runs[-1]["rc"],
        "stderr": runs[-1]["stderr"],
    }


def load_note() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return ""
    cores = os.cpu_count() or 1
    return f"load average {one:.1f} on {cores} cores" + ("  (busy machine: timings are noisy)" if one > cores else "")
