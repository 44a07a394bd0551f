"""Benchmark the value scan (`ckptinspect.services.values`: statistics + fingerprint) against SHA-256 of the same
bytes, the hash `manifest verify` computes (hashlib, 4 MiB pieces, one thread per file).

For each dtype, builds ``--mib`` MiB of weight-like values in memory (normal, std 0.02, rounded to the dtype, no
torch; ``--data uniform`` takes uniformly random bit patterns instead: NaNs, Infs and subnormals everywhere, the
slow paths), then times, interleaved ``--repeat`` times (best of each kept, so a noisy neighbour hurts both sides
alike):

* ``sha256``: hashlib.sha256 over the buffer in 4 MiB pieces; with 2 threads each hashes one half;
* ``values``: `scan_run` over the same 4 MiB pieces (each piece a run at its global index), results merged; with
  2 threads each scans one half, and again with 2 forked processes (``procs``). Processes, because numpy's
  bundled OpenBLAS runs concurrent dgemm calls one at a time (measured: two threads calling it directly through
  ctypes, GIL released, are no faster than one), and the fingerprint is a dgemm.

and prints bytes/s (wall, and per CPU-second of the process) and the ratio values / sha256 (the issue's target:
>= 0.8 on 2 cores). On a shared machine the load average (printed) matters for the wall numbers: run it when it is
below the core count; the per-CPU-second ratio does not depend on the neighbours.

    python benchmarks/bench_values.py [--mib 512] [--dtypes bfloat16,float32] [--threads 1,2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptinspect.services import values  # noqa: E402
from ckptinspect.services.values import TensorValues, scan_run  # noqa: E402
from ckptinspect.services.values_stats import CODECS  # noqa: E402

MiB = 1 << 20
PIECE = 4 * MiB


def make_data(dtype: str, nbytes: int, kind: str, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    size = CODECS[dtype].itemsize
    n = nbytes // size
    if kind == "uniform":
        return rng.integers(0, 256, size=n * size, dtype=np.uint8).tobytes()
    out = np.empty(n, dtype=CODECS[dtype].bits)
    step = 1 << 24
    for p in range(0, n, step):
        f = (rng.standard_normal(min(step, n - p), dtype=np.float32) * np.float32(0.02))
        if dtype == "bfloat16":
            u = f.view(np.uint32)
            out[p : p + len(f)] = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
        elif dtype in ("float32", "float16", "float64"):
            out[p : p + len(f)] = f.astype(CODECS[dtype].typed).view(CODECS[dtype].bits)
        else:
            raise SystemExit(f"--data normal is for float dtypes, not {dtype}")
    return out.tobytes()


def sha_part(view: memoryview) -> str:
    h = hashlib.sha256()
    for o in range(0, len(view), PIECE):
        h.update(view[o : o + PIECE])
    return h.hexdigest()


def values_part(view: memoryview, dtype: str, shape: tuple[int, ...], first: int) -> TensorValues:
    size = CODECS[dtype].itemsize
    acc = TensorValues(dtype, shape)
    for o in range(0, len(view), PIECE):
        acc = acc.merge(scan_run(view[o : o + PIECE], dtype, shape, first + o // size))
    return acc


def in_threads(n: int, view: memoryview, work: Callable[[memoryview, int], object]) -> list[object]:
    """Split `view` into `n` piece-aligned parts and run `work(part, byte_offset)` on each in its own thread."""
    per = -(-len(view) // n // PIECE) * PIECE
    bounds = [(o, min(o + per, len(view))) for o in range(0, len(view), per)]
    out: list[object] = [None] * len(bounds)

    def run(i: int) -> None:
        a, b = bounds[i]
        out[i] = work(view[a:b], a)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bounds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


_DATA = b""  # the buffer forked worker processes scan (inherited, not copied: fork)


def _proc_values(job: tuple[str, tuple[int, ...], int, int]) -> TensorValues:
    dtype, shape, a, b = job
    return values_part(memoryview(_DATA)[a:b], dtype, shape, a // CODECS[dtype].itemsize)


def in_processes(pool: Any, n: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> list[TensorValues]:
    per = -(-nbytes // n // PIECE) * PIECE
    return list(pool.map(_proc_values, [(dtype, shape, o, min(o + per, nbytes)) for o in range(0, nbytes, per)]))


def main() -> None:
    global _DATA
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", choices=("normal", "uniform"), default="normal")
    ap.add_argument("--block", type=int, default=None, help="elements per block (default: values.BLOCK)")
    args = ap.parse_args()
    if args.block:
        values.BLOCK = args.block
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; numpy {np.__version__}; "
          f"block {values.BLOCK} elements; {args.mib} MiB per dtype, {args.data} data, best of {args.repeat}")
    # wall: what the target is about; per CPU-second: the same, independent of neighbours taking the cores
    # (not measured for worker processes: '-')
    print(f"{'dtype':<10} {'workers':>9} {'sha256 GB/s':>12} {'values GB/s':>12} {'ratio':>6}"
          f" {'sha256 GB/cpu-s':>16} {'values GB/cpu-s':>16} {'ratio':>6}")
    for dtype in args.dtypes.split(","):
        data = _DATA = make_data(dtype, args.mib * MiB, args.data)
        view = memoryview(data)
        size = CODECS[dtype].itemsize
        shape = (len(data) // size,)
        for nthreads in (int(t) for t in args.threads.split(",")):
            modes = ["threads"] + (["procs"] if nthreads > 1 else [])
            for mode in modes:
                pool = mp.get_context("fork").Pool(nthreads) if mode == "procs" else None
                best = {"sha256": float("inf"), "values": float("inf")}
                cpu = {"sha256": float("inf"), "values": float("inf")}
                parts: list[Any] = []
                for _ in range(args.repeat):
                    t0, c0 = time.perf_counter(), time.process_time()
                    in_threads(nthreads, view, lambda part, off: sha_part(part))
                    best["sha256"] = min(best["sha256"], time.perf_counter() - t0)
                    cpu["sha256"] = min(cpu["sha256"], time.process_time() - c0)
                    t0, c0 = time.perf_counter(), time.process_time()
                    if pool is None:
                        parts = in_threads(nthreads, view, lambda part, off: values_part(part, dtype, shape, off // size))
                    else:
                        parts = in_processes(pool, nthreads, len(data), dtype, shape)
                    best["values"] = min(best["values"], time.perf_counter() - t0)
                    cpu["values"] = min(cpu["values"], time.process_time() - c0)
                if pool is not None:
                    pool.close()
                    pool.join()
                merged = TensorValues(dtype, shape)
                for p in parts:
                    assert isinstance(p, TensorValues)
                    merged = merged.merge(p)
                assert merged.complete, "the scan missed elements"
                sha, val = len(data) / best["sha256"] / 1e9, len(data) / best["values"] / 1e9
                csha, cval = len(data) / cpu["sha256"] / 1e9, len(data) / cpu["values"] / 1e9
                cpu_cols = f" {csha:>16.3f} {cval:>16.3f} {cval / csha:>6.2f}" if pool is None else f" {csha:>16.3f} {'-':>16} {'-':>6}"
                print(f"{dtype:<10} {f'{nthreads} {mode}':>9} {sha:>12.3f} {val:>12.3f} {val / sha:>6.2f}{cpu_cols}",
                      flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
