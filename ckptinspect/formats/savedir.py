"""Save dirs: the tracker (`latest_checkpointed_iteration.txt`) and the iteration dirs under a `--save` root.

Megatron (`training/checkpointing.py:375-430`): the tracker holds `str(iteration)` or `release`, parsed with
`.strip()` then `int()`; checkpoints live in `iter_{iteration:07d}/` or `release/`. torchtitan-style DCP runs use
`step-N/` dirs and no tracker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.safeio import open_regular

TRACKER = "latest_checkpointed_iteration.txt"
MAX_TRACKER_BYTES = 4096
_ITER_DIR = re.compile(r"^iter_(\d+)$")
_STEP_DIR = re.compile(r"^step[-_](\d+)$")


@dataclass(frozen=True, slots=True)
class Tracker:
    """The tracker file: raw text (None when absent), parsed iteration (int or "release"), parse error."""

    exists: bool
    raw: str | None
    iteration: int | str | None
    error: str | None

    def to_dict(self) -> dict[str, object]:
        return {"raw": self.raw, "iteration": self.iteration}


@dataclass(frozen=True, slots=True)
class IterationDir:
    """One checkpoint dir of a save dir: `iter_0000100` (iteration 100), `release`, or `step-10`."""

    name: str
    iteration: int | str  # "release" for release/
    path: Path


@dataclass(frozen=True, slots=True)
class SaveDir:
    """A save root: its tracker and iteration dirs (sorted by iteration; release first)."""

    path: Path
    tracker: Tracker
    iterations: tuple[IterationDir, ...]
    style: str  # "megatron" (iter_*/release + tracker) or "dcp" (step-N)

    def find(self, iteration: int | str | None) -> IterationDir | None:
        return next((i for i in self.iterations if i.iteration == iteration), None)

    def resume_pick(self) -> IterationDir | None:
        """The dir a resume would load: the tracked one (even if missing → None), else the newest."""
        if self.tracker.exists:
            return self.find(self.tracker.iteration) if self.tracker.error is None else None
        numbered = [i for i in self.iterations if isinstance(i.iteration, int)]
        if numbered:
            return numbered[-1]
        return self.iterations[-1] if self.iterations else None


def read_tracker(path: Path) -> Tracker:
    f = path / TRACKER
    if not (f.exists() or f.is_symlink()):
        return Tracker(False, None, None, None)
    try:
        with open_regular(f) as fh:
            data = fh.read(MAX_TRACKER_BYTES + 1)
    except OSError as e:
        return Tracker(True, None, None, f"unreadable: {e.strerror or e}")
    if len(data) > MAX_TRACKER_BYTES:
        return Tracker(True, data[:64].decode("utf-8", "replace"), None, "larger than 4 KiB: not a tracker")
    raw = data.decode("utf-8", "replace")
    text = raw.strip()
    if text == "release":
        return Tracker(True, raw, "release", None)
    try:
        value = int(text)
    except ValueError:
        return Tracker(True, raw, None, f"not an integer and not 'release': {text[:40]!r}")
    if value < 0:
        return Tracker(True, raw, None, f"negative iteration {value}")
    return Tracker(True, raw, value, None)


def iteration_dirs(path: Path) -> tuple[tuple[IterationDir, ...], str]:
    out: list[IterationDir] = []
    style = "megatron"
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return (), style
    steps = 0
    for p in entries:
        try:
            if not p.is_dir():
                continue
        except OSError:
            continue
        m = _ITER_DIR.match(p.name)
        if m:
            out.append(IterationDir(p.name, int(m.group(1)), p))
        elif p.name == "release":
            out.append(IterationDir(p.name, "release", p))
        elif (m := _STEP_DIR.match(p.name)) is not None:
            out.append(IterationDir(p.name, int(m.group(1)), p))
            steps += 1
    if steps and steps == len(out):
        style = "dcp"
    out.sort(key=lambda i: (-1, "") if i.iteration == "release" else (int(i.iteration), i.name))
    return tuple(out), style


def looks_like_save_dir(path: Path) -> bool:
    """A dir with a tracker or `iter_*` / `release` / `step-N` subdirs (and no checkpoint files of its own)."""
    if (path / TRACKER).exists():
        return True
    return bool(iteration_dirs(path)[0])


def read_save_dir(path: Path) -> SaveDir:
    iterations, style = iteration_dirs(path)
    return SaveDir(path, read_tracker(path), iterations, style)
