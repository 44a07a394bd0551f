"""Write every CLI output (text and `-o json`, plus the exit code) over the bundled samples into one directory.

Used to prove a refactoring changes no output: snapshot before, snapshot after, `diff -r` the two directories.
Runs the typer app in-process (one import, ~seconds per sample), with the console width pinned.

    python tools/cli_snapshot.py /tmp/before          # on the old commit
    python tools/cli_snapshot.py /tmp/after           # on the new one
    diff -r /tmp/before /tmp/after && echo identical
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = Path("sample_ckpts")  # relative (run from ROOT): text tables are padded to the longest path


def _commands(sample: Path) -> list[tuple[str, list[str]]]:
    s = str(sample)
    ref = str(SAMPLES / "torch_dist")
    cmds: list[tuple[str, list[str]]] = [
        ("sniff", ["sniff", s]),
        ("ls", ["ls", s]),
        ("info", ["info", s]),
        ("audit", ["audit", s]),
        ("audit_all", ["audit", s, "--all"]),
        ("coverage", ["coverage", s]),
        ("scan", ["scan", s]),
        ("resume", ["resume", s, "--tp", "1", "--pp", "1"]),
        ("resume_explain", ["resume", s, "--tp", "2", "--pp", "2", "--dp", "1", "--explain"]),
        ("diff_ref", ["diff", ref, s]),
        ("diff_values_self", ["diff", s, s, "--values"]),
        ("estimate_from", ["estimate", "--from", s, "--dp", "4"]),
        ("manifest_verify", ["manifest", "verify", s]),
    ]
    for it in sorted(p for p in sample.iterdir() if p.is_dir()):
        cmds.append((f"sniff@{it.name}", ["sniff", str(it)]))
        cmds.append((f"info@{it.name}", ["info", str(it)]))
        cmds.append((f"audit@{it.name}", ["audit", str(it)]))
    return cmds


EXTRA: list[tuple[str, list[str]]] = [
    ("estimate_quick", ["estimate", "--params", "7.5e9", "--tp", "2", "--pp", "2", "--dp", "64", "--format",
                        "torch_dist", "--fully-parallel"]),
    ("estimate_desc", ["estimate", "--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "1000",
                       "--tp", "2", "--pp", "1", "--dp", "2", "--format", "torch"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="", help="regex on sample names")
    args = ap.parse_args()
    os.environ["CKPTINSPECT_WIDTH"] = "160"
    os.chdir(ROOT)
    from typer.testing import CliRunner

    from ckptinspect.cli.app import app

    runner = CliRunner()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, list[str]]] = list(EXTRA)
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        if args.only and not re.search(args.only, sample.name):
            continue
        jobs += [(f"{sample.name}.{name}", argv) for name, argv in _commands(sample)]
    for name, argv in jobs:
        for fmt in ("text", "json"):
            full = [*argv, "-o", fmt]
            r = runner.invoke(app, full)
            text = r.stdout
            (args.out / f"{name}.{fmt}").write_text(f"$ {' '.join(full[0:1])} ... exit={r.exit_code}\n{text}",
                                                    encoding="utf-8")
        print(name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
