"""Benchmark 4: `ckptinspect --version` and `sniff` wall time (target ≤ 0.3 s) and proof that torch is never imported.

Usage: python benchmarks/bench_startup.py [--repeat 5] [PATH]
Peer: the interpreter start alone (`python -c pass`), measured in the same run, to show what is ours.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path", nargs="?", default=str(ROOT / "sample_ckpts" / "torch_dist"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    base = measure([sys.executable, "-c", "pass"], a.repeat)
    rows = [
        ("python -c pass (peer: interpreter start)", base),
        ("ckptinspect --version", measure([sys.executable, "-m", "ckptinspect", "--version"], a.repeat)),
        ("ckptinspect sniff PATH", measure([sys.executable, "-m", "ckptinspect", "sniff", a.path], a.repeat)),
        ("ckptinspect sniff PATH -o json", measure([sys.executable, "-m", "ckptinspect", "sniff", a.path, "-o", "json"],
                                                   a.repeat)),
    ]
    print(load_note())
    print(f"{'command':45} {'wall s':>8} {'RSS MB':>8}  target")
    ok = True
    for name, r in rows:
        target = "" if name.startswith("python") else ("≤ 0.30 s " + ("OK" if r["wall"] <= 0.3 else "MISSED"))
        ok &= name.startswith("python") or r["wall"] <= 0.3
        print(f"{name:45} {r['wall']:8.3f} {r['rss_mb']:8.1f}  {target}")
    imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "ckptinspect", "sniff", a.path],
                         capture_output=True, text=True)
    torch_lines = [ln for ln in imp.stderr.splitlines() if ln.rstrip().endswith((" torch", "| torch"))]
    print("torch imported by sniff:", "YES" if torch_lines else "no")
    return 0 if ok and not torch_lines else 1


if __name__ == "__main__":
    raise SystemExit(main())
