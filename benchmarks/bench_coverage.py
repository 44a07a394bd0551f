"""Benchmark 2: the coverage check alone at 250k / 500k / 1M chunks — near-linear (2× chunks → ≤ 2.3× time).

Usage: python benchmarks/bench_coverage.py [--sizes 250000 500000 1000000]
Builds a chunk table shaped like a large Megatron run (1-D DistOpt buckets cut into irregular pieces per DP rank,
stacked (L, out, in) layer tensors split over TP) and times the check (`coverage.run`: the table screened at once,
the flagged and N-D tensors computed exactly) in-process; the exact per-tensor code over every tensor (`Chunk`s
made from the table's rows) is printed beside it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ckptinspect.checks import CheckContext  # noqa: E402
from ckptinspect.checks.coverage import run, tensor_coverage  # noqa: E402
from ckptinspect.model import Checkpoint, Chunk, Format, StoredItem  # noqa: E402
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry  # noqa: E402

_ITEM = StoredItem("__0_0.distcp", 0, 1)


def build(n_chunks: int, seed: int = 0) -> ChunkTable:
    rng = random.Random(seed)
    tensors: list[TensorEntry] = []
    # 60 %: 1-D buckets of 100k elements cut into irregular pieces (~20 per bucket, tiny padding pieces included)
    n1 = int(n_chunks * 0.6)
    while n1 > 0:
        k = min(20, n1)
        cuts = sorted(rng.sample(range(1, 100_000), k - 1))
        bounds = [0, *cuts, 100_000]
        tensors.append(TensorEntry(f"optimizer.bucket_{len(tensors)}", (100_000,), "float32",
                                   tuple(Chunk((a,), (b - a,), _ITEM) for a, b in zip(bounds, bounds[1:]))))
        n1 -= k
    # 40 %: stacked layers (L=64, 4096, 1024) split over TP=8 on axis 1: one chunk per (layer, tp)
    n2 = n_chunks - sum(len(t.chunks) for t in tensors)
    while n2 > 0:
        layers = min(64, max(1, n2 // 8))
        tensors.append(TensorEntry(f"decoder.layers.w{len(tensors)}", (layers, 4096, 1024), "bfloat16",
                                   tuple(Chunk((l, tp * 512, 0), (1, 512, 1024), _ITEM)
                                         for l in range(layers) for tp in range(8))))
        n2 -= layers * 8
    return ChunkTable.of(tensors)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000])
    a = ap.parse_args()
    results = []
    for n in a.sizes:
        table = build(n)
        ckpt = Checkpoint("bench", Format.TORCH_DIST, table=table)
        chunks = table.n_chunks
        t0 = time.perf_counter()
        found = list(run(ckpt, CheckContext()))
        dt = time.perf_counter() - t0
        assert not found, "the synthetic tensors tile exactly"
        t0 = time.perf_counter()
        bad = sum(not tensor_coverage(t).ok for t in table.tensors)
        exact = time.perf_counter() - t0
        assert bad == 0
        results.append((chunks, dt))
        print(f"{chunks:>10} chunks in {table.n_tensors:>6} tensors: check {dt:7.2f} s ({dt / chunks * 1e6:.2f} µs/chunk);"
              f" exact code on every tensor {exact:7.2f} s")
    ok = True
    for (c1, t1), (c2, t2) in zip(results, results[1:]):
        ratio = t2 / t1
        scale = c2 / c1
        verdict = "OK" if ratio <= 2.3 * scale / 2 else "MISSED"
        ok &= verdict == "OK"
        print(f"{c1} → {c2} chunks ({scale:.2f}×): time {ratio:.2f}×  (target ≤ {2.3 * scale / 2:.2f}×) {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
