"""torch's legacy (pre-1.6, non-zip) serialization, read without torch: `torch.save(..., _use_new_zipfile_serialization=
False)`, which torch 2.x still writes and `torch.load` still reads.

Layout (torch/serialization.py `_legacy_save` / `_legacy_load`): five pickles back to back — the magic number, the
protocol version (1001), a `sys_info` dict (byte order, C type sizes), the object itself (storages as persistent ids
`('storage', storage_type, key, location, numel, view_metadata)`, exactly as in a zip archive), and the sorted list of
storage keys — then, for each key in that order, the storage as `_write_file` writes it: its element count as a
little-endian int64, then its bytes. The records this returns name each storage `data/<key>`, the name a zip
archive gives it, so readers of tensors do not care which layout a file has.
"""

from __future__ import annotations

import struct
from typing import IO, Any

from ckptinspect.errors import ReadError
from ckptinspect.model import dtype_size
from ckptinspect.pickling.builders import StorageRef
from ckptinspect.pickling.unpickle import SafeUnpickler, unpickle_stream
from ckptinspect.pickling.report import PickleReport

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


def read_legacy_pickles(view: IO[bytes], length: int, report: PickleReport) -> tuple[Any, dict[str, tuple[int, int]]]:
    """The object of a legacy file and its storages: `data/<key>` → (offset of the bytes, size in bytes).

    `view` is a buffered stream at the file's start whose pickles were walked into `report` already. Raises
    `ReadError` (CK206) when the bytes are not that layout or its storages run past the end of the file.
    """
    magic = unpickle_stream(view, report)
    if magic != MAGIC_NUMBER:
        raise ReadError("a pickle, not a torch file: its first pickle is not torch's legacy magic number", "CK206")
    version = unpickle_stream(view, report)
    if version != PROTOCOL_VERSION:
        raise ReadError(f"legacy torch file of protocol version {version!r} (torch reads {PROTOCOL_VERSION})", "CK206")
    sys_info = unpickle_stream(view, report)
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise ReadError("legacy torch file written big-endian or without sys_info: not read", "CK206")
    storages: dict[str, StorageRef] = {}

    class _Recording(SafeUnpickler):
        def persistent_load(self, pid: Any) -> Any:
            ref = super().persistent_load(pid)
            storages.setdefault(ref.key, ref)
            return ref

    obj = unpickle_stream(view, report, unpickler=_Recording)
    keys = unpickle_stream(view, report)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ReadError("legacy torch file: the storage key list is not a list of str", "CK206")
    # `_write_file` writes the element count of the storage's own dtype (uint8 for an untyped storage)
    sizes = {key: dtype_size(ref.dtype) for key, ref in storages.items()}
    records: dict[str, tuple[int, int]] = {}
    pos = view.tell()
    for key in keys:
        view.seek(pos)
        head = view.read(8)
        if len(head) < 8:
            raise ReadError(f"legacy torch file truncated: storage {key} ends past the end of the file", "CK206")
        (numel,) = struct.unpack("<q", head)
        item = sizes.get(key) or 1
        nbytes = numel * item
        if numel < 0 or pos + 8 + nbytes > length:
            raise ReadError(f"legacy torch file truncated: storage {key} ({nbytes} bytes) ends past the end of the "
                            "file", "CK206")
        records[f"data/{key}"] = (pos + 8, nbytes)
        pos += 8 + nbytes
    return obj, records
