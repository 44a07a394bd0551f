#!/usr/bin/env python3
"""Benchmark a checkpoint inspector against torch's own ``.metadata`` loading.

For a torch_dist / DCP checkpoint directory it measures, each in fresh processes:

* **torch**: ``FileSystemReader(dir).read_metadata()`` (the reference: a plain
  ``pickle.load`` of ``.metadata``), as a whole ``python`` process, i.e. including
  interpreter start-up, ``import torch`` and teardown of the loaded object graph;
* every ``--cmd`` (default: ``python -m ckptinspect audit DIR --output json``).

Each run happens under its own fresh wrapper process that starts the command, waits for
it and reports the wall time and ``getrusage(RUSAGE_CHILDREN)`` (peak RSS of the command,
user/sys CPU).  Runs are interleaved (torch, cmd, torch, cmd, ...) ``--repeat`` times and
the median is reported, with the ratios command/torch.  A failing command is reported
with its exit code and the tail of its stderr; the benchmark itself still completes.

Examples::

    python benchmarks/bench_read_metadata.py /path/to/iter_0000100
    python benchmarks/bench_read_metadata.py --generate 200000 --repeat 3
    python benchmarks/bench_read_metadata.py --generate 200000 --generator other --gen-arg=--protocol=5
    python benchmarks/bench_read_metadata.py --generate 100000 --generator real_dcp   # torch's dcp.save itself
    python benchmarks/bench_read_metadata.py --generate 100000 --generator mcore      # megatron-core's own save
    python benchmarks/bench_read_metadata.py CKPT --cmd '{python} -c pass' \\
        --cmd '{python} -m ckptinspect audit {dir} --output json'

Placeholders in ``--cmd``: ``{python}`` (this interpreter), ``{dir}`` (absolute checkpoint
dir).  Commands run with the repository root as working directory so that
``-m ckptinspect`` works from a checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
# (a) the project's generator; (b) one that shares objects otherwise (plan chunks of their own, key strings one
# object everywhere or fresh at every use, any protocol: issue 31)
# (c) a real megatron-core 0.16.1 save on CPU/gloo (tools/make_sample_ckpts.py: GPT of many tiny layers, DP 2,
# DistributedOptimizer, ~72 chunks a layer); (d) torch's own dcp.save of N one-element tensors (--gen-arg=--world=2
# for DTensor chunks on 2 gloo ranks)
GENERATORS = {"synthetic": REPO / "tools" / "make_synthetic_ckpt.py",
              "other": REPO / "tools" / "make_other_sharing_ckpt.py",
              "mcore": REPO / "tools" / "make_sample_ckpts.py",
              "real_dcp": REPO / "tools" / "make_real_dcp_many.py"}
MCORE_CHUNKS_PER_LAYER = 72  # measured: 1400 layers -> 100,826 chunks


def _mcore_argv(out: Path, n: int, seed: int) -> list[str]:
    layers = max(2, -(-n // MCORE_CHUNKS_PER_LAYER))
    return [sys.executable, str(GENERATORS["mcore"]), "--out", str(out), "--format", "torch_dist", "--tp", "1",
            "--pp", "1", "--dp", "2", "--layers", str(layers), "--hidden", "8", "--heads", "2", "--vocab-size", "64",
            "--make-vocab-size-divisible-by", "64", "--optim-sharding", "dp_reshardable", "--iterations", "1",
            "--seq-length", "8", "--micro-batch-size", "1", "--seed", str(seed), "--timeout", "3600"]
DEFAULT_CMD = "{python} -m ckptinspect audit {dir} --output json"

TORCH_CODE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import torch.distributed.checkpoint as dcp
t1 = time.perf_counter()
md = dcp.FileSystemReader(sys.argv[1]).read_metadata()
t2 = time.perf_counter()
chunks = sum(len(v.chunks) for v in md.state_dict_metadata.values() if hasattr(v, "chunks"))
print(json.dumps({"import_s": t1 - t0, "read_metadata_s": t2 - t1, "keys": len(md.state_dict_metadata),
                  "chunks": chunks, "storage_entries": len(md.storage_data),
                  "plans": len(getattr(md, "all_local_plans", None) or []), "torch": torch.__version__}))
"""

