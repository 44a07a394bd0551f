"""The file half of the pickle-safety scan: `.metadata`, `.pt`-like files and `.distcp` data files with their stored
items, each walked as containers (`safety_containers.py`). The safety check (`checks/safety.py`) scans the stored
items of a checkpoint with `scan_stored_items`; the `scan` command (`commands/scan/`) adds the walk over
directories. Nothing is unpickled: pickles go through `pickling.walk.walk_pickle` only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ckptinspect.services.safety_containers import ContainerScan, PickleScan, Where
from ckptinspect.errors import LimitExceeded, ReadError, read_code
from ckptinspect.findings import Finding, Status, status_of
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.transforms import MAX_DECODED_BYTES, Shifted, Undecodable, decode_item, tensor_bound
from ckptinspect.model import ObjectItem, StoredItem, Tensor, dtype_size
from ckptinspect.pickling.unpickle import MAX_PICKLE_BYTES
from ckptinspect.pickling.walk import walk_pickle
from ckptinspect.io.local import Window, file_identity, file_size, noted, open_regular
from ckptinspect.io.local import open_regular as open_file
from ckptinspect.io import prefetch
from ckptinspect.io.objpath import ObjectPath

PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt")


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
class FileScan(ContainerScan):
    """One scan in progress: the containers (`ContainerScan`) plus the files that hold them (`.metadata`, `.pt`,
    `.distcp` with its stored items). `commands.scan.scan._Scan` adds the walk over directories."""

    located: set[tuple[int, int] | str] = field(default_factory=set)  # data files scanned through `.metadata` items
    # (file, offset) of a stream-transformed tensor item -> the most bytes it may decode to (`decode_bounds`)
    bounds: dict[tuple[str, int], int] = field(default_factory=dict)

    # --- files ------------------------------------------------------------------------------------------------

    def open_regular(self, p: Path, window: Window | None = None) -> IO[bytes] | None:
        """Open a regular file for reading without blocking on FIFOs or devices; None when it is not one, or cannot
        be opened (noted by `io.local` when for access: the scan's caller reports it as CK209).
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
            where = Where(label, subject, join_rel(rel, p.name), 0, size, code)
            if size > MAX_PICKLE_BYTES:
                self.bound(where, f"pickle of {size} bytes exceeds the {MAX_PICKLE_BYTES} byte bound")
                return None
            try:
                data = f.read(size)
            except OSError as e:
                self.problem(where, f"unreadable: {e.strerror or e}", read_code(e, code))
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
            where = Where(label, subject, join_rel(rel, p.name), 0, size, "CK206")
            try:
                self.container(f, where)
            except OSError as e:
                self.problem(where, f"unreadable: {e.strerror or e}", read_code(e, "CK206"))

    def data_file(self, p: Path, rel: str, label: str, prefix: str, name: str,
                  items: list[tuple[str, StoredItem]], gaps: bool = True,
                  window: list[tuple[int, int]] | None = None) -> None:
        """A `.distcp`: every stored item `.metadata` places in it, then (`gaps`) the bytes no item covers.
        `window`: the items' (offset, length) ranges, when the caller has them already."""
        file_rel = join_rel(rel, name)
        if not gaps and window is None:
            window = [(it.offset, it.length) for _, it in items]
        f = self.open_regular(p, None if gaps else window)
        if f is not None:
            ident = file_identity(f)
            if not items and ident in self.located:
                f.close()  # already scanned through the items a `.metadata` places in it
                return
            if items:
                self.located.add(ident)
        if f is None:
            if items and noted(p) is None:  # a file it may not read is CK209 (from the note), not missing
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
                covered.append((item.offset, item.end))
                try:
                    if item.transforms:
                        bound = self.bounds.get((name, item.offset))
                        self.transformed(f, where, item, MAX_DECODED_BYTES if bound is None else bound,
                                         tensor=bound is not None)
                    else:
                        self.container(f, where)
                except OSError as e:
                    self.problem(where, f"unreadable: {e.strerror or e}", read_code(e, "CK205"))
            if gaps:
                for start, end in _gaps(covered, size):
                    self.unreferenced(f, label, prefix + name, file_rel, start, end)


    def transformed(self, f: IO[bytes], where: Where, item: StoredItem, bound: int, tensor: bool = False) -> None:
        """A stream-transformed stored item: decoded within `bound` (`formats/transforms.py`), then scanned as the
        item DCP's reader hands to `torch.load`. Not decodable here (CK208), a tensor item decoding past its own size
        (CK603: DCP rejects it, nothing in it is unpickled), a byte item decoding past the bound (CK605: not judged,
        fail closed) or a broken stream (CK205): not scanned, and said so."""
        try:
            decoded = decode_item(f, item.offset, item.length, item.transforms, bound)
        except Undecodable as e:
            self.problem(where, f"{e}: not scanned", "CK208")
            return
        except LimitExceeded as e:
            if tensor:
                self.problem(where, f"{e}: not scanned", "CK603")
            else:
                self.bound(where, f"{e}: not scanned")
            return
        except ReadError as e:
            self.problem(where, f"{e}: not scanned", "CK205")
            return
        with decoded:
            size = decoded.seek(0, os.SEEK_END)
            self.container(Shifted(decoded, item.offset),  # type: ignore[arg-type]
                           Where(where.label, where.subject, where.file, item.offset, size, where.unreadable_code,
                                 True, item.transforms))


def scan_stored_items(ckpt_dir: Path, label: str, items: Iterable[tuple[str, StoredItem]],
                      report_unreadable: bool = False,
                      bounds: dict[tuple[str, int], int] | None = None) -> ScanReport:
    """Scan the given stored items of a DCP checkpoint dir (for `audit`: byte items and tensor archives inside the
    `.distcp` files). With `report_unreadable` False only the safety codes (`_SAFETY_CODES`) are reported: the
    storage checks already say which items are missing, truncated or not archives.
    """
    s = FileScan(label, bounds=bounds or {})
    by_file: dict[str, list[tuple[str, StoredItem]]] = {}
    for key, item in items:
        by_file.setdefault(item.file, []).append((key, item))
    names = sorted(by_file)
    # From object storage, the windows of the next files are fetched in parallel while this one is walked (the
    # same coalesced GETs, earlier); locally `ahead` yields at once.
    jobs = [(ckpt_dir / n, [(it.offset, it.length) for _, it in by_file[n]]) for n in names]
    for i in prefetch.ahead(jobs):
        # Also outside the checkpoint dir: DCP reads them from there (the storage check reports CK207).
        s.data_file(jobs[i][0], "", label, "", names[i], by_file[names[i]], gaps=False, window=jobs[i][1])
    findings = [f for f in s.findings if report_unreadable or f.code in _SAFETY_CODES]
    return ScanReport(label, status_of(findings), tuple(findings), tuple(s.pickles))


# CK208: a stored item that could not be decoded was not scanned, whatever the storage checks say about it.
_SAFETY_CODES = frozenset({"CK208", "CK601", "CK602", "CK603", "CK604", "CK605", "CK606"})


def stored_items(tensors: Iterable[Tensor], objects: Iterable[ObjectItem],
                 bounds: dict[tuple[str, int], int] | None = None) -> Iterator[tuple[str, StoredItem]]:
    """(subject, item) for every byte item of `objects` and every chunk of `tensors` (the neutral model); a chunk's
    subject is ``key@offsets``. `bounds` gets the decode bound of every stream-transformed chunk (its payload,
    prod(sizes) x dtype, plus the archive around it)."""
    for o in objects:
        if o.storage is not None:
            yield o.key, o.storage
    for t in tensors:
        size = dtype_size(t.dtype) if bounds is not None else None
        for c in t.chunks:
            if c.storage is not None:
                if c.storage.transforms and bounds is not None:
                    bounds[(c.storage.file, c.storage.offset)] = (
                        tensor_bound(math.prod(c.sizes) * size) if size is not None else MAX_DECODED_BYTES)
                yield f"{t.key}@{','.join(str(x) for x in c.offsets)}", c.storage


# --- helpers -------------------------------------------------------------------------------------------------------


def items_by_file(data: bytes, bounds: dict[tuple[str, int], int] | None = None
                   ) -> dict[str, list[tuple[str, StoredItem]]]:
    """Stored items of a `.metadata` (read with the allowlisting unpickler: nothing is executed), by file; `bounds`
    as for `stored_items`."""
    try:
        md = read_metadata(data)
    except ReadError:
        return {}
    except Exception:  # noqa: BLE001 - a malformed .metadata only costs the item locations; its walk reported it
        return {}
    out: dict[str, list[tuple[str, StoredItem]]] = {}
    for key, item in stored_items(md.tensors, md.objects, bounds):
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


def join_rel(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
