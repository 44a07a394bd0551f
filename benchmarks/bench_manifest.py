"""Benchmark `ckptinspect.services.integrity_verify.verify_manifest` against Megatron's serial verifier and `sha256sum`.

Creates ``--size-gb`` GiB of data in ``--files`` files (or takes the files of ``--dir``, read-only: the manifest is
then written to a temp dir), writes a manifest, warms the page cache, and times on the same files:

* ckptinspect `verify_manifest` (in-process, default workers unless ``--workers``);
* a serial re-implementation of Megatron-Core's `_verify_integrity_manifest_impl` (validation.py: one file after
  another, ``f.read(1 MiB)`` into ``hashlib.sha256``);
* single-core hashlib throughput: SHA-256 of one file with one thread, and of an in-memory buffer;
* ``sha256sum`` over the files (one subprocess, serial).

Then the peak RSS of a fresh subprocess running `verify_manifest` over the files. Targets: ckptinspect ≥
0.8 × cores × single-core throughput (≥ 1.6× the serial verifier on 2 cores), peak RSS < 200 MB.

Parallel speed-ups need idle cores: on a shared machine run it when the load average is well below the core count
(it is printed). The CPU-seconds column does not depend on the neighbours: ckptinspect should spend about the CPU
time of the serial verifier, only in less wall time.

    python benchmarks/bench_manifest.py [--size-gb 2] [--files 8] [--dir DIR] [--repeat 5] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptinspect.findings import Status  # noqa: E402
from ckptinspect.commands.manifest.manifest import write_manifest  # noqa: E402
from ckptinspect.services.integrity_hashing import default_workers  # noqa: E402
from ckptinspect.services.integrity_verify import verify_manifest  # noqa: E402

MiB = 1 << 20
GB = 1e9

# VmHWM (peak RSS of this process image) rather than ru_maxrss, which Linux carries over from the forked parent.
RSS_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from ckptinspect.services.integrity_verify import verify_manifest
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
base = hwm()
r = verify_manifest(Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"status": r.status.value, "bytes": r.bytes_hashed, "base_kib": base, "peak_kib": hwm()}))
"""


def make_files(root: Path, total: int, count: int) -> None:
    """`count` files of `total / count` bytes: a 4 MiB random block per file, repeated (fast to write)."""
    per = total // count
    for i in range(count):
        block = os.urandom(4 * MiB)
        with open(root / f"__{i}_0.distcp", "wb") as f:
            left = per
            while left > 0:
                left -= f.write(block[: min(left, len(block))])


def warm(paths: list[Path]) -> None:
    buf = bytearray(8 * MiB)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def megatron_serial_verify(ckpt_dir: Path, manifest: Path) -> int:
    """Megatron-Core `_verify_integrity_manifest_impl` + `_compute_file_hash` (non-MSC branch), minus the raise."""
    with open(manifest) as f:
        files: dict[str, str] = json.load(f)["files"]
    bad = 0
    for filename, expected in files.items():
        h = hashlib.sha256()
        with open(os.path.join(ckpt_dir, filename), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        bad += h.hexdigest() != expected
    if bad:
        raise SystemExit(f"serial verifier: {bad} mismatches")
    return len(files)


def hash_one_file(path: Path) -> None:
    h = hashlib.sha256()
    buf = bytearray(4 * MiB)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])


def cpu_seconds() -> float:
    """CPU time (user + sys) of this process and its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best_times(repeat: int, fns: dict[str, Callable[[], object]]) -> dict[str, tuple[float, float]]:
    """(best wall time, CPU time of that run) of each function over `repeat` rounds. Rounds interleave the methods
    so that a noisy neighbour slows all of them alike; CPU time shows the work done, whatever the contention."""
    best = {name: (float("inf"), 0.0) for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            c0, t0 = cpu_seconds(), time.perf_counter()
            fn()
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            if wall < best[name][0]:
                best[name] = (wall, cpu)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0, help="GiB of data to create (default 2)")
    ap.add_argument("--files", type=int, default=8, help="number of files to create (default 8)")
    ap.add_argument("--dir", type=Path, help="use the files of this dir instead (read-only)")
    ap.add_argument("--tmp", type=Path, default=None, help="where to create the data (default: system temp)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement; the best is reported")
    ap.add_argument("--workers", type=int, default=None, help="verify_manifest workers (default: its default)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_manifest_", dir=args.tmp))
    try:
        if args.dir is not None:
            ckpt = args.dir
        else:
            ckpt = work / "ckpt"
            ckpt.mkdir()
            t0 = time.perf_counter()
            make_files(ckpt, int(args.size_gb * (1 << 30)), args.files)
            print(f"created {args.files} files, {args.size_gb:g} GiB in {time.perf_counter() - t0:.1f} s")
        manifest = work / "integrity.json"
        written = write_manifest(ckpt, manifest)
        paths = [ckpt / name for name, _ in written.files]
        total = written.bytes_hashed
        warm(paths)
        largest = max(paths, key=lambda p: p.stat().st_size)
        cores = default_workers()
        print(f"{len(paths)} files, {total / GB:.2f} GB, page cache warm, {cores} usable CPU(s), "
              f"verify workers={args.workers or cores}, load average {os.getloadavg()[0]:.2f}")

        def ours() -> None:
            r = verify_manifest(ckpt, manifest, workers=args.workers)
            if r.status is not Status.COMPLETE or r.bytes_hashed != total:
                raise SystemExit(f"verify_manifest: {r.status.value}, {r.bytes_hashed} bytes")

        mem = os.urandom(64 * MiB)
        fns: dict[str, tuple[Callable[[], object], int]] = {
            "ckptinspect verify_manifest": (ours, total),
            "Megatron serial verifier (1 MiB reads)": (lambda: megatron_serial_verify(ckpt, manifest), total),
            "sha256sum (serial subprocess)": (lambda: subprocess.run(
                ["sha256sum", *map(str, paths)], check=True, stdout=subprocess.DEVNULL), total),
            "hashlib 1 core, one file": (lambda: hash_one_file(largest), largest.stat().st_size),
            "hashlib 1 core, in memory": (lambda: hashlib.sha256(mem).digest(), len(mem)),
        }
        best = best_times(args.repeat, {name: fn for name, (fn, _) in fns.items()})
        rate = {name: n / best[name][0] / GB for name, (_, n) in fns.items()}
        serial = rate["Megatron serial verifier (1 MiB reads)"]
        single = rate["hashlib 1 core, one file"]
        print(f"\n{'method':<42}{'wall s':>8}{'CPU s':>8}{'GB/s':>8}{'vs serial':>11}")
        for name, (_, n) in fns.items():
            wall, cpu = best[name]
            print(f"{name:<42}{wall:>8.3f}{cpu:>8.3f}{rate[name]:>8.2f}{rate[name] / serial:>10.2f}x")
        ours_rate = rate["ckptinspect verify_manifest"]
        print(f"\nckptinspect / serial verifier: {ours_rate / serial:.2f}x "
              f"(target >= {0.8 * cores:.1f}x on {cores} core(s))")
        print(f"ckptinspect / (cores x single-core): {ours_rate / (cores * single):.2f} (target >= 0.80)")

        out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(ckpt), str(manifest),
                              str(Path(__file__).resolve().parents[1])], check=True, capture_output=True, text=True)
        rss = json.loads(out.stdout)
        print(f"peak RSS of a verify_manifest subprocess: {rss['peak_kib'] / 1024:.1f} MiB "
              f"(after imports {rss['base_kib'] / 1024:.1f} MiB; target < 200 MB), status {rss['status']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
