"""Benchmark `ckptinspect values` against what users write today, and against hashing the same bytes.

Writes a real DCP checkpoint of ``--size-gb`` GiB with `torch.distributed.checkpoint.save` (``--ranks`` files, a mix
of bf16 weights and fp32 optimizer moments like a Megatron save: a third of the bytes bf16, two thirds fp32), warms
the page cache, then times in fresh processes, interleaved, ``--repeat`` rounds:

* `ckptinspect values DIR -o json` (every tensor: stats + fingerprint; `--workers` default = the cores);
* the torch script users write: `dcp.load` into a CPU state dict, then per tensor `isnan().any()`, `isinf().any()`,
  `norm()` (torch's own threads);
* `ckptinspect manifest verify DIR` (SHA-256 of every file, after `manifest write`): the hashing limit.

Prints wall time, peak RSS, CPU seconds, bytes/s per core and the ratios the value issue sets: values vs torch
(≥ 2× faster wall, ≤ 0.1× peak RSS) and values vs manifest verify throughput (≥ 0.8×). ``--sizes 1 2 4 8`` also
reports the growth of the values wall time with the size (linear: the time per GiB stays flat).

    python benchmarks/bench_values_scan.py [--size-gb 4] [--repeat 2] [--tmp DIR] [--sizes 1 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402

_WRITE = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
out, gib, ranks = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
total = int(gib * (1 << 30))
per_tensor = 64 << 20  # 64 MiB tensors
state = {}
i = 0
written = 0
while written < total:
    if i % 3 == 0:
        t = (torch.randn(per_tensor // 2 // 4096, 4096) * 0.02).to(torch.bfloat16)
        state[f"model.layers.{i}.weight"] = t
    else:
        state[f"optimizer.state.layers.{i}.exp_avg" + ("_sq" if i % 3 == 2 else "")] = (
            torch.rand(per_tensor // 4 // 4096, 4096) * 1e-4)
    written += state[list(state)[-1]].numel() * state[list(state)[-1]].element_size()
    i += 1
with warnings.catch_warnings():
    warnings.filterwarnings("ignore")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(out, thread_count=ranks), no_dist=True)
"""

_TORCH_SCAN = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
path = sys.argv[1]
md = dcp.FileSystemReader(path).read_metadata()
state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
         if isinstance(m, TensorStorageMetadata)}
with warnings.catch_warnings():
    warnings.filterwarnings("ignore")
    dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)
bad = 0
for k, t in state.items():
    if t.is_floating_point():
        bad += bool(t.isnan().any()) + bool(t.isinf().any())
        float(t.float().norm())
print(bad)
"""


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _warm(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(16 << 20):
                    pass


def _row(name: str, m: dict, nbytes: int) -> str:
    cores = os.cpu_count() or 1
    rate = nbytes / m["wall"] / 1e6
    return (f"| {name} | {m['wall']:.2f} | {m['rss_mb']:.0f} | {m['cpu']:.2f} | {rate:.0f} | "
            f"{nbytes / max(m['cpu'], 1e-9) / 1e6:.0f} | {rate / cores:.0f} |")


def bench(tmp: Path, gib: float, ranks: int, repeat: int) -> dict[str, dict]:
    ckpt = tmp / f"dcp_{gib:g}g"
    if not ckpt.exists():
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", _WRITE, str(ckpt), str(gib), str(ranks)], check=True)
        print(f"wrote {ckpt} ({_size(ckpt) / (1 << 30):.2f} GiB) in {time.perf_counter() - t:.0f} s", flush=True)
    manifest = tmp / f"manifest_{gib:g}g.json"
    if not manifest.exists():
        subprocess.run([sys.executable, "-m", "ckptinspect", "manifest", "write", str(ckpt), "--out", str(manifest)],
                       check=True, stdout=subprocess.DEVNULL)
    _warm(ckpt)
    cmds = {
        "ckptinspect values": [sys.executable, "-m", "ckptinspect", "values", str(ckpt), "-o", "json",
                               "--progress", "none"],
        "torch dcp.load + isnan/isinf/norm": [sys.executable, "-c", _TORCH_SCAN, str(ckpt)],
        "ckptinspect manifest verify (SHA-256)": [sys.executable, "-m", "ckptinspect", "manifest", "verify",
                                                  str(ckpt), "--manifest", str(manifest), "--progress", "none"],
    }
    runs: dict[str, list[dict]] = {k: [] for k in cmds}
    for _ in range(repeat):  # interleaved: each round runs every command once
        for name, cmd in cmds.items():
            m = measure(cmd, repeat=1)
            if m["rc"] not in (0, 1):
                raise SystemExit(f"{name} failed: {m['stderr']}")
            runs[name].append(m)
    return {k: min(v, key=lambda m: m["wall"]) for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--ranks", type=int, default=4, help="files written (DCP writer threads)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tmp", default=None, help="where to write the checkpoints (default: a temp dir, removed)")
    ap.add_argument("--sizes", type=float, nargs="*", default=(), help="also time values at these sizes (growth)")
    a = ap.parse_args()
    tmp = Path(a.tmp) if a.tmp else Path(tempfile.mkdtemp(prefix="bench_values_"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        print(load_note())
        best = bench(tmp, a.size_gb, a.ranks, a.repeat)
        nbytes = _size(tmp / f"dcp_{a.size_gb:g}g")
        print(f"\n{nbytes / (1 << 30):.2f} GiB, {os.cpu_count()} cores, best of {a.repeat} interleaved rounds\n")
        print("| command | wall s | peak RSS MB | CPU s | MB/s | MB per CPU-s | MB/s per core |")
        print("|---|---|---|---|---|---|---|")
        for name, m in best.items():
            print(_row(name, m, nbytes))
        v, t, h = (best[k] for k in best)
        print(f"\nvalues vs torch: {t['wall'] / v['wall']:.2f}x faster wall (target >= 2), "
              f"{v['rss_mb'] / t['rss_mb']:.3f}x peak RSS (target <= 0.1)")
        print(f"values vs manifest verify: {h['wall'] / v['wall']:.2f}x throughput (target >= 0.8); per CPU-second "
              f"{h['cpu'] / v['cpu']:.2f}x")
        growth = []
        for gib in a.sizes:
            m = bench(tmp, gib, a.ranks, 1)["ckptinspect values"]
            growth.append((gib, m["wall"]))
            shutil.rmtree(tmp / f"dcp_{gib:g}g", ignore_errors=True)
        if growth:
            print("\n| GiB | values wall s | s per GiB |\n|---|---|---|")
            for gib, w in growth:
                print(f"| {gib:g} | {w:.2f} | {w / gib:.2f} |")
        print(json.dumps({k: {"wall": m["wall"], "rss_mb": m["rss_mb"], "cpu": m["cpu"]} for k, m in best.items()}))
    finally:
        if not a.tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