# Runs in a fresh interpreter per measurement so RUSAGE_CHILDREN only covers one command.
WRAPPER_CODE = r"""
import json, resource, subprocess, sys, time
argv, cwd, timeout, out_path, err_path = json.loads(sys.argv[1])
rc = None
t0 = time.perf_counter()
with open(out_path, "wb") as out, open(err_path, "wb") as err:
    try:
        p = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    except OSError as exc:
        err.write(repr(exc).encode())
        rc = "spawn-error"
    else:
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "maxrss_kb": ru.ru_maxrss, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
                  "rc": rc}))
"""


def tail(path: Path, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def measure(argv: list[str], cwd: Path, timeout: float, scratch: Path) -> dict[str, Any]:
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    spec = json.dumps([argv, str(cwd), timeout, str(out_path), str(err_path)])
    p = subprocess.run([sys.executable, "-c", WRAPPER_CODE, spec], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"measurement wrapper failed: {p.stderr}")
    res = json.loads(p.stdout)
    res["stdout_bytes"] = out_path.stat().st_size if out_path.exists() else 0
    res["stdout_tail"] = tail(out_path, 4000)
    res["stderr_tail"] = tail(err_path, 2000)
    res["ok"] = res["rc"] == 0
    return res


class Target:
    def __init__(self, label: str, argv: list[str], reference: bool = False):
        self.label, self.argv, self.reference = label, argv, reference
        self.runs: list[dict[str, Any]] = []

    @property
    def ok_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if r["ok"]]

    def median(self, key: str, ok_only: bool = True) -> Optional[float]:
        runs = self.ok_runs if ok_only else self.runs
        vals = [r[key] for r in runs]
        return statistics.median(vals) if vals else None

    def summary(self) -> dict[str, Any]:
        rcs = sorted({str(r["rc"]) for r in self.runs})
        return {
            "label": self.label, "argv": self.argv, "runs": len(self.runs), "ok": len(self.ok_runs),
            "exit_codes": rcs,
            "wall_s_median": self.median("wall_s"), "maxrss_mb_median": _mb(self.median("maxrss_kb")),
            "cpu_s_median": statistics.median([r["user_s"] + r["sys_s"] for r in self.ok_runs]) if self.ok_runs else None,
            "wall_s_all": [round(r["wall_s"], 3) for r in self.runs],
            "maxrss_mb_all": [_mb(r["maxrss_kb"]) for r in self.runs],
        }


def _mb(kb: Optional[float]) -> Optional[float]:
    return None if kb is None else round(kb / 1024.0, 1)


# Which path of the streaming reader read each record (`ReadStats`): in this checkout, on the same file.
STATS_CODE = r"""
import json, sys
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.dcp.vm_stats import ReadStats
st = ReadStats()
read_metadata(open(sys.argv[1], "rb"), stats=st)
print(json.dumps({"batch": st.batch, "loop": st.loop, "runs": st.runs, "fallback": st.fallback}))
"""


