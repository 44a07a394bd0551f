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
unreferenced bytes) is `archives.py`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding, Status, filter_findings, status_of
from ckptinspect.capabilities.scan.archives import ContainerScan, Where
from ckptinspect.safeio import leaves_dir
from ckptinspect.pickling.walk import walk_pickle
from ckptinspect.pickling.unpickle import MAX_PICKLE_BYTES
from ckptinspect.formats.dcp_metadata import read_dcp_metadata
from ckptinspect.formats.savedir import join_label
from ckptinspect.model import ObjectItem, StoredItem, Tensor
from ckptinspect.safeio import open_regular
from ckptinspect.capabilities.scan.archives import PickleScan
from ckptinspect.safeio import Window, file_identity, file_size
from ckptinspect.safeio import open_regular as open_file
from ckptinspect.storage import prefetch
from ckptinspect.storage.findings import storage_findings
from ckptinspect.storage.objpath import ObjectPath

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_DEPTH = 8  # directory levels below the scanned path
MAX_ENTRIES = 200_000  # directory entries visited in one scan
_ITER_NAME = re.compile(r"^(iter_\d+|release|step[-_]\d+)$")


@dataclass(frozen=True, slots=True)
class ScanReport:
    """The result of `scan PATH`: status, findings (CK601/CK602/CK603 and unreadable pickles), every pickle."""

    path: str
    status: Status
    findings: tuple[Finding, ...]
    pickles: tuple[PickleScan, ...]

    @property
    def pickles_scanned(self) -> int:
        return len(self.pickles)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "status": self.status.value, "pickles_scanned": self.pickles_scanned,
            "findings": [f.to_dict() for f in self.findings], "pickles": [p.to_dict() for p in self.pickles],
        }


