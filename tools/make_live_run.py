"""A real megatron-core CPU training run that saves every iteration, followed by `ckptinspect watch`; prints the
watcher's memory as the run goes (issue 29 §3: "watch followed a real run of at least 20 iterations with constant
memory").

Usage:
    python tools/make_live_run.py OUT_DIR [--iterations 20] [--interval 0.5] [--tp 1 --pp 1 --dp 1]

The run is `tools/make_sample_ckpts.py`'s `make_checkpoint` (world size tp × pp × dp on CPU, a real training step
per iteration, a torch_dist save of iterations 1..N, each followed by the tracker) in its own process; the watcher
is the console script (`watch OUT_DIR -o jsonl`) in another, started as soon as OUT_DIR exists. Its RSS (VmRSS) and
peak (VmHWM) are read from /proc every 0.1 s; at every `audited` event the current values are recorded. Printed:
one row per audited iteration, then the peak RSS after a quarter of the iterations versus at the end. Exit 1 when
some iteration was not audited `complete`, or an `error` / `stalled` event appeared.

The saves are synchronous: `make_checkpoint` drives Megatron's async path only to leave a save half-finished
(`half_written`), not as a run-long `--async-save` loop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def _vm(pid: int) -> tuple[float, float] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    got = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in text.splitlines()
           if line.startswith(("VmRSS:", "VmHWM:"))}
    return got.get("VmRSS", 0.0), got.get("VmHWM", 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    a = ap.parse_args()
    if a.out.exists():
        sys.exit(f"{a.out} exists: give a new dir")
    code = (f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import make_sample_ckpts as m; "
            f"m.make_checkpoint({str(a.out)!r}, tp={a.tp}, pp={a.pp}, dp={a.dp}, "
            f"iterations=tuple(range(1, {a.iterations + 1})), train_iters={a.iterations + 5}, seed=1234, "
            f"timeout=3600)")
    log = open(a.out.parent / f"{a.out.name}.run.log", "wb")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True)
    while not a.out.is_dir():
        if run.poll() is not None:
            sys.exit(f"the run ended before writing {a.out}: see {log.name}")
        time.sleep(0.05)
    watch = subprocess.Popen([sys.executable, "-m", "ckptinspect", "watch", str(a.out), "-o", "jsonl",
                              "--interval", str(a.interval), "--stall-after", "600"],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows: list[dict[str, object]] = []
    events: list[dict[str, object]] = []
    peak = [0.0]

    def sample() -> None:
        while watch.poll() is None:
            got = _vm(watch.pid)
            if got:
                peak[0] = max(peak[0], got[1])
            time.sleep(0.1)

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            doc = json.loads(line)
            events.append(doc)
            if doc["event"] == "audited":
                rss, hwm = _vm(watch.pid) or (0.0, 0.0)
                rows.append({"name": doc["name"], "status": doc["status"], "rss_mb": rss, "hwm_mb": hwm})
                print(f"{doc['name']}  {doc['status']:<10} watcher RSS {rss:6.1f} MB  peak {hwm:6.1f} MB",
                      flush=True)

    threads = [threading.Thread(target=f, daemon=True) for f in (sample, read)]
    for t in threads:
        t.start()
    rc = run.wait()
    deadline = time.monotonic() + 60
    while len(rows) < a.iterations and time.monotonic() < deadline:
        time.sleep(0.2)
    watch.send_signal(signal.SIGINT)
    watch.wait(30)
    for t in threads:
        t.join(5)
    if rc != 0:
        print(f"the run failed (exit {rc}): see {log.name}")
        return 1
    bad = [e for e in events if e["event"] in ("error", "stalled")]
    incomplete = [r for r in rows if r["status"] != "complete"]
    q = max(1, a.iterations // 4)
    if len(rows) >= q:
        print(f"peak RSS after {q} audited iterations: {rows[q - 1]['hwm_mb']:.1f} MB; after {len(rows)}: "
              f"{rows[-1]['hwm_mb']:.1f} MB; whole run {peak[0]:.1f} MB; "
              f"in-flight events {sum(e['event'] == 'iteration_in_flight' for e in events)}")
    if bad or incomplete or len(rows) < a.iterations:
        print(f"not clean: {len(rows)} audited of {a.iterations}, {bad[:3]}, {incomplete[:3]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