def fallback_counts(md_path: Path, timeout: float) -> Optional[dict[str, Any]]:
    p = subprocess.run([sys.executable, "-c", STATS_CODE, str(md_path)], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        print(f"warning: fallback count failed: {p.stderr[-500:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def print_fallbacks(counts: dict[str, Any]) -> None:
    """Records of each kind the opcode loop read once the batch paths were on (past their first memo slot)."""
    print("\nfast-path fallbacks (records the loop read / all records the batch paths could take; batch runs):")
    for kind, n_loop in counts["loop"].items():
        total = n_loop + counts["batch"][kind]
        share = f"{100 * n_loop / total:.2f} %" if total else "-"
        runs = counts.get("runs", {}).get(kind, 0)
        print(f"  {kind:<8} {n_loop:>9} / {total:<9} {share:>8}   {runs} runs")
    if counts.get("fallback"):
        print(f"  the stream went to the reference reader: {counts['fallback']}")


def generate(n: int, tmp_root: Optional[str], gen_args: list[str], seed: int,
             generator: str = "synthetic") -> tuple[Path, Path, dict, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench_ckpt_", dir=tmp_root))
    ckpt = tmp / "iter_0000001"
    summary_path = tmp / "generate.json"
    if generator == "mcore":
        argv = [*_mcore_argv(tmp / "save", n, seed), *gen_args]
        ckpt = tmp / "save" / "iter_0000001"
    else:
        argv = [sys.executable, str(GENERATORS[generator]), str(ckpt), "--chunks", str(n), "--seed", str(seed),
                "--json", str(summary_path), *gen_args]
    print(f"$ {shlex.join(argv)}", flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(argv)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"generator failed with exit code {p.returncode}")
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return tmp, ckpt, summary, dt


def fmt(v: Optional[float], spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def print_report(targets: list[Target], ckpt: Path, info: dict[str, Any]) -> None:
    ref = targets[0]
    print()
    print(f"checkpoint: {ckpt}")
    for k in ("metadata_mb", "chunks", "storage_entries", "keys", "plans", "generate_s"):
        if info.get(k) is not None:
            print(f"  {k}: {info[k]}")
    print(f"  python {platform.python_version()}, torch {info.get('torch', '?')}, {os.cpu_count()} CPUs, "
          f"repeat={info['repeat']}, load average before/after: {info['load_before']} / {info['load_after']}")
    if max(info["load_before"] + info["load_after"]) > (os.cpu_count() or 1):
        print("  note: the machine was busy (load > #CPUs): wall times are noisy, compare CPU s too")
    head = (f"{'command':<40} {'ok/runs':>7} {'wall s':>9} {'peak RSS MB':>12} {'CPU s':>8} "
            f"{'wall/torch':>11} {'RSS/torch':>10} {'CPU/torch':>10}  exit")
    print()
    print(head)
    print("-" * len(head))
    for t in targets:
        s = t.summary()
        rw = "1.00x" if t.reference else ratio(s["wall_s_median"], ref.summary()["wall_s_median"])
        rr = "1.00x" if t.reference else ratio(s["maxrss_mb_median"], ref.summary()["maxrss_mb_median"])
        rc = "1.00x" if t.reference else ratio(s["cpu_s_median"], ref.summary()["cpu_s_median"])
        if not t.ok_runs:
            rw = rr = rc = "n/a"
        label = t.label if len(t.label) <= 40 else t.label[:37] + "..."
        print(f"{label:<40} {s['ok']:>3}/{s['runs']:<3} {fmt(s['wall_s_median']):>9} "
              f"{fmt(s['maxrss_mb_median'], '.1f'):>12} {fmt(s['cpu_s_median']):>8} {rw:>11} {rr:>10} {rc:>10}  "
              f"{','.join(s['exit_codes'])}")
    # This VM's speed drifts by tens of percent within minutes: each round's command ran next to its torch run, so
    # the round-by-round ratios (and their median) are the paired view of the same runs; three decimals, since the
    # table's two hide whether 0.25 is met.
    for t in targets[1:]:
        pairs = [r["wall_s"] / q["wall_s"] for r, q in zip(t.runs, ref.runs) if r["ok"] and q["ok"] and q["wall_s"]]
        mine, theirs = t.summary()["wall_s_median"], ref.summary()["wall_s_median"]
        if pairs and mine is not None and theirs:
            label = t.label if len(t.label) <= 40 else t.label[:37] + "..."
            print(f"\n{label}: wall/torch by round {' '.join(f'{p:.3f}' for p in pairs)}; median of the rounds "
                  f"{statistics.median(pairs):.3f}x, ratio of the medians {mine / theirs:.3f}x")
    if info.get("torch_read_metadata_s") is not None:
        print(f"\ntorch in-process breakdown (median): import {info['torch_import_s']:.2f}s, "
              f"read_metadata {info['torch_read_metadata_s']:.2f}s")
    for t in targets:
        bad = [r for r in t.runs if not r["ok"]]
        if bad:
            r = bad[-1]
            print(f"\nFAILED: {t.label}: exit code {r['rc']} in {len(bad)}/{len(t.runs)} run(s)")
            print(f"  argv: {shlex.join(t.argv)}")
            err = r["stderr_tail"].strip() or r["stdout_tail"].strip()
            if err:
                print("  last output:\n    " + "\n    ".join(err.splitlines()[-15:]))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("ckpt_dir", nargs="?", help="checkpoint dir (the one holding .metadata)")
    ap.add_argument("--generate", type=int, metavar="N",
                    help="first build a synthetic checkpoint with ~N chunks (--generator) in a temp dir")
    ap.add_argument("--generator", choices=sorted(GENERATORS), default="synthetic",
                    help="with --generate: synthetic (tools/make_synthetic_ckpt.py, default), other "
                         "(tools/make_other_sharing_ckpt.py: other object sharing, --gen-arg=--protocol=N, "
                         "--gen-arg=--strings=fresh), mcore (tools/make_sample_ckpts.py: a real megatron-core save "
                         "of ~N chunks, ~N/72 layers; 100k: ~10 min) or real_dcp (tools/make_real_dcp_many.py: "
                         "torch's dcp.save of N tiny tensors, --gen-arg=--world=2)")
    ap.add_argument("--gen-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for the generator (repeatable), e.g. --gen-arg=--no-plans")
    ap.add_argument("--seed", type=int, default=0, help="generator seed")
    ap.add_argument("--tmpdir", help="where --generate puts its temp dir (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    ap.add_argument("--cmd", action="append", metavar="CMD",
                    help=f"command to compare with torch (repeatable; default: {DEFAULT_CMD!r})")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per command (median reported)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed runs per command first (page cache)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per-run timeout in seconds")
    ap.add_argument("--json", dest="json_out", help="write all results to this JSON file")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any measured command failed")
    args = ap.parse_args(argv)

    if (args.ckpt_dir is None) == (args.generate is None):
        ap.error("give either CKPT_DIR or --generate N")
    info: dict[str, Any] = {"repeat": args.repeat}
    tmp: Optional[Path] = None
    try:
        if args.generate is not None:
            tmp, ckpt, gsum, gen_s = generate(args.generate, args.tmpdir, args.gen_arg, args.seed, args.generator)
            info["generate_s"] = round(gen_s, 1)
            info["generator"] = gsum
        else:
            ckpt = Path(args.ckpt_dir).resolve()
        md_path = ckpt / ".metadata"
        if not md_path.exists():
            print(f"warning: {md_path} does not exist", file=sys.stderr)
        else:
            info["metadata_mb"] = round(md_path.stat().st_size / 1e6, 1)

        subst = {"python": sys.executable, "dir": str(ckpt)}
        targets = [Target("torch read_metadata", [sys.executable, "-c", TORCH_CODE, str(ckpt)], reference=True)]
        for c in args.cmd or [DEFAULT_CMD]:
            if "{dir}" not in c:
                print(f"note: --cmd {c!r} has no {{dir}} placeholder", file=sys.stderr)
            cmd_argv = [a.format(**subst) for a in shlex.split(c)]
            label = c.replace("{python} ", "").replace("{python}", "python").replace("{dir}", "DIR")
            targets.append(Target(label, cmd_argv))

        info["load_before"] = [round(x, 1) for x in os.getloadavg()]
        with tempfile.TemporaryDirectory(prefix="bench_io_") as scratch_s:
            scratch = Path(scratch_s)
            for _ in range(args.warmup):
                for t in targets:
                    measure(t.argv, REPO, args.timeout, scratch)
            for i in range(args.repeat):
                for t in targets:
                    r = measure(t.argv, REPO, args.timeout, scratch)
                    t.runs.append(r)
                    status = "ok" if r["ok"] else f"FAILED (exit {r['rc']})"
                    print(f"[{i + 1}/{args.repeat}] {t.label}: {r['wall_s']:.2f}s, "
                          f"{r['maxrss_kb'] / 1024:.0f} MB, {status}", flush=True)

        info["load_after"] = [round(x, 1) for x in os.getloadavg()]
        ref = targets[0]
        torch_out = []
        for r in ref.ok_runs:
            try:
                torch_out.append(json.loads(r["stdout_tail"].strip().splitlines()[-1]))
            except (ValueError, IndexError):
                pass
        if torch_out:
            info["torch_import_s"] = statistics.median(o["import_s"] for o in torch_out)
            info["torch_read_metadata_s"] = statistics.median(o["read_metadata_s"] for o in torch_out)
            for k in ("chunks", "storage_entries", "keys", "plans", "torch"):
                info[k] = torch_out[-1][k]
        print_report(targets, ckpt, info)
        if md_path.exists():
            counts = fallback_counts(md_path, args.timeout)
            if counts is not None:
                info["fast_path"] = counts
                print_fallbacks(counts)

        if args.json_out:
            Path(args.json_out).write_text(json.dumps({
                "checkpoint": str(ckpt), "info": info,
                "results": [dict(t.summary(), reference=t.reference,
                                 last_stderr=(t.runs[-1]["stderr_tail"][-1000:] if t.runs else ""))
                            for t in targets],
            }, indent=2))
        if not ref.ok_runs:
            print("\nthe torch reference failed; see above", file=sys.stderr)
            return 2
        if args.strict and any(not t.ok_runs or len(t.ok_runs) != len(t.runs) for t in targets):
            return 1
        return 0
    finally:
        if tmp is not None:
            if args.keep:
                print(f"kept generated checkpoint: {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
