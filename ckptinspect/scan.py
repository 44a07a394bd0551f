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

Each pickle is walked by `_pickle_scan.walk_pickle` (nothing is unpickled, imported or called); its globals are
classified by `_globals.classify`: dangerous → CK601, outside the allowlist → CK602. A pickle or archive beyond
the resource bounds is CK603; one that cannot be walked (truncated, not an archive) gets the reader's code for that
location (CK106 `.metadata`, CK205 stored item, CK206 `.pt` file).
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding, Status, filter_findings, status_of
from ckptinspect.formats._globals import GlobalClass
from ckptinspect.formats._pickle_scan import PickleWalk, is_pickle_start, walk_pickle
from ckptinspect.formats._unpickle import MAX_ARCHIVE_PICKLE_BYTES, MAX_PICKLE_BYTES, _Slice
from ckptinspect.formats.dcp_metadata import read_dcp_metadata
from ckptinspect.model import ObjectItem, StoredItem, Tensor

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_DEPTH = 8  # directory levels below the scanned path
MAX_ENTRIES = 200_000  # directory entries visited in one scan
MAX_NESTED = 3  # zip archives inside zip archives
MAX_MEMBERS = 100_000  # members of one archive
MAX_NESTED_BYTES = 256 << 20  # a compressed nested archive is inflated in memory up to this
MAX_FALLBACK_BYTES = 4 << 30  # unreferenced .distcp bytes searched for archives, per file
ZIP_LOCAL = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
_ITER_NAME = re.compile(r"^(iter_\d+|release|step[-_]\d+)$")
_STORAGE_DIR = re.compile(r"(^|/)data/[^/]+$")  # torch archive storages: raw tensor bytes, never unpickled


@dataclass(frozen=True, slots=True)
class PickleScan:
    """One pickle that was walked.

    subject: what it is inside its checkpoint (``.metadata``, ``common.pt``, an item key such as
      ``common_state/shard_0_1``, a tensor chunk ``key@offsets``), ``!member`` appended for extra archive members.
    file: the file holding it, relative to the scanned path.
    offset / length: where the container (the whole file, or the stored item) lies in `file`.
    member: the archive member that is the pickle (``archive/data.pkl``), None for a raw pickle.
    globals: every global it references → ``allowed`` / ``unknown`` / ``dangerous``.
    problem: why the walk stopped early (truncated, bound hit), or None.
    """

    subject: str
    file: str
    offset: int
    length: int
    member: str | None
    globals: Mapping[str, str]
    segments: int = 1
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject, "file": self.file, "offset": self.offset, "length": self.length,
            "member": self.member, "globals": dict(self.globals), "segments": self.segments,
            "problem": self.problem,
        }

    def names(self, verdict: GlobalClass) -> list[str]:
        return sorted(q for q, v in self.globals.items() if v == verdict.value)


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
class _Where:
    """Where a container lies: its checkpoint (label, for findings), subject, file (relative to the scan root)."""

    label: str
    subject: str
    file: str
    offset: int
    length: int
    unreadable_code: str | None  # the code for "cannot be walked"; None = a note only (unreferenced bytes)
    in_file: bool = False  # a region of a data file (a stored item), not a whole file


