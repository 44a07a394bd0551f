"""Benchmark: a save-dir audit holds one iteration's metadata at a time (issue 29, "Done when").

Builds save dirs of 25, 50, 100 and 200 iterations from one real iteration (default: the megatron-core 0.16.1 sample
`sample_ckpts/torch_dist/iter_0000001`, a 107 KB `.metadata` with 331 chunks, 29 tensors, 32 objects). Every file
is a hard link of the source's (disk use stays that of one iteration), except `common.pt`: each iteration gets its
own, rewritten with torch from the source's so that `iteration`, `args.consumed_train_samples` and the scheduler's
`num_steps` advance as in a real run (hard-linked copies of one `common.pt` would all say iteration 1: CK525 for
each). Then runs, in a fresh process per size (`_measure.measure`: ru_maxrss of the child), `ckptinspect audit --all`,
`ckptinspect ls` and plain `ckptinspect audit`, and prints peak RSS, wall, CPU and the growth ratio 25 -> 200 of
the peak (1.00 = independent of the iteration count). `--values` adds `audit --all --values` (every iteration's data
is read: slow).

    python benchmarks/bench_save_dir_memory.py [--sizes 25 50 100 200] [--repeat 1] [--source ITER_DIR] [--values]
        [--runs 'audit --all' ls]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# one Megatron common.pt per iteration k, from the source's (our own sample's file: torch.load of it is ours to trust)
_MANY = r"""
import sys, torch
src, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = torch.load(src, weights_only=False)
per = base["args"].consumed_train_samples // max(base["iteration"], 1)
for k in range(1, n + 1):
    sd = dict(base)
    args = type(base["args"])(**vars(base["args"]))
    args.iteration, args.consumed_train_samples = k, k * per
    sd["args"], sd["iteration"] = args, k
    sd["opt_param_scheduler"] = {**base["opt_param_scheduler"], "num_steps": k * per}
    torch.save(sd, f"{root}/iter_{k:07d}/common.pt")
"""


def build(source: Path, root: Path, n: int) -> Path:
    """A Megatron save dir of `n` iterations: hard links of `source`'s files, one real `common.pt` per iteration."""
    root.mkdir(parents=True)
    for k in range(1, n + 1):
        d = root / f"iter_{k:07d}"
        d.mkdir()
        for f in source.iterdir():
            if f.is_file() and f.name != "common.pt":
                os.link(f, d / f.name)
    subprocess.run([sys.executable, "-c", _MANY, str(source / "common.pt"), str(root), str(n)], check=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(n))
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--source", type=Path, default=ROOT / "sample_ckpts" / "torch_dist" / "iter_0000001")
    ap.add_argument("--values", action="store_true", help="also `audit --all --values` (reads every data file)")
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--runs", nargs="+", default=None, help="only these of: 'audit --all', ls, audit")
    a = ap.parse_args()
    md = (a.source / ".metadata").stat().st_size
    print(f"source {a.source} (.metadata {md / 1e3:.0f} KB); {load_note()}")
    runs = {"audit --all": ["audit", "--all"], "ls": ["ls"], "audit": ["audit"]}
    if a.values:
        runs["audit --all --values"] = ["audit", "--all", "--values"]
    if a.runs:
        runs = {k: v for k, v in runs.items() if k in a.runs or (a.values and "--values" in k)}
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    tmp = Path(tempfile.mkdtemp(prefix="bench_sdm_", dir=a.tmp))
    peaks: dict[str, dict[int, float]] = {name: {} for name in runs}
    try:
        for n in a.sizes:
            save = build(a.source, tmp / f"n{n}", n)
            for name, args in runs.items():
                r = measure([sys.executable, "-m", "ckptinspect", *args, str(save), "-o", "json"], a.repeat, env)
                if r["rc"] not in (0, 1):
                    raise SystemExit(f"{name} on {n} iterations: exit {r['rc']}: {r['stderr']}")
                peaks[name][n] = r["rss_mb"]
                print(f"{n:4d} iterations  {name:22s} peak RSS {r['rss_mb']:7.1f} MB  wall {r['wall']:6.2f} s  "
                      f"CPU {r['cpu']:6.2f} s  ({r['wall'] / n * 1e3:.0f} ms/iteration, exit {r['rc']})", flush=True)
            shutil.rmtree(save)
        lo, hi = min(a.sizes), max(a.sizes)
        for name, by in peaks.items():
            print(f"growth {lo} -> {hi} iterations, {name}: peak RSS {by[lo]:.1f} -> {by[hi]:.1f} MB = "
                  f"{by[hi] / by[lo]:.3f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
