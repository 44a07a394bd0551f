"""Resolve a user's PATH to one checkpoint: a save dir stands for the checkpoint a resume would pick."""

from __future__ import annotations

from pathlib import Path

from ckptinspect.errors import BrokenSaveDir, UsageError
from ckptinspect.findings import Finding
from ckptinspect.formats.savedir import TRACKER, SaveDir, read_save_dir
from ckptinspect.formats.sniff import path_kind
from ckptinspect.model import Kind


def _why(save: SaveDir, label: str) -> tuple[Finding, ...]:
    t = save.tracker
    if save.bridge_step is not None:
        return (Finding("CK503", f"latest_train_state.pt (Megatron-Bridge) names step {save.bridge_step}, which does "
                        "not exist", "latest_train_state.pt", label, {"iteration": save.bridge_step}),)
    if t.exists and t.error is not None:
        return (Finding("CK502", f"{TRACKER} is unparseable ({t.error})", TRACKER, label, {"raw": t.raw}),)
    if t.exists:
        return (Finding("CK503", f"{TRACKER} names iteration {t.iteration}, which does not exist", TRACKER, label,
                        {"iteration": t.iteration}),)
    return (Finding("CK100", "no checkpoint in this save dir", None, label),)


def _join(label: str, name: str) -> str:
    return f"{label.rstrip('/')}/{name}"


def resolve_checkpoint(path: Path, label: str | None = None) -> tuple[Path, str]:
    """For commands that take one checkpoint: a save dir resolves to the checkpoint a resume would pick."""
    label = label if label is not None else str(path)
    if not (path.exists() or path.is_symlink()):
        raise UsageError(f"{label}: no such file or directory")
    if path_kind(path) is Kind.SAVE_DIR:
        save = read_save_dir(path)
        pick = save.resume_pick()
        if pick is None:
            raise BrokenSaveDir(f"{label}: save dir has no checkpoint a resume would pick", _why(save, label))
        return pick.path, _join(label, pick.name)
    return path, label
