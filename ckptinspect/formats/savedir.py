"""Save dirs: the tracker (`latest_checkpointed_iteration.txt`) and the iteration dirs under a `--save` root.

Megatron (`training/checkpointing.py:375-430`): the tracker holds `str(iteration)` or `release`, parsed with
`.strip()` then `int()`; checkpoints live in `iter_{iteration:07d}/` or `release/`. torchtitan-style DCP runs use
`step-N/` dirs and no tracker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.errors import UNREAD_CODE, access_failure
from ckptinspect.findings import Finding
from ckptinspect.model import Stack, StrEnum
from ckptinspect.formats.inflight import grace_seconds, written_within_grace
from ckptinspect.io.local import open_regular

TRACKER = "latest_checkpointed_iteration.txt"
MAX_TRACKER_BYTES = 4096
_ITER_DIR = re.compile(r"^iter_(\d+)$")
_STEP_DIR = re.compile(r"^step[-_](\d+)$")


class SaveStyle(StrEnum):
    """How a save dir names its checkpoints (`SaveDir.style`), which decides what a resume would load."""

    MEGATRON = "megatron"  # iter_*/release + tracker
    DCP = "dcp"  # step-N dirs only (torchtitan-style DCP runs)
    NEMO2 = "nemo2"  # …step=N… dirs with weights/ + context/
    NVRX = "nvrx"  # NVRx local checkpoint rank dirs


@dataclass(frozen=True, slots=True)
class Tracker:
    """The tracker file: raw text (None when absent), parsed iteration (int or "release"), parse error; `denied`:
    the error is that it could not be read here (permission denied, I/O error: CK209, not CK502); `writing`: it is
    empty and was modified within the age rule's grace (`formats/inflight.py`): Megatron's rank 0 is writing it
    (plain `open('w')`, then the number), so it is a tracker mid-write (CK133), not an unparseable one (CK502)."""

    exists: bool
    raw: str | None
    iteration: int | str | None
    error: str | None
    denied: bool = False
    writing: bool = False

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
    style: SaveStyle
    stack: Stack | None = None
    style_evidence: str | None = None
    bridge_step: int | None = None  # `step` in Megatron-Bridge's latest_train_state.pt (read before the tracker)

    def find(self, iteration: int | str | None) -> IterationDir | None:
        return next((i for i in self.iterations if i.iteration == iteration), None)

    def resume_pick(self) -> IterationDir | None:
        """The dir a resume would load: the tracked one (even if missing → None), else the newest the stack loads.

        torchtitan (`_find_load_step`) takes the newest `step-N` holding `.metadata` (or an HF
        `model.safetensors.index.json`); NeMo 2 skips checkpoints with an `-unfinished` marker; NVRx `find_latest`
        takes the newest iteration every rank has a complete file of. Without such a one, the newest dir.
        """
        if self.bridge_step is not None:
            # Bridge `_resolve_checkpoint_iteration`: latest_train_state.pt first, the text tracker only without it
            return self.find(self.bridge_step)
        if self.tracker.exists:
            return self.find(self.tracker.iteration) if self.tracker.error is None else None
        numbered = [i for i in self.iterations if isinstance(i.iteration, int)]
        loadable = [i for i in numbered if _loadable(i, self.style)]
        if loadable:
            return loadable[-1]
        if numbered:
            return numbered[-1]
        return self.iterations[-1] if self.iterations else None


def _loadable(it: IterationDir, style: SaveStyle) -> bool:
    try:
        return _loadable_markers(it, style)
    except OSError:  # a dir that cannot be entered: not loadable by this user (its own read reports CK209)
        return False


def _loadable_markers(it: IterationDir, style: SaveStyle) -> bool:
    if style is SaveStyle.DCP:
        return (it.path / ".metadata").is_file() or (it.path / "model.safetensors.index.json").is_file()
    if style is SaveStyle.NEMO2:
        from ckptinspect.formats.stacks import unfinished_marker

        return not unfinished_marker(it.path).exists()
    if style is SaveStyle.NVRX:
        from ckptinspect.formats.nvrx_local import find_local_root

        root = find_local_root(it.path.parent)
        if root is None:
            return False
        have = {f.owner for f in root.files if f.iteration == it.iteration and not f.dirty}
        return have == set(range(root.world_size))
    return True


def read_tracker(path: Path) -> Tracker:
    f = path / TRACKER
    try:
        if not (f.exists() or f.is_symlink()):
            return Tracker(False, None, None, None)
        with open_regular(f) as fh:
            data = fh.read(MAX_TRACKER_BYTES + 1)
    except OSError as e:  # also: the dir holding it cannot be entered (f.exists raises on Python < 3.13)
        return Tracker(True, None, None, f"unreadable: {e.strerror or e}", access_failure(e))
    if len(data) > MAX_TRACKER_BYTES:
        return Tracker(True, data[:64].decode("utf-8", "replace"), None, "larger than 4 KiB: not a tracker")
    raw = data.decode("utf-8", "replace")
    if not data and written_within_grace(f):
        return Tracker(True, raw, None, "empty", writing=True)
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


def iteration_dirs(path: Path) -> tuple[tuple[IterationDir, ...], SaveStyle]:
    out: list[IterationDir] = []
    style = SaveStyle.MEGATRON
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
        style = SaveStyle.DCP
    out.sort(key=lambda i: (-1, "") if i.iteration == "release" else (int(i.iteration), i.name))
    return tuple(out), style


def looks_like_save_dir(path: Path) -> bool:
    """A dir with a tracker or `iter_*` / `release` / `step-N` subdirs (and no checkpoint files of its own), a NeMo 2
    checkpoints dir or an NVRx local checkpoint root."""
    if (path / TRACKER).exists():
        return True
    from ckptinspect.formats.stacks import is_nemo2_dir

    if bool(iteration_dirs(path)[0]) or is_nemo2_dir(path):
        return bool(iteration_dirs(path)[0])
    return _stack_iterations(path) is not None


_NEMO_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


def _stack_iterations(path: Path) -> tuple[tuple[IterationDir, ...], SaveStyle, Stack, str] | None:
    """NeMo 2 checkpoint dirs (`…-step=N-…` with `weights/`) or NVRx rank dirs, when there are no Megatron dirs."""
    from ckptinspect.formats.nvrx_local import find_local_root
    from ckptinspect.formats.stacks import is_nemo2_dir

    root = find_local_root(path)
    if root is not None:
        its = tuple(IterationDir(f"iter_{n:07d}", n, path / f"iter_{n:07d}") for n in root.iterations)
        return its, SaveStyle.NVRX, Stack.NVRX_LOCAL, (f"NVRx local checkpoint root: rank dirs {', '.join(root.rank_dirs[:8])}"
                                               f"{' ...' if len(root.rank_dirs) > 8 else ''}")
    try:
        subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return None
    # `{root}/{session_id}/{rank}/…` with a non-empty session: one level down, iterations named `session/iter_N`
    sessions = [(d, r) for d in subdirs[:64] if not d.name.isdigit() and (r := find_local_root(d)) is not None]
    if sessions:
        its = tuple(IterationDir(f"{d.name}/iter_{n:07d}", n, d / f"iter_{n:07d}") for d, r in sessions
                    for n in r.iterations)
        its = tuple(sorted(its, key=lambda i: (int(i.iteration), i.name)))
        return its, SaveStyle.NVRX, Stack.NVRX_LOCAL, ("NVRx local checkpoint root with session dir(s) "
                                               + ", ".join(d.name for d, _ in sessions[:8]))
    nemo = []
    for p in subdirs:
        if is_nemo2_dir(p):
            m = _NEMO_STEP.search(p.name)
            nemo.append(IterationDir(p.name, int(m.group(1)) if m else -1, p))
    if not nemo:
        return None
    # `-last` copies sort after the step checkpoint of the same step (NeMo ModelCheckpoint save_last)
    nemo.sort(key=lambda i: (int(i.iteration), i.name.endswith("-last"), i.name))
    return tuple(nemo), SaveStyle.NEMO2, Stack.NEMO2, "NeMo 2 checkpoints dir (…step=N… dirs with weights/ + context/)"


def read_save_dir(path: Path) -> SaveDir:
    iterations, style = iteration_dirs(path)
    stack: Stack | None = None
    why: str | None = None
    bridge_step: int | None = None
    if not iterations:
        found = _stack_iterations(path)
        if found is not None:
            iterations, style, stack, why = found
    elif (path / "latest_train_state.pt").exists():
        from ckptinspect.formats.stacks import train_state_step

        bridge_step = train_state_step(path / "latest_train_state.pt")
        stack, why = Stack.MEGATRON_BRIDGE, (f"latest_train_state.pt present (step {bridge_step}): a Megatron-Bridge "
                                             "save dir; Bridge resumes from its step before the text tracker")
    elif path.name == "non_persistent":
        stack, why = Stack.MEGATRON_NON_PERSISTENT, "Megatron non-persistent global checkpoint dir ({save}/non_persistent)"
    return SaveDir(path, read_tracker(path), iterations, style, stack, why, bridge_step)


def tracker_unparseable(tracker: Tracker, label: str) -> Finding:
    """CK502, the one construction (the tracker check and `resolve_checkpoint` both report it); CK209 when the
    tracker could not be read here (the iteration a resume picks is then unknown, not broken); CK133 when it is
    being written (`Tracker.writing`)."""
    if tracker.denied:
        return Finding(UNREAD_CODE, f"{TRACKER}: {tracker.error}; the tracker was not read, so which iteration a "
                       "resume picks is unknown", TRACKER, label, {"file": TRACKER})
    if tracker.writing:
        return Finding("CK133", f"{TRACKER} is empty and was modified within the {grace_seconds():g} s grace: "
                       "Megatron is writing it (the last step of a save); which iteration a resume picks is known "
                       "once it is written", TRACKER, label, {"raw": tracker.raw, "grace_seconds": grace_seconds()})
    return Finding("CK502", f"{TRACKER} is unparseable ({tracker.error}); Megatron exits with 'Invalid metadata"
                   " file'", TRACKER, label, {"raw": tracker.raw})


def tracked_missing(tracker: Tracker, label: str) -> Finding:
    """CK503, the one construction: the tracker names an iteration dir that does not exist."""
    it = tracker.iteration
    name = "release" if it == "release" else f"iter_{int(it or 0):07d}"
    return Finding("CK503", f"{TRACKER} names {name}, which does not exist", name, label, {"iteration": it})


def join_label(label: str, name: str) -> str:
    """The label of `name` inside the dir the user named `label` (`run/` + `iter_0000002` → `run/iter_0000002`)."""
    return f"{label.rstrip('/')}/{name}"