@dataclass(slots=True)
class _Scan:
    """One scan in progress: collected pickles and findings."""

    label: str
    pickles: list[PickleScan] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    entries: int = 0
    visited: set[tuple[int, int]] = field(default_factory=set)  # directories walked (symlink loops)
    located: set[tuple[int, int]] = field(default_factory=set)  # data files scanned through `.metadata` items

    # --- findings ----------------------------------------------------------------------------------------------

    def problem(self, where: _Where, message: str, code: str | None) -> None:
        if code is None:
            return
        self.findings.append(Finding(code, f"{where.subject}: {message}", where.subject, where.label,
                                     {"file": where.file, "offset": where.offset, "length": where.length}))

    def walked(self, where: _Where, member: str | None, walk: PickleWalk, size: int) -> None:
        """Record one walked pickle and its findings."""
        subject = where.subject if member is None or _is_main_pickle(member) else f"{where.subject}!{member}"
        verdicts = walk.globals
        self.pickles.append(PickleScan(subject, where.file, where.offset, where.length, member,
                                       {q: v.value for q, v in verdicts.items()}, walk.segments,
                                       walk.limit or walk.error))
        loc = where.file + (f" [{where.offset}, +{where.length})" if where.in_file else "")
        loc += f" {member}" if member else ""
        details: dict[str, Any] = {"file": where.file, "offset": where.offset, "length": where.length}
        if member:
            details["member"] = member
        dangerous = sorted(q for q, v in verdicts.items() if v is GlobalClass.DANGEROUS)
        unknown = sorted(q for q, v in verdicts.items() if v is GlobalClass.UNKNOWN)
        if dangerous:
            self.findings.append(Finding(
                "CK601", f"{subject}: pickle in {loc} references dangerous callable(s) {', '.join(dangerous)}"
                " (not executed)", subject, where.label, {**details, "globals": dangerous}))
        if unknown:
            self.findings.append(Finding(
                "CK602", f"{subject}: pickle in {loc} references global(s) outside the allowlist: "
                f"{', '.join(unknown)} (kept opaque, not executed)", subject, where.label,
                {**details, "globals": unknown}))
        if walk.limit is not None:
            self.findings.append(Finding("CK603", f"{subject}: pickle in {loc} exceeds the scanner's bounds: "
                                         f"{walk.limit}", subject, where.label, {**details, "pickle_bytes": size}))
        elif walk.error is not None:
            self.problem(where, f"pickle{' ' + member if member else ''} cannot be walked to its end: {walk.error}",
                         where.unreadable_code)

    # --- containers --------------------------------------------------------------------------------------------

    def container(self, f: IO[bytes], where: _Where) -> bool:
        """Scan the bytes [offset, offset+length) of `f`: a zip archive, or a raw pickle. False when it is neither
        or cannot be opened."""
        f.seek(where.offset)
        head = f.read(min(4, where.length))
        if head[:4] == ZIP_LOCAL:
            return self.archive(f, where, 0)
        if is_pickle_start(head[:2]):
            if where.length > MAX_PICKLE_BYTES:
                self.bound(where, f"pickle of {where.length} bytes exceeds the {MAX_PICKLE_BYTES} byte bound")
                return True
            f.seek(where.offset)
            data = f.read(where.length)
            self.walked(where, None, walk_pickle(data), len(data))
            return True
        if not head:
            self.problem(where, "empty: no archive and no pickle", where.unreadable_code)
        else:
            self.problem(where, f"neither a torch zip archive nor a pickle (starts with {head[:4]!r})",
                         where.unreadable_code)
        return False

    def bound(self, where: _Where, message: str) -> None:
        self.findings.append(Finding("CK603", f"{where.subject}: {message}", where.subject, where.label,
                                     {"file": where.file, "offset": where.offset, "length": where.length}))

    def archive(self, f: IO[bytes], where: _Where, depth: int) -> bool:
        """Scan a zip archive: its `.pkl` members, and members that are archives themselves."""
        view = io.BufferedReader(_Slice(f, where.offset, where.length))
        try:
            zf = zipfile.ZipFile(view)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError,
                KeyError, UnicodeDecodeError) as e:
            self.problem(where, f"not a readable zip archive ({_short(e)})", where.unreadable_code)
            return False
        with zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                self.bound(where, f"archive has {len(infos)} members (bound {MAX_MEMBERS})")
                return True
            pickles = [i for i in infos if i.filename.endswith(".pkl")]
            if not pickles and depth == 0:
                self.problem(where, "zip archive without a .pkl member (not a torch.save archive)",
                             where.unreadable_code)
            for info in pickles:
                self.member_pickle(zf, info, where)
            for info in infos:
                # A nested archive needs at least a local header and an end record; torch's own small members
                # (`version`, `byteorder`, ...) and its storages (`data/N`, raw tensor bytes) are skipped.
                if info.file_size < 22 + 30 or info.filename.endswith(".pkl") or _STORAGE_DIR.search(info.filename):
                    continue
                self.nested(f, zf, info, where, depth)
        return True

    def member_pickle(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: _Where) -> None:
        name = info.filename
        if info.file_size > MAX_ARCHIVE_PICKLE_BYTES:
            self.bound(where, f"{name} claims {info.file_size} bytes uncompressed (bound "
                              f"{MAX_ARCHIVE_PICKLE_BYTES}; zip bomb?)")
            return
        data = _read_member(zf, info, MAX_ARCHIVE_PICKLE_BYTES)
        if isinstance(data, str):
            self.problem(where, f"{name} unreadable: {data}", where.unreadable_code)
            return
        if len(data) > MAX_ARCHIVE_PICKLE_BYTES:
            self.bound(where, f"{name} inflates past {MAX_ARCHIVE_PICKLE_BYTES} bytes (zip bomb?)")
            return
        self.walked(where, name, walk_pickle(data), len(data))

    def nested(self, f: IO[bytes], zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: _Where, depth: int) -> None:
        """A member that is itself a zip archive (a `torch.save` stored inside an archive) is scanned too."""
        try:
            with zf.open(info) as m:
                head = m.read(4)
        except Exception:  # noqa: BLE001 - any failure of a non-pickle member: nothing to scan there
            return
        if head != ZIP_LOCAL:
            return
        inner = _Where(where.label, f"{where.subject}!{info.filename}", where.file, where.offset, where.length,
                       where.unreadable_code)
        if depth + 1 > MAX_NESTED:
            self.bound(inner, f"archives nested deeper than {MAX_NESTED}")
            return
        if info.compress_type == zipfile.ZIP_STORED:
            start = _member_data_offset(f, where.offset, info)
            if start is not None and start + info.file_size <= where.offset + where.length:
                self.archive(f, _Where(inner.label, inner.subject, inner.file, start, info.file_size,
                                       inner.unreadable_code), depth + 1)
                return
        if info.file_size > MAX_NESTED_BYTES:
            self.bound(inner, f"compressed nested archive of {info.file_size} bytes (bound {MAX_NESTED_BYTES})")
            return
        data = _read_member(zf, info, MAX_NESTED_BYTES)
        if isinstance(data, str) or len(data) > MAX_NESTED_BYTES:
            self.problem(inner, f"nested archive unreadable: {data if isinstance(data, str) else 'too large'}",
                         where.unreadable_code)
            return
        self.archive(io.BytesIO(data), _Where(inner.label, inner.subject, inner.file, 0, len(data),
                                              inner.unreadable_code), depth + 1)

    # --- files and directories ---------------------------------------------------------------------------------

    def tree(self, path: Path, rel: str, label: str, ckpt_rel: str, depth: int) -> None:
        """Scan the directory `path` (`rel` from the scan root). `label` names the checkpoint its findings belong
        to, `ckpt_rel` is that checkpoint's dir relative to the scan root (subjects are relative to it)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key in self.visited:
            return  # a symlink loop or a dir reached twice
        self.visited.add(key)
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        self.entries += len(entries)
        if self.entries > MAX_ENTRIES:
            self.findings.append(Finding("CK603", f"{rel or '.'}: more than {MAX_ENTRIES} directory entries; "
                                         "the scan stopped", rel or None, label, {}))
            return
        files: dict[str, Path] = {}
        dirs: list[os.DirEntry[str]] = []
        for e in entries:
            try:
                if e.is_dir():  # follows symlinks; loops are caught by `visited`
                    dirs.append(e)
                    continue
            except OSError:
                continue
            files[e.name] = Path(e.path)
        below = rel[len(ckpt_rel):].lstrip("/")
        self.checkpoint_dir(path, rel, label, f"{below}/" if below else "", files)
        if depth + 1 > MAX_DEPTH:
            return
        for e in dirs:
            sub_rel = _join_rel(rel, e.name)
            if _ITER_NAME.match(e.name):
                # An iteration dir of a save dir is a checkpoint of its own: findings name it, as `audit` does.
                self.tree(Path(e.path), sub_rel, _join(self.label, sub_rel), sub_rel, depth + 1)
            else:
                self.tree(Path(e.path), sub_rel, label, ckpt_rel, depth + 1)

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
                self.data_file(p, rel, label, prefix, name, items.get(name, []))
        for name in sorted(set(items) - set(files)):
            # `.metadata` may name files in sub-directories (relative_path with a '/'); scan those too.
            if "/" in name and ".." not in name.split("/"):
                self.data_file(path / name, rel, label, prefix, name, items[name])

    def open_regular(self, p: Path) -> IO[bytes] | None:
        """Open a regular file for reading without blocking on FIFOs or devices; None when it is not one."""
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            return os.fdopen(fd, "rb")
        except OSError:
            os.close(fd)
            return None

    def raw_file(self, p: Path, rel: str, label: str, subject: str, code: str) -> bytes | None:
        """A file that is one raw pickle (`.metadata`): walk it; return its bytes when the walk went through whole
        and within bounds (they are then safe to hand to the unpickler to locate the stored items)."""
        f = self.open_regular(p)
        if f is None:
            return None
        with f:
            size = os.fstat(f.fileno()).st_size
            where = _Where(label, subject, _join_rel(rel, p.name), 0, size, code)
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
            size = os.fstat(f.fileno()).st_size
            where = _Where(label, subject, _join_rel(rel, p.name), 0, size, "CK206")
            try:
                self.container(f, where)
            except OSError as e:
                self.problem(where, f"unreadable: {e.strerror or e}", "CK206")

    def data_file(self, p: Path, rel: str, label: str, prefix: str, name: str,
                  items: list[tuple[str, StoredItem]], gaps: bool = True) -> None:
        """A `.distcp`: every stored item `.metadata` places in it, then (`gaps`) the bytes no item covers."""
        file_rel = _join_rel(rel, name)
        f = self.open_regular(p)
        if f is not None:
            st = os.fstat(f.fileno())
            if not items and (st.st_dev, st.st_ino) in self.located:
                f.close()  # already scanned through the items a `.metadata` places in it
                return
            if items:
                self.located.add((st.st_dev, st.st_ino))
        if f is None:
            if items:
                where = _Where(label, prefix + name, file_rel, 0, 0, "CK201")
                self.problem(where, f"data file named by .metadata for {len(items)} item(s) is missing or not a "
                                    "regular file: its items were not scanned", "CK201")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            covered: list[tuple[int, int]] = []
            for key, item in sorted(items, key=lambda x: (x[1].offset, x[0])):
                where = _Where(label, key, file_rel, item.offset, item.length, "CK205", in_file=True)
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

    def unreferenced(self, f: IO[bytes], label: str, subject: str, file_rel: str, start: int, end: int) -> None:
        """Bytes of a data file no stored item covers (no `.metadata`, stale bytes): torch writes items as zip
        archives back to back, so each candidate runs from a local header to an end record. A candidate that does
        not open (an end-record signature inside tensor bytes) is skipped without a finding."""
        if end - start > MAX_FALLBACK_BYTES:
            self.bound(_Where(label, subject, file_rel, start, end - start, None),
                       f"{end - start} unreferenced bytes: only the first {MAX_FALLBACK_BYTES} are searched")
            end = start + MAX_FALLBACK_BYTES
        cur = start
        for rec_at in _find_all(f, ZIP_END, start, end):
            if rec_at < cur:
                continue
            f.seek(rec_at + 20)
            clen = f.read(2)
            stop = rec_at + 22 + (int.from_bytes(clen, "little") if len(clen) == 2 else 0)
            if stop > end:
                continue
            begin = _find(f, ZIP_LOCAL, cur, rec_at)
            if begin is None:
                continue
            if self.archive(f, _Where(label, f"{subject}@{begin}", file_rel, begin, stop - begin, None, True), 0):
                cur = stop


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
    for name in sorted(by_file):
        if name.startswith("/") or ".." in name.split("/"):
            continue
        s.data_file(ckpt_dir / name, "", label, "", name, by_file[name], gaps=False)
    findings = [f for f in s.findings if report_unreadable or f.code in _SAFETY_CODES]
    return ScanReport(label, status_of(findings), tuple(findings), tuple(s.pickles))


_SAFETY_CODES = frozenset({"CK601", "CK602", "CK603"})


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


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, bound: int) -> bytes | str:
    """At most bound+1 bytes of an archive member, or why it cannot be read."""
    try:
        with zf.open(info) as m:
            return m.read(bound + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, zlib.error,
            KeyError, UnicodeDecodeError) as e:
        return _short(e)


def _member_data_offset(f: IO[bytes], base: int, info: zipfile.ZipInfo) -> int | None:
    """Absolute offset of a stored member's bytes: after its 30-byte local header, name and extra field."""
    try:
        f.seek(base + info.header_offset)
        head = f.read(30)
    except (OSError, ValueError):
        return None
    if len(head) < 30 or head[:4] != ZIP_LOCAL:
        return None
    return base + info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30],
                                                                                                  "little")


