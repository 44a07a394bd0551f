"""Checks: pure functions that turn the neutral model into findings.

Each check module exposes ``run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]``. Checks never raise
because a checkpoint is broken: a broken checkpoint is findings. They raise only when the tool itself cannot go on.
The registry is the literal tuple `CHECKS` in `registry.py` (no registration by import side effect).

- `storage.py`: stored items lie in existing, readable files, do not overlap, no stale data files; `--deep` reads them.
- `coverage.py`: chunk coverage of every tensor (gaps, overlaps, out of bounds, no storage), over `columns.py`
  (vectorised screening of the `ChunkTable`) and `layout_coords.py` (which rank and stage a gap lost).
- `objects.py`: sharded-object families fill their grid exactly once.
- `legacy.py`: a legacy save's shard dirs and optimizer files for the whole grid of its args.
- `integrity.py`: the SHA-256 manifest (engine: `services/integrity_verify.py`).
- `safety.py`: pickle safety of the stored items inside `.distcp` files (engine: `services/safety_scan.py`).
- `args.py`: training args present and consistent with the on-disk layout.
- `tracker.py`: save-dir checks: the tracker and the crash leftovers around it.
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
