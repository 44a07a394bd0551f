"""Benchmark 6: `audit` from 1M to 10M chunks — time and peak RSS per doubling, and torch where it fits.

Usage:
    python tools/make_synthetic_ckpt.py /tmp/c1m --chunks 1000000     # likewise 2M, 4M, 10M (streamed pickle)
    nice -n 10 python benchmarks/bench_scale.py /tmp/c1m /tmp/c2m /tmp/c4m /tmp/c10m \
        --chunks 1002101 1991861 3998381 10021181 [--torch-max-chunks 1100000 | --torch-cap-gb 19]

For every checkpoint dir (in the order given: growing sizes) it runs `python -m ckptinspect audit DIR -o json` in a
fresh process and reports wall time and peak RSS (`_measure.measure`), then the ratio to the previous size scaled to
a doubling (target ≤ 2.2× per doubling). torch's `FileSystemReader.read_metadata()` runs only for checkpoints with
at most `--torch-max-chunks` chunks: it needs ~4.2 KB per chunk, and the machine is shared, so sizes where torch
would need more than the budget are not attempted — the script prints the extrapolation from the measured points
instead, and says so. With `--torch-cap-gb G` torch runs at every size under an address-space limit of G GB: where
it needs more, it stops with `MemoryError` (the row says after how long and at what peak RSS) instead of pushing
the machine into the OOM killer; the script then names the largest size torch managed.
Time growth is printed for wall time and for CPU time (user + sys). `--repeat N` runs the audits round-robin over
the sizes N times and keeps each size's medians: this VM's CPU speed drifts by tens of percent within minutes, so
single runs put that drift between the sizes (one such series printed 2.68x for 1M -> 2M; interleaved medians of the
same code and files gave 1.84x).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402

TORCH = ("import sys, torch.distributed.checkpoint as dcp; md = dcp.FileSystemReader(sys.argv[1]).read_metadata(); "
         "print(sum(len(v.chunks) for v in md.state_dict_metadata.values() if hasattr(v, 'chunks')))")


def _capped(gb: float) -> str:
    """A prefix for TORCH's code that caps the process's address space at `gb` GB."""
    limit = int(gb * 1024**3)
    return f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--chunks", type=int, nargs="*",
                    help="chunk count of each dir, in order (the generator prints it; without it no growth is computed)")
    ap.add_argument("--torch-max-chunks", type=int, default=1_100_000)
    ap.add_argument("--torch-cap-gb", type=float,
                    help="run torch at every size, under an address-space limit of this many GB (RLIMIT_AS): "
                         "where it needs more it fails with MemoryError instead of taking the machine down")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    print(load_note())
    rows = []
    # --repeat N runs the sizes round-robin N times (1M, 2M, ..., 1M, 2M, ...) and keeps each size's medians: the
    # CPU speed of a shared VM drifts by tens of percent within minutes, and consecutive repeats of one size would
    # put that drift between the sizes.
    runs: dict[int, list[dict]] = {i: [] for i in range(len(a.dirs))}
    for _ in range(a.repeat):
        for i, d in enumerate(a.dirs):
            runs[i].append(measure([sys.executable, "-m", "ckptinspect", "audit", str(d), "-o", "json"], repeat=1))
    for i, d in enumerate(a.dirs):
        n = a.chunks[i] if a.chunks else None
        md_bytes = os.path.getsize(d / ".metadata")
        res = {k: statistics.median(r[k] for r in runs[i]) for k in ("wall", "cpu", "rss_mb")}
        row = {"dir": str(d), "chunks": n, "metadata_mb": round(md_bytes / 1e6, 1), "audit_s": round(res["wall"], 2),
               "audit_cpu_s": round(res["cpu"], 2), "audit_rss_mb": round(res["rss_mb"]),
               "audit_rc": max(r["rc"] for r in runs[i]),
               "audit_runs_s": [round(r["wall"], 2) for r in runs[i]]}
        if n is not None and (n <= a.torch_max_chunks or a.torch_cap_gb):
            code = TORCH if a.torch_cap_gb is None else _capped(a.torch_cap_gb) + TORCH
            t = measure([sys.executable, "-c", code, str(d)], repeat=a.repeat)
            row.update(torch_s=round(t["wall"], 2), torch_cpu_s=round(t["cpu"], 2), torch_rss_mb=round(t["rss_mb"]),
                       torch_rc=t["rc"])
            if t["rc"] == 0:
                row.update(wall_ratio=round(res["wall"] / t["wall"], 3),
                           rss_ratio=round(res["rss_mb"] / t["rss_mb"], 3))
            else:
                lines = t["stderr"].strip().splitlines()
                row["torch_error"] = lines[-1] if lines else f"exit {t['rc']}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    for prev, cur in zip(rows, rows[1:]):
        if prev["chunks"] and cur["chunks"] and cur["chunks"] > prev["chunks"]:
            doublings = math.log2(cur["chunks"] / prev["chunks"])
            tr = (cur["audit_s"] / prev["audit_s"]) ** (1 / doublings)
            cr = (cur["audit_cpu_s"] / prev["audit_cpu_s"]) ** (1 / doublings)
            mr = (cur["audit_rss_mb"] / prev["audit_rss_mb"]) ** (1 / doublings)
            ok = "OK" if max(tr, cr, mr) <= 2.2 else "MISSED"
            print(f"{prev['chunks']} -> {cur['chunks']}: per doubling wall {tr:.2f}x, CPU {cr:.2f}x, memory {mr:.2f}x "
                  f"(target <= 2.2x) {ok}")
    sized = [r for r in rows if r["chunks"]]
    if len(sized) > 1 and sized[-1]["chunks"] > sized[0]["chunks"]:
        first, last = sized[0], sized[-1]
        doublings = math.log2(last["chunks"] / first["chunks"])
        for what, pick in (("median", lambda r: r["audit_s"]), ("best run", lambda r: min(r["audit_runs_s"]))):
            print(f"{first['chunks']} -> {last['chunks']} ({doublings:.2f} doublings), {what}: time "
                  f"{(pick(last) / pick(first)) ** (1 / doublings):.2f}x, memory "
                  f"{(last['audit_rss_mb'] / first['audit_rss_mb']) ** (1 / doublings):.2f}x per doubling")
    for r in rows:
        if "torch_error" in r:
            print(f"torch failed at {r['chunks']} chunks after {r['torch_s']} s at {r['torch_rss_mb']} MB peak RSS "
                  f"(cap {a.torch_cap_gb} GB): {r['torch_error']}")
    ok_rows = [r for r in rows if r.get("torch_rc") == 0 and r["chunks"]]
    if ok_rows:
        top = max(ok_rows, key=lambda r: r["chunks"])
        print(f"largest size torch managed: {top['chunks']} chunks, {top['torch_s']} s, {top['torch_rss_mb']} MB")
    measured = [r for r in ok_rows if "torch_rss_mb" in r]
    if measured:
        per_chunk = max(r["torch_rss_mb"] / r["chunks"] for r in measured)
        for r in rows:
            if r.get("torch_rc") != 0 and r["chunks"]:
                what = "failed" if "torch_error" in r else "not run"
                print(f"torch {what} at {r['chunks']} chunks: extrapolated from the measured points it would need "
                      f"~{per_chunk * r['chunks'] / 1024:.1f} GB")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
