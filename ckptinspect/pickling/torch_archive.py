"""Torch zip archives (`torch.save`), read without torch: the record directory and the unpickled `data.pkl`.

`common.pt`, legacy `model_optim_rng.pt` / `distrib_optim.pt`, and every item inside a `.distcp` (at its byte range)
are such archives. Only `data.pkl` is unpickled — through `SafeUnpickler` — and tensor bytes are never read: a tensor
is a `TensorRef` naming its storage record, whose size and offset come from the zip directory.
"""

from __future__ import annotations

import io
import os
import zipfile
import lzma
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.io.local import FileSlice, open_regular
from ckptinspect.pickling.candidates import Walked, archive_walks
from ckptinspect.pickling.legacy_format import read_legacy_pickles
from ckptinspect.pickling.tar_archive import tar_walks
from ckptinspect.pickling.walk import is_pickle_start, walk_stream
from ckptinspect.pickling.zipdir import local_data_start
from ckptinspect.pickling.unpickle import MAX_ARCHIVE_PICKLE_BYTES, load_pickle, short_error, vet_walk
from ckptinspect.pickling.report import PickleReport

@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One member of a torch archive: name (without the archive prefix), stored size, offset of its data."""

    name: str
    size: int
    compressed: bool
    data_offset: int  # offset of the member's bytes inside the archive (-1 when the local header is unreadable)


@dataclass(frozen=True, slots=True)
class TorchArchive:
    """A `torch.save` zip archive, read without torch: its records and the unpickled `data.pkl` (stand-ins)."""

    prefix: str
    records: Mapping[str, ArchiveRecord]
    obj: Any
    report: PickleReport


def is_zip_archive(head: bytes) -> bool:
    return head[:4] == b"PK\x03\x04"


def _bound_hit(walks: list[Walked], prefix: str = "") -> LimitExceeded | None:
    """The bound the walks of one archive hit, or None. A member or byte string past a bound (zip bomb, size) or a
    pickle whose walk stopped at a bound of the scanner's own was not judged to its end: fail closed (CK605); an
    absurd length claim (the end of the data) is CK603."""
    limits = [w for w in walks if w.limit or (w.walk is not None and w.walk.limit is not None)]
    if not limits:
        return None
    unjudged = [w for w in limits if w.limit or (w.walk is not None and w.walk.unjudged)]
    w = (unjudged or limits)[0]
    return LimitExceeded(f"{prefix}{w.where}: {w.problem or (w.walk.limit if w.walk else '')}",
                         "CK605" if unjudged else "CK603")


def read_torch_archive(f: IO[bytes], offset: int = 0, length: int | None = None) -> TorchArchive:
    """Read the torch archive at [offset, offset+length) of `f` (whole file when length is None).

    Raises `ReadError` (CK206/CK205) when it is not a torch zip archive, CK606 when it is a TorchScript archive,
    `LimitExceeded` on a zip bomb.
    """
    if length is None:
        f.seek(0, os.SEEK_END)
        length = f.tell() - offset
    view = io.BufferedReader(FileSlice(f, offset, length))
    head = view.peek(4)[:4]
    report = PickleReport()
    if not is_zip_archive(head):
        tar = tar_walks(view, 0, length)
        if tar is not None:
            # Pre-1.6 tar format: torch.load unpickles its members' pickles with the plain unpickler.
            walks, problem = tar
            for w in walks:
                if w.walk is not None:
                    report.merge_walk(w.walk, w.where)
            limit = _bound_hit(walks, "tar member ")
            if limit is not None and not report.unsafe:
                raise _with(limit, report)
            broken = problem or next((f"tar member {w.where}: {w.problem or (w.walk.error if w.walk else '')}"
                                      for w in walks if w.problem or (w.walk is not None and w.walk.error)), None)
            raise _with(ReadError("legacy (pre-1.6) tar torch serialization: its pickles were walked, its state is "
                                  f"not read{'; ' + broken if broken else ''}", "CK206"), report)
        view.seek(0)
        if is_pickle_start(head[:2]):
            # torch.load takes any file that does not start with a zip local header for a legacy (pre-1.6) save and
            # unpickles its pickles with the plain unpickler: judge them all first, then read the layout.
            try:
                vet_walk(walk_stream(view, length), report)
            except LimitExceeded as e:
                raise _with(e, report)
            if report.unsafe:
                return TorchArchive("", {}, None, report)
            view.seek(0)
            try:
                obj, stored = read_legacy_pickles(view, length, report)
            except ReadError as e:
                raise _with(e, report)
            records = {name: ArchiveRecord(name, size, False, offset) for name, (offset, size) in stored.items()}
            return TorchArchive("", records, obj, report)
        raise ReadError("not a torch zip archive (no PK header)", "CK206")
    # The verdict covers every pickle any zip reader could take from these bytes (`candidates.py`), not only the one
    # Python's zipfile picks below.
    walks, _, _ = archive_walks(view, 0, length)
    for w in walks:
        if w.walk is not None:
            report.merge_walk(w.walk, w.where)
    script = next((w for w in walks if w.torchscript), None)
    if script is not None:  # what torch.load does with it is no unpickling: torch.jit.load runs its code
        raise _with(ReadError(f"{script.where}: {script.problem} (not executed)", "CK606"), report)
    limit = _bound_hit(walks)
    if limit is not None:
        raise _with(limit, report)
    try:
        zf = zipfile.ZipFile(view)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, KeyError,
            UnicodeDecodeError) as e:
        raise _with(ReadError(f"not a readable zip archive: {short_error(e)}", "CK206"), report) from e
    with zf:
        infos = zf.infolist()
        # `archive/data.pkl` first (what torch.save writes), a bare `data.pkl` only when there is none
        pkl = sorted((i for i in infos if is_main_pickle(i.filename)), key=lambda i: i.filename == "data.pkl")
        if not pkl:
            raise _with(ReadError("zip archive without data.pkl (not a torch.save archive)", "CK206"), report)
        info = pkl[-1]  # of duplicates, zipfile and torch 2.13 read the later one
        prefix = info.filename[: -len("data.pkl")]
        records = {
            i.filename[len(prefix) :]: ArchiveRecord(
                i.filename[len(prefix) :], i.file_size, i.compress_type != zipfile.ZIP_STORED,
                _data_offset(view, i),
            )
            for i in infos
            if i.filename.startswith(prefix)
        }
        if report.unsafe:
            return TorchArchive(prefix, records, None, report)  # its stand-ins would be no state dict anyway
        if info.file_size > MAX_ARCHIVE_PICKLE_BYTES:
            raise _with(LimitExceeded(f"data.pkl claims {info.file_size} bytes", "CK603"), report)
        try:
            with zf.open(info) as member:
                data = member.read(MAX_ARCHIVE_PICKLE_BYTES + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, zlib.error, lzma.LZMAError,
                MemoryError) as e:  # corrupt deflate / bzip2 / LZMA data is a finding
            raise _with(ReadError(f"data.pkl unreadable: {short_error(e)}", "CK206"), report) from e
        except RuntimeError as e:  # encrypted members
            raise _with(ReadError(f"data.pkl unreadable: {short_error(e)}", "CK206"), report) from e
        if len(data) > MAX_ARCHIVE_PICKLE_BYTES:
            raise _with(LimitExceeded("data.pkl decompresses past the bound (zip bomb?)", "CK603"), report)
    try:
        obj = load_pickle(data, report)
    except ReadError as e:
        raise _with(e, report)
    return TorchArchive(prefix, records, obj, report)


def _with(e: ReadError, report: PickleReport) -> ReadError:
    e.report = report
    return e


def _data_offset(view: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Where a member's bytes start in the archive (-1 when its local header is unreadable)."""
    offset = local_data_start(view, 0, info.header_offset)
    return -1 if offset is None else offset


def is_main_pickle(member: str) -> bool:
    """`data.pkl` at the top of a torch archive (``archive/data.pkl``, or bare): the pickle `torch.load` reads."""
    return member == "data.pkl" or (member.endswith("/data.pkl") and member.count("/") == 1)


def read_torch_file(path: str | os.PathLike[str]) -> TorchArchive:
    """Read a whole `.pt` file (`common.pt`, `model_optim_rng.pt`, `distrib_optim.pt`)."""
    try:
        with open_regular(path) as f:
            return read_torch_archive(f)
    except OSError as e:
        raise ReadError(f"cannot read {path}: {e.strerror or e}", "CK206") from e
