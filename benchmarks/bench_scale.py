"""Benchmark 6: `audit` from 1M to 10M chunks — time and peak RSS per doubling, and torch where it fits.

Usage:
    python tools/make_synthetic_ckpt.py /tmp/c1m --chunks 1000000     # likewise 2M, 4M, 10M (streamed pickle)
    nice -n 10 python benchmarks/bench_scale.py /tmp/c1m /tmp/c2m /tmp/c4m /tmp/c10m [--torch-max-chunks 1100000]

For every checkpoint dir (in the order given: growing sizes) it runs `python -m ckptinspect audit DIR -o json` in a
fresh process and reports wall time and peak RSS (`_measure.measure`), then the ratio to the previous size scaled to
a doubling (target ≤ 2.2× per doubling). torch's `FileSystemReader.read_metadata()` runs only for checkpoints with
at most `--torch-max-chunks` chunks: it needs ~4.2 KB per chunk, and the machine is shared, so sizes where torch
would need more than the budget are not attempted — the script prints the extrapolation from the measured points
instead, and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402

TORCH = ("import sys, torch.distributed.checkpoint as dcp; md = dcp.FileSystemReader(sys.argv[1]).read_metadata(); "
         "print(sum(len(v.chunks) for v in md.state_dict_metadata.values() if hasattr(v, 'chunks')))")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--chunks", type=int, nargs="*", help="chunk count of each dir (default: read from .metadata size)")
    ap.add_argument("--torch-max-chunks", type=int, default=1_100_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    print(load_note())
    rows = []
    for i, d in enumerate(a.dirs):
        n = a.chunks[i] if a.chunks else None
        md_bytes = os.path.getsize(d / ".metadata")
        res = measure([sys.executable, "-m", "ckptinspect", "audit", str(d), "-o", "json"], repeat=a.repeat)
        row = {"dir": str(d), "chunks": n, "metadata_mb": round(md_bytes / 1e6, 1), "audit_s": round(res["wall"], 2),
               "audit_rss_mb": round(res["rss_mb"]), "audit_rc": res["rc"]}
        if n is not None and n <= a.torch_max_chunks:
            t = measure([sys.executable, "-c", TORCH, str(d)], repeat=a.repeat)
            row.update(torch_s=round(t["wall"], 2), torch_rss_mb=round(t["rss_mb"]), torch_rc=t["rc"],
                       wall_ratio=round(res["wall"] / t["wall"], 3), rss_ratio=round(res["rss_mb"] / t["rss_mb"], 3))
        rows.append(row)
        print(json.dumps(row), flush=True)
    for prev, cur in zip(rows, rows[1:]):
        if prev["chunks"] and cur["chunks"]:
            doublings = math.log2(cur["chunks"] / prev["chunks"])
            tr = (cur["audit_s"] / prev["audit_s"]) ** (1 / doublings)
            mr = (cur["audit_rss_mb"] / prev["audit_rss_mb"]) ** (1 / doublings)
            ok = "OK" if tr <= 2.2 and mr <= 2.2 else "MISSED"
            print(f"{prev['chunks']} -> {cur['chunks']}: per doubling time {tr:.2f}x, memory {mr:.2f}x "
                  f"(target <= 2.2x) {ok}")
    measured = [r for r in rows if "torch_rss_mb" in r and r["chunks"]]
    if measured:
        per_chunk = max(r["torch_rss_mb"] / r["chunks"] for r in measured)
        for r in rows:
            if "torch_rss_mb" not in r and r["chunks"]:
                print(f"torch not run at {r['chunks']} chunks: extrapolated from the measured points it would need "
                      f"~{per_chunk * r['chunks'] / 1024:.1f} GB")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