@dataclass(slots=True)
class _Scan(ContainerScan):
    """One scan in progress: the containers (`ContainerScan`) plus the walk over files and directories."""

    entries: int = 0
    visited: set[tuple[int, int] | str] = field(default_factory=set)  # directories walked (symlink loops)
    located: set[tuple[int, int] | str] = field(default_factory=set)  # data files scanned through `.metadata` items

    # --- files and directories ---------------------------------------------------------------------------------

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
            sub_rel = _join_rel(rel, name)
            if _ITER_NAME.match(name):
                # An iteration dir of a save dir is a checkpoint of its own: findings name it, as `audit` does.
                self.tree(p, sub_rel, join_label(self.label, sub_rel), sub_rel, depth + 1)
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
                    items = _items_by_file(data)
        for name in sorted(files):
            p = files[name]
            if name.endswith(PICKLE_SUFFIXES):
                self.pickle_file(p, rel, label, prefix + name)
            elif name.endswith(".distcp") or name in items:
                if items and name not in items:
                    self.findings.append(Finding(
                        "CK204", f"{prefix}{name}: data file not referenced by .metadata (stale leftover?); scanned "
                        "by its zip headers", prefix + name, label, {"file": _join_rel(rel, name)}))
                self.data_file(p, rel, label, prefix, name, items.get(name, []))
        for name in sorted(set(items) - set(files)):
            # `.metadata` may name files in sub-directories (relative_path with a '/'), or outside the checkpoint
            # dir: DCP's FileSystemReader opens `path / relative_path` whatever it is (torch 2.13 filesystem.py
            # `read_data`), so those are scanned too, and leaving the dir is a finding of its own.
            if leaves_dir(name):
                self.findings.append(Finding(
                    "CK207", f"{prefix}{name}: .metadata places {len(items[name])} item(s) outside the checkpoint "
                    "dir; DCP would read (and unpickle) them from there", prefix + name, label,
                    {"file": _join_rel(rel, name), "items": len(items[name])}))
            if "/" in name or leaves_dir(name):
                self.data_file(path / name, rel, label, prefix, name, items[name])

    def open_regular(self, p: Path, window: Window | None = None) -> IO[bytes] | None:
        """Open a regular file for reading without blocking on FIFOs or devices; None when it is not one.
        An object (object storage) opens as a ranged reader of the `window` ranges."""
        if isinstance(p, ObjectPath):
            try:
                return open_file(p, window=window)
            except OSError:
                return None
        try:
            return open_regular(p)
        except OSError:
            return None

    def raw_file(self, p: Path, rel: str, label: str, subject: str, code: str) -> bytes | None:
        """A file that is one raw pickle (`.metadata`): walk it; return its bytes when the walk went through whole
        and within bounds (they are then safe to hand to the unpickler to locate the stored items)."""
        f = self.open_regular(p)
        if f is None:
            return None
        with f:
            size = file_size(f)
            where = Where(label, subject, _join_rel(rel, p.name), 0, size, code)
            if size > MAX_PICKLE_BYTES:
                self.bound(where, f"pickle of {size} bytes exceeds the {MAX_PICKLE_BYTES} byte bound")
                return None
            try:
                data = f.read(size)
            except OSError as e:
                self.problem(where, f"unreadable: {e.strerror or e}", code)
                return None
        where.length = len(data)
        walk = walk_pickle(data)
        self.walked(where, None, walk, len(data))
        return data if walk.complete else None

    def pickle_file(self, p: Path, rel: str, label: str, subject: str) -> None:
        """A `.pt`-like file: a torch zip archive, a raw pickle (pre-1.6 torch.save, `.pkl`), or unreadable."""
        f = self.open_regular(p)
        if f is None:
            return
        with f:
            size = file_size(f)
            where = Where(label, subject, _join_rel(rel, p.name), 0, size, "CK206")
            try:
                self.container(f, where)
            except OSError as e:
                self.problem(where, f"unreadable: {e.strerror or e}", "CK206")

    def data_file(self, p: Path, rel: str, label: str, prefix: str, name: str,
                  items: list[tuple[str, StoredItem]], gaps: bool = True) -> None:
        """A `.distcp`: every stored item `.metadata` places in it, then (`gaps`) the bytes no item covers."""
        file_rel = _join_rel(rel, name)
        f = self.open_regular(p, None if gaps else [(it.offset, it.length) for _, it in items])
        if f is not None:
            ident = file_identity(f)
            if not items and ident in self.located:
                f.close()  # already scanned through the items a `.metadata` places in it
                return
            if items:
                self.located.add(ident)
        if f is None:
            if items:
                where = Where(label, prefix + name, file_rel, 0, 0, "CK201")
                self.problem(where, f"data file named by .metadata for {len(items)} item(s) is missing or not a "
                                    "regular file: its items were not scanned", "CK201")
            return
        with f:
            size = file_size(f)
            covered: list[tuple[int, int]] = []
            for key, item in sorted(items, key=lambda x: (x[1].offset, x[0])):
                where = Where(label, key, file_rel, item.offset, item.length, "CK205", in_file=True)
                if item.offset < 0 or item.length < 0 or item.end > size:
                    self.problem(where, f"stored item [{item.offset}, {item.end}) lies past the end of {name} "
                                        f"({size} bytes)", "CK202")
                    continue
                if item.transforms:
                    self.problem(where, f"stored item uses stream transforms {list(item.transforms)}: not scanned",
                                 "CK205")
                    continue
                covered.append((item.offset, item.end))
                try:
                    self.container(f, where)
                except OSError as e:
                    self.problem(where, f"unreadable: {e.strerror or e}", "CK205")
            if gaps:
                for start, end in _gaps(covered, size):
                    self.unreferenced(f, label, prefix + name, file_rel, start, end)


# --- public API ----------------------------------------------------------------------------------------------------