def _gaps(covered: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int]]:
    """Byte ranges of [0, size) outside every covered range (at least 22 bytes: room for a zip end record)."""
    pos = 0
    for a, b in sorted(covered):
        if a - pos >= 22:
            yield pos, a
        pos = max(pos, b)
    if size - pos >= 22:
        yield pos, size


def _find_all(f: IO[bytes], needle: bytes, start: int, end: int, block: int = 1 << 20) -> Iterator[int]:
    """Every offset of `needle` in [start, end) of `f`, read block by block (bounded memory)."""
    pos = start
    keep = len(needle) - 1
    while pos < end:
        f.seek(pos)
        chunk = f.read(min(block, end - pos))
        if not chunk:
            return
        i = chunk.find(needle)
        while i >= 0:
            yield pos + i
            i = chunk.find(needle, i + 1)
        if pos + len(chunk) >= end:
            return
        pos += max(1, len(chunk) - keep)


def _find(f: IO[bytes], needle: bytes, start: int, end: int) -> int | None:
    pos = start
    while pos < end:
        f.seek(pos)
        chunk = f.read(min(1 << 20, end - pos + len(needle) - 1))
        i = chunk.find(needle)
        if i >= 0 and pos + i < end:
            return pos + i
        if len(chunk) < len(needle):
            return None
        pos += len(chunk) - len(needle) + 1
    return None


def _join(label: str, name: str) -> str:
    return f"{label.rstrip('/')}/{name}"


def _join_rel(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _is_main_pickle(member: str) -> bool:
    """`data.pkl` at the top of a torch archive (``archive/data.pkl``): the pickle `torch.load` reads."""
    return member == "data.pkl" or (member.endswith("/data.pkl") and member.count("/") == 1)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 200 else text[:200] + "..."
