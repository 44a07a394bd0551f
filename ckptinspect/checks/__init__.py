"""Checks: pure functions that turn the neutral model into findings.

Each check module exposes ``run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]``. Checks never raise
because a checkpoint is broken: a broken checkpoint is findings. They raise only when the tool itself cannot go on.
The registry is the literal tuple `CHECKS` in `ckptinspect.checks.registry` (no registration by import side effect).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.findings import Finding
from ckptinspect.model import Checkpoint
from ckptinspect.progress import ProgressHook


@dataclass(frozen=True, slots=True)
class CheckContext:
    """Options a check may look at.

    deep: read every stored item (`audit --deep`); implies `hash`.
    hash: hash every file the integrity manifest lists (`audit --hash`); without it the manifest is checked at
      metadata level only (listed files present and regular, unlisted files, staleness, empty-file digests).
    manifest: an explicit integrity manifest to verify instead of the checkpoint's own `integrity.json`.
    progress: optional progress callback for long runs; None = silent.
    workers: threads for I/O-bound checks (hashing).
    """

    deep: bool = False
    hash: bool = False
    manifest: Path | None = None
    progress: ProgressHook | None = None
    workers: int | None = None


Check = Callable[[Checkpoint, CheckContext], Iterator[Finding]]
