"""The container half of the pickle-safety scan (`scan.py`): walking one container and recording what it holds.

A container is a raw pickle or a `torch.save` zip archive: a whole file, or a stored item's byte range inside a
`.distcp`. An archive's `*.pkl` members are walked, and members that are zip archives themselves are opened in turn
(nested, bounded depth). The bytes of a data file no stored item covers are split at their zip end records and the
candidates opened as archives. Every pickle walked becomes a `PickleScan` plus its findings (CK601 dangerous, CK602
outside the allowlist, CK603 beyond the bounds, or the location's code when it cannot be walked). Nothing is
unpickled: pickles go through `pickling.walk.walk_pickle` only.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ckptinspect.findings import Finding
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.walk import PickleWalk, is_pickle_start, walk_pickle
from ckptinspect.safeio import FileSlice
from ckptinspect.pickling.unpickle import MAX_ARCHIVE_PICKLE_BYTES, MAX_PICKLE_BYTES

MAX_NESTED = 3  # zip archives inside zip archives
MAX_MEMBERS = 100_000  # members of one archive
MAX_NESTED_BYTES = 256 << 20  # a compressed nested archive is inflated in memory up to this
MAX_FALLBACK_BYTES = 4 << 30  # unreferenced .distcp bytes searched for archives, per file
ZIP_LOCAL = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
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


@dataclass(slots=True)
class Where:
    """Where a container lies: its checkpoint (label, for findings), subject, file (relative to the scan root)."""

    label: str
    subject: str
    file: str
    offset: int
    length: int
    unreadable_code: str | None  # the code for "cannot be walked"; None = a note only (unreferenced bytes)
    in_file: bool = False  # a region of a data file (a stored item), not a whole file


@dataclass(slots=True)
class ContainerScan:
    """One scan in progress: collected pickles and findings. `scan._Scan` adds the walk over files and directories."""

    label: str
    pickles: list[PickleScan] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    # --- findings ----------------------------------------------------------------------------------------------

    def problem(self, where: Where, message: str, code: str | None) -> None:
        if code is None:
            return
        self.findings.append(Finding(code, f"{where.subject}: {message}", where.subject, where.label,
                                     {"file": where.file, "offset": where.offset, "length": where.length}))

    def walked(self, where: Where, member: str | None, walk: PickleWalk, size: int) -> None:
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

    def container(self, f: IO[bytes], where: Where) -> bool:
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

    def bound(self, where: Where, message: str) -> None:
        self.findings.append(Finding("CK603", f"{where.subject}: {message}", where.subject, where.label,
                                     {"file": where.file, "offset": where.offset, "length": where.length}))

    def archive(self, f: IO[bytes], where: Where, depth: int) -> bool:
        """Scan a zip archive: its `.pkl` members, and members that are archives themselves."""
        view = io.BufferedReader(FileSlice(f, where.offset, where.length))
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

    def member_pickle(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: Where) -> None:
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

    def nested(self, f: IO[bytes], zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: Where, depth: int) -> None:
        """A member that is itself a zip archive (a `torch.save` stored inside an archive) is scanned too."""
        try:
            with zf.open(info) as m:
                head = m.read(4)
        except Exception:  # noqa: BLE001 - any failure of a non-pickle member: nothing to scan there
            return
        if head != ZIP_LOCAL:
            return
        inner = Where(where.label, f"{where.subject}!{info.filename}", where.file, where.offset, where.length,
                      where.unreadable_code)
        if depth + 1 > MAX_NESTED:
            self.bound(inner, f"archives nested deeper than {MAX_NESTED}")
            return
        if info.compress_type == zipfile.ZIP_STORED:
            start = _member_data_offset(f, where.offset, info)
            if start is not None and start + info.file_size <= where.offset + where.length:
                self.archive(f, Where(inner.label, inner.subject, inner.file, start, info.file_size,
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
        self.archive(io.BytesIO(data), Where(inner.label, inner.subject, inner.file, 0, len(data),
                                             inner.unreadable_code), depth + 1)

    def unreferenced(self, f: IO[bytes], label: str, subject: str, file_rel: str, start: int, end: int) -> None:
        """Bytes of a data file no stored item covers (no `.metadata`, stale bytes): torch writes items as zip
        archives back to back, so each candidate runs from a local header to an end record. A candidate that does
        not open (an end-record signature inside tensor bytes) is skipped without a finding."""
        if end - start > MAX_FALLBACK_BYTES:
            self.bound(Where(label, subject, file_rel, start, end - start, None),
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
            if self.archive(f, Where(label, f"{subject}@{begin}", file_rel, begin, stop - begin, None, True), 0):
                cur = stop


# --- helpers -------------------------------------------------------------------------------------------------------


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


def _is_main_pickle(member: str) -> bool:
    """`data.pkl` at the top of a torch archive (``archive/data.pkl``): the pickle `torch.load` reads."""
    return member == "data.pkl" or (member.endswith("/data.pkl") and member.count("/") == 1)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 200 else text[:200] + "..."
