"""`scan`: a pickle-safety scan of every pickle a checkpoint (or a whole save dir) holds, by walking opcodes.

Where the pickles are (reference §4, §5.1, §6, §7):
- `.metadata` (and `.metadata.tmp` / `.metadata.bck` leftovers): one raw pickle (torch DCP `Metadata`);
- `*.distcp`: every stored item is a `torch.save` zip archive (byte items and tensor chunks alike) whose
  `*/data.pkl` is a pickle; the items are located through the byte ranges `.metadata` stores. Regions of a data
  file no item covers (a `.distcp` without `.metadata`, stale bytes) are split at their zip end records and scanned
  too;
- `common.pt` (Megatron-Core ≤0.18), legacy `mp_rank_*/model_optim_rng.pt` and `distrib_optim.pt`, Megatron-Bridge's
  `latest_train_state.pt` and any other `*.pt` / `*.pth` / `*.pkl` / `*.ckpt`: a torch zip archive or a raw pickle;
- inside an archive, every `*.pkl` member, and members that are themselves zip archives (nested, bounded depth).

A save dir is scanned whole: every iteration dir, and the files beside them. `latest_checkpointed_iteration.txt`
is text and never parsed as a pickle.

Each pickle is walked by `pickling.walk.walk_pickle` (nothing is unpickled, imported or called); its globals are
classified by `pickling.allowlist.classify`: dangerous → CK601, outside the allowlist → CK602. A pickle or archive beyond
the resource bounds is CK603; one that cannot be walked (truncated, not an archive) gets the reader's code for that
location (CK106 `.metadata`, CK205 stored item, CK206 `.pt` file).

This module walks files and directories; walking one container (raw pickle, zip archive, nested archives,
unreferenced bytes) is `services/safety_containers.py`, one file (`.metadata`, `.pt`, `.distcp` and its
stored items) `services/safety_scan.py`, shared with the audit's safety check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ckptinspect.services.safety_scan import (
    PICKLE_SUFFIXES,
    FileScan,
    ScanReport,
    items_by_file,
    join_rel,
)
from ckptinspect.findings import Finding, filter_findings, status_of
from ckptinspect.formats.savedir import join_label
from ckptinspect.model import StoredItem
from ckptinspect.io.local import leaves_dir, note_unread, unread_scope
from ckptinspect.io.findings import storage_findings, unread_findings
from ckptinspect.io.objpath import ObjectPath

MAX_DEPTH = 8  # directory levels below the scanned path
MAX_ENTRIES = 200_000  # directory entries visited in one scan
_ITER_NAME = re.compile(r"^(iter_\d+|release|step[-_]\d+)$")


@dataclass(slots=True)
class _Scan(FileScan):
    """One scan in progress: the files (`FileScan`) plus the walk over directories."""

    entries: int = 0
    visited: set[tuple[int, int] | str] = field(default_factory=set)  # directories walked (symlink loops)

    # --- directories ---------------------------------------------------------------------------------------

    def tree(self, path: Path, rel: str, label: str, ckpt_rel: str, depth: int) -> None:
        """Scan the directory `path` (`rel` from the scan root). `label` names the checkpoint its findings belong
        to, `ckpt_rel` is that checkpoint's dir relative to the scan root (subjects are relative to it)."""
        listed = _entries(path)
        if listed is None:
            return
        key, entries = listed
        if key in self.visited:
            return  # a symlink loop or a dir reached twice
        self.visited.add(key)
        self.entries += len(entries)
        if self.entries > MAX_ENTRIES:
            self.findings.append(Finding("CK603", f"{rel or '.'}: more than {MAX_ENTRIES} directory entries; "
                                         "the scan stopped", rel or None, label, {}))
            return
        files = {name: p for name, p, is_dir in entries if not is_dir}
        below = rel[len(ckpt_rel):].lstrip("/")
        self.checkpoint_dir(path, rel, label, f"{below}/" if below else "", files)
        if depth + 1 > MAX_DEPTH:
            return
        for name, p, is_dir in entries:
            if not is_dir:
                continue
            sub_rel = join_rel(rel, name)
            if _ITER_NAME.match(name):
                # An iteration dir of a save dir is a checkpoint of its own: findings name it, as `audit` does.
                self.tree(p, sub_rel, join_label(self.label, sub_rel), sub_rel, depth + 1)
                self.findings.extend(unread_findings(p, join_label(self.label, sub_rel), self.findings))
            else:
                self.tree(p, sub_rel, label, ckpt_rel, depth + 1)

    def checkpoint_dir(self, path: Path, rel: str, label: str, prefix: str, files: Mapping[str, Path]) -> None:
        """The files of one directory: `.metadata` + `.distcp` items, and pickle files by name."""
        items: dict[str, list[tuple[str, StoredItem]]] = {}
        for name in sorted(files):
            if name.startswith(".metadata"):
                data = self.raw_file(files[name], rel, label, prefix + name, "CK106")
                if name == ".metadata" and data is not None:
                    # Located with the allowlisting unpickler (nothing runs), and only after the walk found the
                    # pickle whole and within bounds: the C unpickler has no bound of its own on memo indices.
                    items = items_by_file(data, self.bounds)
        for name in sorted(files):
            p = files[name]
            if name.endswith(PICKLE_SUFFIXES):
                self.pickle_file(p, rel, label, prefix + name)
            elif name.endswith(".distcp") or name in items:
                if items and name not in items:
                    self.findings.append(Finding(
                        "CK204", f"{prefix}{name}: data file not referenced by .metadata (stale leftover?); scanned "
                        "by its zip headers", prefix + name, label, {"file": join_rel(rel, name)}))
                self.data_file(p, rel, label, prefix, name, items.get(name, []))
        for name in sorted(set(items) - set(files)):
            # `.metadata` may name files in sub-directories (relative_path with a '/'), or outside the checkpoint
            # dir: DCP's FileSystemReader opens `path / relative_path` whatever it is (torch 2.13 filesystem.py
            # `read_data`), so those are scanned too, and leaving the dir is a finding of its own.
            if leaves_dir(name):
                self.findings.append(Finding(
                    "CK207", f"{prefix}{name}: .metadata places {len(items[name])} item(s) outside the checkpoint "
                    "dir; DCP would read (and unpickle) them from there", prefix + name, label,
                    {"file": join_rel(rel, name), "items": len(items[name])}))
            if "/" in name or leaves_dir(name):
                self.data_file(path / name, rel, label, prefix, name, items[name])


