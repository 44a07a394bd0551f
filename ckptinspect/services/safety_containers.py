"""The container half of the pickle-safety scan (`safety_scan.py`): walking one container and recording what it holds.

A container is a raw pickle, a `torch.save` zip archive or a pre-1.6 `torch.save` tar file (`pickling.tar_archive`):
a whole file, or a stored item's byte range inside a `.distcp`. An archive's `*.pkl` members are walked, and members
that are zip archives themselves are opened in turn (nested, bounded depth). The bytes of a data file no stored item covers are split at their zip end records and the
candidates opened as archives. Every pickle walked becomes a `PickleScan` plus its findings (CK601 dangerous, CK602
outside the allowlist, CK603 / CK605 beyond the bounds, or the location's code when it cannot be walked); a TorchScript
archive is CK606. Nothing is unpickled: pickles go through `pickling.walk.walk_pickle` only.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ckptinspect.findings import Finding
from ckptinspect.model import frozen
from ckptinspect.pickling.candidates import EXTRA_STATE, Walked, archive_walks, blob_walks
from ckptinspect.pickling.report import bound_finding, safety_findings
from ckptinspect.pickling.zipdir import ZipMember, data_offset, is_pickle_member, member_bytes
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.tar_archive import tar_walks
from ckptinspect.pickling.torch_archive import is_main_pickle
from ckptinspect.pickling.walk import PickleWalk, is_pickle_start, walk_pickle, walk_stream
from ckptinspect.pickling.unpickle import MAX_PICKLE_BYTES, PREWALK_MAX_BYTES

MAX_NESTED = 3  # zip archives inside zip archives
MAX_MEMBERS = 100_000  # members of one archive
MAX_NESTED_BYTES = 256 << 20  # a compressed nested archive is inflated in memory up to this
MAX_FALLBACK_BYTES = 4 << 30  # kept for callers; unreferenced bytes are walked by zip headers, never searched whole
MAX_TAIL = 22 + 0xFFFF  # an end record lies within its archive's last 64 KiB + 22 bytes
ZIP_LOCAL = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
CENTRAL = b"PK\x01\x02"
END64 = b"PK\x06\x06"
END64_LOCATOR = b"PK\x06\x07"
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "globals", frozen(self.globals))

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
    # DCP stream transforms undone (`formats/transforms.py`): offset is the stored item's, length its decoded size
    transforms: tuple[str, ...] = ()


@dataclass(slots=True)
class ContainerScan:
    """One scan in progress: collected pickles and findings. `safety_scan.FileScan` adds the files."""

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
        subject = where.subject if member is None or is_main_pickle(member) else f"{where.subject}!{member}"
        verdicts = walk.globals
        self.pickles.append(PickleScan(subject, where.file, where.offset, where.length, member,
                                       {q: v.value for q, v in verdicts.items()}, walk.segments,
                                       walk.limit or walk.error))
        loc = where.file + (f" [{where.offset}, +{where.length})" if where.in_file else "")
        loc += f" decoded from {'+'.join(where.transforms)}" if where.transforms else ""
        loc += f" {member}" if member else ""
        details: dict[str, Any] = {"file": where.file, "offset": where.offset, "length": where.length}
        if where.transforms:
            details["transforms"] = list(where.transforms)
        if member:
            details["member"] = member
        what = f"{subject}: pickle in {loc}"
        self.findings.extend(safety_findings(verdicts, walk.called, subject, where.label, what, details))
        if walk.limit is not None:
            self.findings.append(bound_finding(walk.limit, walk.unjudged, subject, where.label, what,
                                               {**details, "pickle_bytes": size}))
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
        tar = tar_walks(f, where.offset, where.length)
        if tar is not None:  # pre-1.6 `torch.save` tar file (`pickling.tar_archive`)
            walks, problem = tar
            for w in walks:
                self.candidate(where, w)
            if problem is not None:
                self.problem(where, problem, where.unreadable_code)
            return True
        if is_pickle_start(head[:2]):
            if where.length > MAX_PICKLE_BYTES:
                self.bound(where, f"pickle of {where.length} bytes exceeds the {MAX_PICKLE_BYTES} byte bound")
                return True
            f.seek(where.offset)
            if where.length > PREWALK_MAX_BYTES:
                self.walked(where, None, walk_stream(f, where.length), where.length)  # bounded memory
                return True
            data = f.read(where.length)
            walk = walk_pickle(data)
            self.walked(where, None, walk, len(data))
            for w in blob_walks(data, walk, "pickle", 1):
                self.candidate(where, w)
            return True
        if not head:
            self.problem(where, "empty: no archive and no pickle", where.unreadable_code)
        else:
            self.problem(where, f"neither a torch zip archive nor a pickle (starts with {head[:4]!r})",
                         where.unreadable_code)
        return False

    def candidate(self, where: Where, w: Walked) -> None:
        """Record one candidate of `archive_walks` / `blob_walks`: a TorchScript archive (CK606), a walked pickle,
        a bound hit (CK605), or a member that cannot be read."""
        if w.torchscript:
            loc = where.file + (f" [{where.offset}, +{where.length})" if where.in_file else "")
            self.findings.append(Finding(
                "CK606", f"{where.subject}: {loc} is a {w.problem} (record {w.where}; not executed)", where.subject,
                where.label, {"file": where.file, "offset": where.offset, "length": where.length, "member": w.where}))
        elif w.walk is not None:
            self.walked(where, w.where, w.walk, w.size)
        elif w.limit:
            self.bound(where, f"{w.where}: {w.problem}")
        else:
            self.problem(where, f"{w.where} unreadable: {w.problem}", where.unreadable_code)

    def bound(self, where: Where, message: str) -> None:
        """A member or byte string that was not judged because a bound of the scanner's was hit (zip bomb, nesting,
        size): fail closed (CK605)."""
        self.findings.append(Finding("CK605", f"{where.subject}: not judged, a bound of the scanner's was hit: "
                                     f"{message} (fail closed)", where.subject, where.label,
                                     {"file": where.file, "offset": where.offset, "length": where.length}))

    def archive(self, f: IO[bytes], where: Where, depth: int) -> bool:
        """Scan a zip archive: every pickle any zip reader could take from it (`pickling.candidates.archive_walks`: member
        name case, duplicates, second central directories, prepended bytes, pickles in tensor storages and byte
        strings), and members that are archives themselves."""
        # A TE `_extra_state` item: Megatron-Core / TE decode its tensor's bytes with `pickle.loads` (any protocol).
        walks, members, why = archive_walks(f, where.offset, where.length,
                                            extra_state=EXTRA_STATE in where.subject)
        if not members:
            self.problem(where, f"not a readable zip archive ({why})", where.unreadable_code)
            return False
        if len(members) > MAX_MEMBERS:
            self.bound(where, f"archive has {len(members)} members (bound {MAX_MEMBERS})")
            return True
        if depth == 0 and not any(is_pickle_member(m.name) for m in members):
            self.problem(where, "zip archive without a .pkl member (not a torch.save archive)", where.unreadable_code)
        for w in walks:
            self.candidate(where, w)
        for m in members:
            # A nested archive needs at least a local header and an end record; torch's own small members
            # (`version`, `byteorder`, ...) and its storages (`data/N`, raw tensor bytes) are skipped.
            if m.size < 22 + 30 or is_pickle_member(m.name) or _STORAGE_DIR.search(m.name):
                continue
            self.nested(f, m, where, depth)
        return True

    def nested(self, f: IO[bytes], m: ZipMember, where: Where, depth: int) -> None:
        """A member that is itself a zip archive (a `torch.save` stored inside an archive) is scanned too."""
        start = data_offset(f, where.offset, where.length, m)
        if start is None:
            return
        if m.method == 0:
            f.seek(where.offset + start)
            if f.read(4) != ZIP_LOCAL:
                return
        inner = Where(where.label, f"{where.subject}!{m.name}", where.file, where.offset, where.length,
                      where.unreadable_code)
        if m.method == 0:
            if depth + 1 > MAX_NESTED:
                self.bound(inner, f"archives nested deeper than {MAX_NESTED}")
                return
            self.archive(f, Where(inner.label, inner.subject, inner.file, where.offset + start, m.compressed_size,
                                  inner.unreadable_code), depth + 1)
            return
        data = member_bytes(f, where.offset, where.length, m, MAX_NESTED_BYTES)
        if isinstance(data, str) or data[:4] != ZIP_LOCAL:
            return
        if depth + 1 > MAX_NESTED:
            self.bound(inner, f"archives nested deeper than {MAX_NESTED}")
            return
        if len(data) > MAX_NESTED_BYTES:
            self.bound(inner, f"compressed nested archive of more than {MAX_NESTED_BYTES} bytes")
            return
        self.archive(io.BytesIO(data), Where(inner.label, inner.subject, inner.file, 0, len(data),
                                             inner.unreadable_code), depth + 1)

    def unreferenced(self, f: IO[bytes], label: str, subject: str, file_rel: str, start: int, end: int) -> None:
        """Bytes of a data file no stored item covers (no `.metadata`, a stale file, stale bytes): torch writes items
        as zip archives back to back, and its local headers carry no sizes (data descriptors), so the archives are
        found from the end backwards: each end record gives its archive's start (end record - directory size -
        directory offset), right after the previous archive's end record. Only end records and directories are
        read, never the tensor bytes; what does not chain that way is not searched further."""
        found: list[tuple[int, int]] = []
        stop = end
        while stop - start >= 22 and len(found) < MAX_MEMBERS:
            lo = max(start, stop - MAX_TAIL)
            f.seek(lo)
            tail = f.read(stop - lo)
            at = _end_record(tail)
            if at is None:
                break
            begin = _archive_start(f, lo + at, tail[at : at + 22])
            if begin is None or begin < start:
                break
            found.append((begin, stop))
            stop = begin
        for begin, finish in reversed(found):
            self.archive(f, Where(label, f"{subject}@{begin}", file_rel, begin, finish - begin, None, True), 0)


# --- helpers -------------------------------------------------------------------------------------------------------


def _end_record(tail: bytes) -> int | None:
    """Offset in `tail` of the end record whose comment reaches the end of `tail` (the last signature otherwise)."""
    i = tail.rfind(ZIP_END)
    last = i
    while i >= 0:
        if i + 22 <= len(tail) and i + 22 + int.from_bytes(tail[i + 20 : i + 22], "little") == len(tail):
            return i
        i = tail.rfind(ZIP_END, 0, i)
    return last if last >= 0 else None


def _archive_start(f: IO[bytes], at: int, rec: bytes) -> int | None:
    """Where the archive whose end record is at `at` starts (zip64 end records followed when present)."""
    if len(rec) < 22:
        return None
    cd_size, cd_offset, dir_end = int.from_bytes(rec[12:16], "little"), int.from_bytes(rec[16:20], "little"), at
    if at >= 20:
        f.seek(at - 20)
        loc = f.read(20)
        if loc[:4] == END64_LOCATOR and at - 76 >= 0:
            f.seek(at - 76)
            r64 = f.read(56)
            if r64[:4] == END64:
                cd_size, cd_offset = int.from_bytes(r64[40:48], "little"), int.from_bytes(r64[48:56], "little")
                dir_end = at - 76
    begin = dir_end - cd_size - cd_offset
    return begin if 0 <= begin <= at else None


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


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 200 else text[:200] + "..."
