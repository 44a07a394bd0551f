"""Benchmark: `watch`'s memory over a save dir that keeps receiving iterations (issue 29 §3: bounded memory however
long it runs).

Usage:
    python benchmarks/bench_watch_memory.py [--iterations 50] [--source sample_ckpts/torch_dist/iter_0000001]
        [--keep 0]

In a fresh child process (so the numbers are watch's alone), `ckptinspect.api.watch` follows an empty save dir
while iterations arrive one per poll: the poll's `sleep` hard-links the next copy of a real megatron-core iteration
(`--source`: by default the 0.16.1 TP2 × PP2 × DP2 sample, a 107 KB `.metadata`) into `iter_{n:07d}/` and points
the tracker at it; `--keep K` > 0 also deletes the iteration K back (a retention job). After every poll the child
records its current RSS (VmRSS) and its peak so far (VmHWM, /proc/self/status) and tracemalloc's current traced
size. Printed: those at 10 iterations and at the end, and the growth per iteration between them. Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, shutil, sys, tempfile, tracemalloc
from pathlib import Path
import ckptinspect
from ckptinspect.commands.watch import EventKind

source, total, keep = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
save = Path(tempfile.mkdtemp(prefix="bench_watch_")) / "run"
save.mkdir()
added = [0]
def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
def add(_seconds):
    n = added[0] + 1
    d = save / f"iter_{n:07d}"
    d.mkdir()
    for f in source.iterdir():
        os.link(f, d / f.name)
    (save / "latest_checkpointed_iteration.txt").write_text(str(n))
    if keep and (save / f"iter_{n - keep:07d}").exists():
        shutil.rmtree(save / f"iter_{n - keep:07d}")
    added[0] = n
tracemalloc.start()
rows, audited = [], 0
from ckptinspect.commands.watch import WatchOptions, follow
events = follow(save, str(save), WatchOptions(interval=0, max_polls=total + 1), sleep=add)
polls = 0
for e in events:
    if e.kind is EventKind.AUDITED:
        audited += 1
        assert e.status.value == "complete", e
        rows.append({"iterations": added[0], "audited": audited, "rss_mb": vm("VmRSS"), "hwm_mb": vm("VmHWM"),
                     "traced_mb": tracemalloc.get_traced_memory()[0] / 2**20})
shutil.rmtree(save.parent)
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--source", default=str(ROOT / "sample_ckpts" / "torch_dist" / "iter_0000001"))
    ap.add_argument("--keep", type=int, default=0)
    a = ap.parse_args()
    out = subprocess.run([sys.executable, "-c", _CHILD, a.source, str(a.iterations), str(a.keep)],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = json.loads(out.stdout)
    at = {r["iterations"]: r for r in rows}
    ten, last = at[10], rows[-1]
    for r in (ten, last):
        print(f"{r['iterations']:4d} iterations: RSS {r['rss_mb']:.1f} MB, peak RSS {r['hwm_mb']:.1f} MB, "
              f"tracemalloc current {r['traced_mb']:.2f} MB")
    span = last["iterations"] - 10
    print(f"growth 10 -> {last['iterations']}: peak RSS {last['hwm_mb'] - ten['hwm_mb']:+.1f} MB, traced "
          f"{(last['traced_mb'] - ten['traced_mb']) * 1024 / span:+.1f} KB per iteration"
          f" (keep {a.keep or 'all'})")


if __name__ == "__main__":
    main()