def scan_path(path: Path, label: str | None = None, select: Iterable[str] = (),
              ignore: Iterable[str] = ()) -> ScanReport:
    """Scan a save dir, a checkpoint dir, or one file. Never raises for a broken or hostile checkpoint.

    The caller checks that `path` exists (the CLI turns a missing path into a usage error). `select` / `ignore`
    filter the findings by code prefix before the status is derived, as `audit` does.
    """
    label = label if label is not None else str(path)
    s = _Scan(label)
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
    s.findings.extend(storage_findings(path, label))  # an object that changed, vanished or was denied (CK22x)
    kept = tuple(filter_findings(s.findings, select, ignore))
    return ScanReport(label, status_of(kept), kept, tuple(s.pickles))


def scan_stored_items(ckpt_dir: Path, label: str, items: Iterable[tuple[str, StoredItem]],
                      report_unreadable: bool = False) -> ScanReport:
    """Scan the given stored items of a DCP checkpoint dir (for `audit`: byte items and tensor archives inside the
    `.distcp` files). With `report_unreadable` False only CK601/CK602/CK603 are reported: the storage checks already
    say which items are missing, truncated or not archives.
    """
    s = _Scan(label)
    by_file: dict[str, list[tuple[str, StoredItem]]] = {}
    for key, item in items:
        by_file.setdefault(item.file, []).append((key, item))
    names = sorted(by_file)
    # From object storage, the windows of the next files are fetched in parallel while this one is walked (the
    # same coalesced GETs, earlier); locally `ahead` yields at once.
    jobs = [(ckpt_dir / n, [(it.offset, it.length) for _, it in by_file[n]]) for n in names]
    for i in prefetch.ahead(jobs):
        # Also outside the checkpoint dir: DCP reads them from there (the storage check reports CK207).
        s.data_file(ckpt_dir / names[i], "", label, "", names[i], by_file[names[i]], gaps=False)
    findings = [f for f in s.findings if report_unreadable or f.code in _SAFETY_CODES]
    return ScanReport(label, status_of(findings), tuple(findings), tuple(s.pickles))


_SAFETY_CODES = frozenset({"CK601", "CK602", "CK603", "CK604"})


def stored_items(tensors: Iterable[Tensor], objects: Iterable[ObjectItem]) -> Iterator[tuple[str, StoredItem]]:
    """(subject, item) for every byte item of `objects` and every chunk of `tensors` (the neutral model); a chunk's
    subject is ``key@offsets``."""
    for o in objects:
        if o.storage is not None:
            yield o.key, o.storage
    for t in tensors:
        for c in t.chunks:
            if c.storage is not None:
                yield f"{t.key}@{','.join(str(x) for x in c.offsets)}", c.storage


# --- helpers -------------------------------------------------------------------------------------------------------


def _items_by_file(data: bytes) -> dict[str, list[tuple[str, StoredItem]]]:
    """Stored items of a `.metadata` (read with the allowlisting unpickler: nothing is executed), by file."""
    try:
        md = read_dcp_metadata(data)
    except ReadError:
        return {}
    except Exception:  # noqa: BLE001 - a malformed .metadata only costs the item locations; its walk reported it
        return {}
    out: dict[str, list[tuple[str, StoredItem]]] = {}
    for key, item in stored_items(md.tensors, md.objects):
        out.setdefault(item.file, []).append((key, item))
    return out



def _gaps(covered: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int]]:
    """Byte ranges of [0, size) outside every covered range (at least 22 bytes: room for a zip end record)."""
    pos = 0
    for a, b in sorted(covered):
        if a - pos >= 22:
            yield pos, a
        pos = max(pos, b)
    if size - pos >= 22:
        yield pos, size






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
    except OSError:
        return None
    out: list[tuple[str, Path, bool]] = []
    for e in scanned:
        try:
            is_dir = e.is_dir()  # follows symlinks; loops are caught by the identity
        except OSError:
            continue
        out.append((e.name, Path(e.path), is_dir))
    return (st.st_dev, st.st_ino), out


def _join_rel(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
