"""File-level helpers shared by the readers: listing a checkpoint dir, reading stored items, pickle findings."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.transforms import MAX_DECODED_BYTES, decode_item
from ckptinspect.pickling.report import safety_findings
from ckptinspect.io.local import file_size, note_unread, open_regular
from ckptinspect.pickling.report import PickleReport
from ckptinspect.pickling.torch_archive import TorchArchive, read_torch_archive
from ckptinspect.model import FileInfo, FileRole, StoredItem
from ckptinspect.io.objpath import ObjectPath

_ROLES = {
    ".metadata": FileRole.METADATA,
    ".metadata.tmp": FileRole.METADATA,
    "metadata.json": FileRole.METADATA,
    "common.pt": FileRole.COMMON,
    "integrity.json": FileRole.MANIFEST,
    "model_optim_rng.pt": FileRole.MODEL,
    "distrib_optim.pt": FileRole.OPTIMIZER,
}


def role_of(name: str) -> FileRole:
    base = name.rsplit("/", 1)[-1]
    if base in _ROLES:
        return _ROLES[base]
    if base.endswith(".distcp"):
        return FileRole.DATA
    if base.startswith("__") and base.endswith((".metadata", ".metadata.tmp")):
        return FileRole.METADATA  # DCP per-rank metadata (`use_collectives=False`)
    return FileRole.OTHER


def regular_size(path: Path) -> int | None:
    """Size of `path` if it is a regular file (symlinks followed), else None. Never raises for a local path."""
    if isinstance(path, ObjectPath):
        info = path.object_info()
        return info.size if info is not None else None
    try:
        st = os.stat(path)
    except OSError as e:
        note_unread(path.parent, e, "enter")  # only a dir that cannot be entered makes a stat fail for access
        return None
    except ValueError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def list_files(ckpt_dir: Path, recursive: bool = False) -> tuple[FileInfo, ...]:
    """Regular files of a checkpoint dir (top level unless `recursive`), sorted by name. Never raises; a dir it
    cannot list or enter is noted for CK209 (`io.local.note_unread`)."""
    if isinstance(ckpt_dir, ObjectPath):
        objects = ckpt_dir.walk_files(recursive)
        return tuple(sorted((FileInfo(rel, size, role_of(rel)) for rel, size in objects), key=lambda f: f.name))
    out: list[FileInfo] = []
    for rel in _walk(ckpt_dir, "", recursive, 0):
        size = regular_size(ckpt_dir / rel)
        if size is not None:
            out.append(FileInfo(rel, size, role_of(rel)))
    return tuple(sorted(out, key=lambda f: f.name))


def _walk(root: Path, rel: str, recursive: bool, depth: int) -> Iterator[str]:
    try:
        entries = list(os.scandir(root / rel if rel else root))
    except OSError as err:
        note_unread(root / rel if rel else root, err, "list")
        return
    for e in entries:
        name = f"{rel}/{e.name}" if rel else e.name
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            if recursive and depth < 8:
                yield from _walk(root, name, recursive, depth + 1)
        else:
            yield name


def read_item_archive(ckpt_dir: Path, item: StoredItem, bound: int = MAX_DECODED_BYTES) -> TorchArchive:
    """Open the torch archive stored at `item` (a byte item or a tensor chunk inside a `.distcp`). A
    stream-transformed item is decoded first, up to `bound` bytes (`transforms.decode_item`: CK208 when it cannot
    be, CK603 past the bound); its records' offsets are then those of the decoded archive."""
    path = ckpt_dir / item.file
    try:
        with open_regular(path, window=(item.offset, item.length)) as f:
            size = file_size(f)
            if item.offset < 0 or item.length < 0 or item.end > size:
                raise ReadError(f"{item.file}: item [{item.offset}, {item.end}) past end of file ({size})", "CK202")
            return _archive_at(f, item, bound)
    except OSError as e:
        raise ReadError(f"cannot read {item.file}: {e.strerror or e}", "CK201") from e


def _archive_at(f: BinaryIO, item: StoredItem, bound: int) -> TorchArchive:
    if not item.transforms:
        return read_torch_archive(f, item.offset, item.length)
    with decode_item(f, item.offset, item.length, item.transforms, bound) as decoded:
        return read_torch_archive(decoded)


class ItemFiles:
    """Stored items read through one open handle per file: the handle of the last file used stays open, so items
    read in (file, offset) order open each `.distcp` once (`audit --deep` over millions of items)."""

    def __init__(self, ckpt_dir: Path) -> None:
        self.root = ckpt_dir
        self.name: str | None = None
        self.f: BinaryIO | None = None
        self.size = 0

    def __enter__(self) -> ItemFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
        self.f, self.name = None, None

    def archive(self, item: StoredItem, bound: int = MAX_DECODED_BYTES) -> TorchArchive:
        """The torch archive stored at `item` (same errors as `read_item_archive`)."""
        if item.file != self.name or self.f is None:
            self.close()
            try:
                self.f = open_regular(self.root / item.file)
                self.size = file_size(self.f)
            except OSError as e:
                raise ReadError(f"cannot read {item.file}: {e.strerror or e}", "CK201") from e
            self.name = item.file
        if item.offset < 0 or item.length < 0 or item.end > self.size:
            raise ReadError(f"{item.file}: item [{item.offset}, {item.end}) past end of file ({self.size})", "CK202")
        try:
            return _archive_at(self.f, item, bound)
        except OSError as e:
            raise ReadError(f"cannot read {item.file}: {e.strerror or e}", "CK201") from e


def pickle_findings(report: PickleReport, subject: str, path: str) -> list[Finding]:
    """CK601 / CK604 / CK602 findings for what one unpickling referenced and called (nothing was executed)."""
    return safety_findings(report.globals, report.called, subject, path, f"{subject}: pickle")
