"""The check registry: a literal tuple, in the order findings are reported."""

from __future__ import annotations

from ckptinspect.checks import Check, args, coverage, integrity, legacy, objects, safety, storage

CHECKS: tuple[tuple[str, Check], ...] = (
    ("storage", storage.run),
    ("coverage", coverage.run),
    ("objects", objects.run),
    ("legacy", legacy.run),
    ("args", args.run),
    ("integrity", integrity.run),
    ("safety", safety.run),
)
