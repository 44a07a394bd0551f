"""The fuzz suite's session statistics (tests/hostile/test_fuzz.py), printed in the terminal summary of every run.

Under pytest-xdist the cases run in worker processes: each worker sends its `Stats` to the controller in
`workeroutput` at the end of its session, and the controller (tests/conftest.py) merges them and prints the same
section a serial run prints, so the seed and the case count are in every CI log.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

WORKER_KEY = "ckptinspect_fuzz"


@dataclass
class Stats:
    cases: int = 0
    runs: int = 0
    seconds: float = 0.0
    slowest: tuple[float, str] = (0.0, "")
    exit_codes: dict[int, int] = field(default_factory=dict)
    per_base: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    skipped_bases: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def merge(self, doc: str) -> None:
        """Add the statistics of another process (`to_json` output)."""
        d: dict[str, Any] = json.loads(doc)
        self.cases += d["cases"]
        self.runs += d["runs"]
        self.seconds += d["seconds"]
        if d["slowest"][0] > self.slowest[0]:
            self.slowest = (d["slowest"][0], d["slowest"][1])
        for k, v in d["exit_codes"].items():
            self.exit_codes[int(k)] = self.exit_codes.get(int(k), 0) + v
        for k, v in d["per_base"].items():
            self.per_base[k] = self.per_base.get(k, 0) + v
        self.failures += d["failures"]
        self.skipped_bases += [b for b in d["skipped_bases"] if b not in self.skipped_bases]


def summary_lines(s: Stats, seed: int | str, requested: int | str, only: str | None) -> list[str]:
    lines = [f"seed={seed} cases={s.cases} (requested {requested}) runs={s.runs} time={s.seconds:.1f}s "
             f"failures={s.failures}",
             "per base: " + ", ".join(f"{k}={v}" for k, v in sorted(s.per_base.items())),
             "exit codes: " + ", ".join(f"{k}:{v}" for k, v in sorted(s.exit_codes.items()))]
    if s.slowest[1]:
        lines.append(f"slowest run: {s.slowest[0]:.2f}s {s.slowest[1]}")
    if s.skipped_bases:
        lines.append("skipped bases (not available): " + ", ".join(s.skipped_bases))
    extra = f" CKPTINSPECT_FUZZ_ONLY={only}" if only is not None else ""
    lines.append(f"reproduce: CKPTINSPECT_FUZZ_SEED={seed} CKPTINSPECT_FUZZ_CASES={requested}{extra} "
                 "pytest tests/hostile/test_fuzz.py")
    return lines