# --- public API ----------------------------------------------------------------------------------------------------


def scan_path(path: Path, label: str | None = None, select: Iterable[str] = (),
              ignore: Iterable[str] = ()) -> ScanReport:
    """Scan a save dir, a checkpoint dir, or one file. Never raises for a broken or hostile checkpoint.

    The caller checks that `path` exists (the CLI turns a missing path into a usage error). `select` / `ignore`
    filter the findings by code prefix before the status is derived, as `audit` does.
    """
    label = label if label is not None else str(path)
    s = _Scan(label)
    with unread_scope():
        try:
            is_dir = path.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            s.tree(path, "", label, "", 0)
        elif path.name.startswith(".metadata"):
            s.raw_file(path, "", label, path.name, "CK106")
        else:
            s.pickle_file(path, "", label, path.name)
        # an object that changed, vanished or was denied (CK22x); a local file or dir it could not read (CK209)
        s.findings.extend(storage_findings(path, label, s.findings))
    kept = tuple(filter_findings(s.findings, select, ignore))
    return ScanReport(label, status_of(kept), kept, tuple(s.pickles))


# --- helpers -------------------------------------------------------------------------------------------------------


def _entries(path: Path) -> tuple[tuple[int, int] | str, list[tuple[str, Path, bool]]] | None:
    """(identity, sorted (name, path, is_dir) entries) of a directory, or None when it cannot be listed. Locally
    the identity is (device, inode) and symlinks are followed (loops are caught by identity); an object-storage
    prefix is answered from its cached listing (one request per prefix) and identified by its URL."""
    if isinstance(path, ObjectPath):
        try:
            listing = path.store.listing(path.key)
        except OSError:
            return None
        named = [(n, path / n, False) for n in listing.files] + [(n, path / n, True) for n in listing.dirs]
        return path.url, sorted(named, key=lambda e: e[0])
    try:
        st = os.stat(path)
        scanned = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as err:
        note_unread(path, err, "list")  # a dir it may not list: CK209, never an empty dir
        return None
    out: list[tuple[str, Path, bool]] = []
    for e in scanned:
        try:
            is_dir = e.is_dir()  # follows symlinks; loops are caught by the identity
        except OSError as err:
            note_unread(path, err, "enter")
            continue
        out.append((e.name, Path(e.path), is_dir))
    return (st.st_dev, st.st_ino), out


