"""Resolve a user's PATH to one checkpoint: a save dir stands for the checkpoint a resume would pick."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptinspect.errors import BrokenSaveDir, access_failure
from ckptinspect.findings import Finding
from ckptinspect.formats.savedir import SaveDir, join_label, read_save_dir, tracked_missing, tracker_unparseable
from ckptinspect.formats.sniff import path_kind
from ckptinspect.formats.stacks import outer_layout
from ckptinspect.model import Kind
from ckptinspect.io.local import note_failed_open, require_path
from ckptinspect.io.findings import unread_findings


def _why(save: SaveDir, label: str) -> tuple[Finding, ...]:
    t = save.tracker
    if save.bridge_step is not None:
        return (Finding("CK503", f"latest_train_state.pt (Megatron-Bridge) names step {save.bridge_step}, which does "
                        "not exist", "latest_train_state.pt", label, {"iteration": save.bridge_step}),)
    if t.exists and t.error is not None:
        return (tracker_unparseable(t, label),)
    if t.exists:
        return (tracked_missing(t, label),)
    return (Finding("CK100", "no checkpoint in this save dir", None, label),)




def resolve_checkpoint(path: Path, label: str | None = None) -> tuple[Path, str]:
    """For commands that take one checkpoint: a save dir resolves to the checkpoint a resume would pick."""
    label = label if label is not None else str(path)
    require_path(path, label)
    with access_guard(path, label):
        if path_kind(path) is Kind.SAVE_DIR:
            save = read_save_dir(path)
            pick = save.resume_pick()
            if pick is None:
                raise BrokenSaveDir(f"{label}: save dir has no checkpoint a resume would pick", _why(save, label))
            return pick.path, join_label(label, pick.name)
    return path, label


def resolve_data_dir(path: Path, label: str | None = None) -> tuple[Path, str]:
    """For commands that work on one checkpoint's files without reading its metadata (`manifest verify`, `manifest
    write`): the data dir of the checkpoint `resolve_checkpoint` picks, and its label. It is the dir the reader gives
    as `Checkpoint.data_dir` (both come from the stack's `outer_layout`): NeMo 2's `<ckpt>/weights/`, where
    Megatron's `save_integrity_manifest` writes `integrity.json`; the checkpoint dir itself otherwise."""
    ckpt, ckpt_label = resolve_checkpoint(path, label)
    with access_guard(ckpt, ckpt_label):
        layout = outer_layout(ckpt)
    if layout is None or layout.payload == ckpt:
        return ckpt, ckpt_label
    return layout.payload, join_label(ckpt_label, layout.payload.relative_to(ckpt).as_posix())


@contextmanager
def access_guard(path: Path, label: str) -> Iterator[None]:
    """Telling what `path` is (a save dir, its iterations, its stack) met something inside it that it may not enter
    (`Path.exists` raises `PermissionError` below a dir without search permission): `BrokenSaveDir` with the CK209
    of what could not be read (exit 1 with findings), never an internal error."""
    try:
        yield
    except OSError as e:
        if not access_failure(e):
            raise
        note_failed_open(e, path)
        raise BrokenSaveDir(f"{label}: part of it cannot be read here", unread_findings(path, label)) from e
