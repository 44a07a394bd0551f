"""Stored items written through DCP stream transforms: undoing them, within bounds, before an item is read.

torch ≥ 2.6 `FileSystemWriter(_extensions=[ZStandard()])` passes every stored item (byte items and tensor
archives alike) through the extensions' `transform_to` streams and records their descriptors in
`_StorageInfo.transform_descriptors` (torch 2.13 `filesystem.py` `_write_item`); `FileSystemReader.read_data` undoes
them with `transform_from` and reads the result to its end (`read(-1)`) before `torch.load` sees it. The default
registry knows one extension, `stream.zstd/<major 1>` (`_extension.py` `ZStandard.from_descriptor`); a descriptor it
does not know makes the load fail, unless the reader was given a registry of its own.

`decode_item` mirrors that reading: every zstd frame of the item, back to back (python-zstandard's `stream_reader`
and pyzstd's `EndlessZstdDecompressor` both read across frames), into a spooled temporary file (memory up to
`SPOOL_BYTES`, disk above), stopping at a bound: a decompression bomb is a finding, never memory. Decoding needs the
optional `zstandard` package (`pip install 'ckptinspect[zstd]'`); without it, or for an unknown descriptor, the item
cannot be read and `Undecodable` (CK208) says so: the item was not scanned or verified, so the checkpoint is not
`complete`.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Sequence
from typing import IO, Any

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.io.local import FileSlice

ZSTD = "stream.zstd"
MAX_DECODED_BYTES = 1 << 30  # a byte item decoded (`.metadata` does not record its size); a tensor item: `tensor_bound`
ARCHIVE_SLACK = 1 << 20  # a tensor item's `torch.save` archive around its payload (members, headers, padding)
SPOOL_BYTES = 32 << 20  # decoded bytes kept in memory up to this, then in a temporary file
READ_BYTES = 1 << 20  # one read of the decompressor: the most it outputs at a time
# The largest zstd window a frame may ask for (libzstd's default decompression limit, 2^27: what torch's reader
# accepts too); a frame asking for more is refused before anything is allocated.
MAX_WINDOW = 1 << 27


class Undecodable(ReadError):
    """A stored item's stream transforms cannot be undone here (CK208): unknown descriptor, or no decompressor."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "CK208")


def tensor_bound(payload: int) -> int:
    """The most bytes a tensor item of `payload` tensor bytes may decode to."""
    return payload + ARCHIVE_SLACK


def unsupported(transforms: Sequence[str]) -> str | None:
    """Why `transforms` cannot be undone here (an unknown descriptor, the `zstd` extra missing), or None."""
    for desc in transforms:
        name, _, version = desc.partition("/")
        if name != ZSTD or version.partition(".")[0] != "1":
            return (f"unknown stream transform {desc!r} (torch's default DCP reader refuses it; a reader with its "
                    "own extension registry may decode it)")
    if transforms and _zstandard() is None:
        return f"stream transform {transforms[0]!r} needs the zstd extra (pip install 'ckptinspect[zstd]')"
    return None


def decode_item(f: IO[bytes], offset: int, length: int, transforms: Sequence[str],
                bound: int = MAX_DECODED_BYTES) -> IO[bytes]:
    """The bytes of the stored item at [offset, offset+length) of `f` with `transforms` undone, in order, as a
    seekable file positioned at 0 (the caller closes it). Raises `Undecodable` (CK208), `LimitExceeded` (CK603)
    past `bound` decoded bytes, `ReadError` (CK205) for a stream that is not valid zstd, OSError from `f`."""
    why = unsupported(transforms)
    if why is not None:
        raise Undecodable(why)
    src: IO[bytes] = FileSlice(f, offset, length)  # type: ignore[assignment]
    out: IO[bytes] | None = None
    try:
        for desc in transforms or (None,):  # no transforms: a copy, so the caller's file is never the one returned
            decoded = _unzstd(src, bound, desc)
            if out is not None:
                out.close()  # the previous stage's output, read to its end
            src = out = decoded
        assert out is not None
        return out
    except BaseException:
        if out is not None:
            out.close()
        raise


class Shifted(io.RawIOBase):
    """A decoded item seen at the offset of its stored bytes: position `base + k` reads decoded byte k, so the
    container walkers take the decoded bytes where the stored item lies (their findings name the item's offset)."""

    def __init__(self, f: IO[bytes], base: int) -> None:
        self._f = f
        self._base = base

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell() + self._base

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            pos -= self._base
            if pos < 0:
                raise OSError(f"seek to {pos + self._base}, before the decoded item at {self._base}")
        return self._f.seek(pos, whence) + self._base

    def read(self, n: int | None = -1) -> bytes:
        return self._f.read(-1 if n is None else n)

    def readinto(self, buf: Any) -> int:
        data = self._f.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _unzstd(src: IO[bytes], bound: int, desc: str | None) -> IO[bytes]:
    zstandard = _zstandard()
    out: IO[bytes] = tempfile.SpooledTemporaryFile(SPOOL_BYTES)
    try:
        if desc is None:
            reader: Any = src
        else:
            assert zstandard is not None  # checked by `unsupported`
            reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(src, closefd=False)
        total = 0
        while True:
            try:
                block = reader.read(READ_BYTES)
            except Exception as e:  # noqa: BLE001 - zstandard.ZstdError and whatever a broken frame raises
                if isinstance(e, OSError) and not _is_zstd_error(e, zstandard):
                    raise
                raise ReadError(f"not a valid {desc} stream after {total} decoded bytes: {e}", "CK205") from e
            if not block:
                break
            total += len(block)
            if total > bound:
                raise LimitExceeded(f"{desc} stream decodes to more than {bound} bytes (decompression bomb?)",
                                    "CK603")
            out.write(block)
        if desc is not None and total == 0:
            raise ReadError(f"{desc} stream decodes to nothing", "CK205")
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


def _is_zstd_error(e: BaseException, zstandard: Any) -> bool:
    return zstandard is not None and isinstance(e, zstandard.ZstdError)


def _zstandard() -> Any:
    """The `zstandard` module, or None when the zstd extra is not installed (imported on first use only)."""
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard
