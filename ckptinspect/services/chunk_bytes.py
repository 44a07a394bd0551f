"""Where a chunk's raw values are, and a bounded read-only view of them: the stored byte ranges of torch_dist / DCP
items (the `torch.save` archive inside a ``.distcp`` item) and of legacy ``torch`` files, read without torch.

Moved out of `commands/diff/values.py` so that `diff --values` and the value scan (`values`) read chunk bytes the
same way. Where a chunk's bytes are:

- torch_dist / DCP (`torch_dcp`, `fsdp_dtensor`): the chunk's `StoredItem` is a `torch.save` zip archive inside a
  ``.distcp`` file; its ``data/<storage key>`` record holds the raw bytes of the chunk's storage (stored, not
  compressed), in the byte order named by the archive's ``byteorder`` record. The archive's `data.pkl` says the
  storage offset and strides (DCP clones views before saving, so this is normally a contiguous whole storage).
- legacy ``torch`` files: the legacy reader points `StoredItem` at the tensor's first element inside the `.pt` file
  (little-endian, as `torch.save` writes on every platform we support). `torch.save` keeps views as views (a
  transposed or expanded tensor is its storage plus strides), so the file's `data.pkl` is read again here (once per
  file, the same allowlisting unpickler) for each tensor's storage record, offset and strides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptinspect.errors import ReadError
from ckptinspect.formats.files import read_item_archive
from ckptinspect.formats.nvrx_local import sharded_tensors
from ckptinspect.io.local import open_regular
from ckptinspect.model import Checkpoint, Chunk, Format, ShardedBackend, StrEnum, dtype_size
from ckptinspect.pickling.builders import TensorRef
from ckptinspect.pickling.plain import to_plain, walk_tensors
from ckptinspect.pickling.torch_archive import read_torch_file


class ValueKind(StrEnum):
    """How the values of a dtype are compared."""

    FLOAT = "float"  # numeric, NaN equal to NaN
    BF16 = "bf16"  # read as uint16 and widened to float32 (bfloat16 is the top half of a float32), then as FLOAT
    INT = "int"
    BOOL = "bool"  # any non-zero byte is True; a difference counts 1
    BITS = "bits"  # dtypes numpy cannot represent: compared bit for bit, without a numeric difference


_F, _I = ValueKind.FLOAT, ValueKind.INT
# torch dtype name -> (numpy dtype code without byte order, comparison kind).
NUMPY_CODES: dict[str, tuple[str, ValueKind]] = {
    "float64": ("f8", _F), "float32": ("f4", _F), "float16": ("f2", _F), "bfloat16": ("u2", ValueKind.BF16),
    "complex128": ("c16", _F), "complex64": ("c8", _F),
    "int64": ("i8", _I), "int32": ("i4", _I), "int16": ("i2", _I), "int8": ("i1", _I),
    "uint64": ("u8", _I), "uint32": ("u4", _I), "uint16": ("u2", _I), "uint8": ("u1", _I),
    "bool": ("u1", ValueKind.BOOL),
}
BITS_CODES = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}

# A view `data.pkl` describes: (record data offset, record size, storage offset in elements, strides in elements)
View = tuple[int, int, int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class ChunkSource:
    """Where the chunks of one checkpoint are.

    root: the checkpoint dir (`StoredItem.file` is relative to it).
    raw: True when `StoredItem`s point at raw tensor payloads (legacy `.pt`), False for torch archives (DCP).
    zarr: True for Megatron's zarr backend: each `StoredItem` is a whole uncompressed zarr chunk file, C order,
      little-endian, edge chunks padded to the array's full chunk shape (`formats/zarr_dir.py`).
    payload: True when each `StoredItem` is exactly the chunk's elements, C order, little-endian (Hugging Face
      safetensors: a tensor's `data_offsets` span, `formats/safetensors.py`).
    views: for `raw`, per file: the views its `data.pkl` describes, by (first-element offset, shape, dtype) — read
      once per file by `open_chunk`.
    nvrx: with `raw`, the files are NVRx local files: their views are the `ShardedTensor`s' data, keyed by the
      chunk's sizes (`prepend_axis_num` leading axes of size 1 included: `formats/nvrx_local.py`).
    """

    root: Path
    raw: bool
    zarr: bool = False
    payload: bool = False
    nvrx: bool = False

    @staticmethod
    def of(ckpt: Checkpoint, root: Path) -> ChunkSource:
        """Where `ckpt`'s chunks are, read as its format stores them, under `root` (its data dir, local or a
        storage path)."""
        return ChunkSource(root, raw=ckpt.format in (Format.TORCH, Format.NVRX_LOCAL),
                           zarr=ckpt.sharded_backend is ShardedBackend.ZARR,
                           payload=ckpt.format is Format.SAFETENSORS, nvrx=ckpt.format is Format.NVRX_LOCAL)
    views: dict[str, dict[tuple[int, tuple[int, ...], str], set[View]]] = field(
        default_factory=dict, compare=False, repr=False)



@dataclass(frozen=True, slots=True)
class Extent:
    """Where the elements of one chunk are stored.

    path: the file (a local path or an object-storage path; `open_regular` reads both).
    code: the numpy dtype code of one stored element, with its byte order (``"<f4"``; bfloat16 as ``"<u2"``).
    record_offset / record_length: the storage record's bytes in `path`.
    storage_offset: the chunk's first element inside the record, in elements.
    shape: the chunk's sizes. strides: its strides in elements, None when C-contiguous.
    """

    path: Path
    code: str
    record_offset: int
    record_length: int
    storage_offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None

    @property
    def itemsize(self) -> int:
        return np.dtype(self.code).itemsize

    @property
    def start(self) -> int:
        """The byte offset of the chunk's first element in `path`."""
        return self.record_offset + self.storage_offset * self.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def byte_of(self, local: tuple[int, ...]) -> int:
        """The byte offset in `path` of the element at chunk-local coordinates `local`."""
        strides = self.strides if self.strides is not None else contiguous(self.shape)
        return self.start + sum(i * st for i, st in zip(local, strides)) * self.itemsize


def locate(src: ChunkSource, chunk: Chunk, dtype: str, stored_shape: tuple[int, ...] | None = None) -> Extent:
    """The `Extent` of `chunk`'s elements, checked to lie inside their storage record. Raises `ReadError` when the
    chunk has no storage entry, its item is stream-transformed or compressed, or its archive disagrees with the
    metadata. `stored_shape`: zarr only, the array's full chunk shape (an edge chunk file holds that many)."""
    item = chunk.storage
    if item is None:
        raise ReadError(f"chunk at {chunk.offsets} has no storage entry", "CK304")
    code, _ = NUMPY_CODES.get(dtype) or (BITS_CODES[dtype_size(dtype) or 0], ValueKind.BITS)
    shape = tuple(chunk.sizes)
    count = math.prod(shape)
    if src.zarr or src.payload:
        full = stored_shape or shape
        need = math.prod(full) * (dtype_size(dtype) or 0)
        if item.length != need:
            raise ReadError(f"{item.file}@{item.offset}: {item.length} bytes, not the {need} of its elements "
                            "(a zarr compressor or filter, a safetensors span of another size): values not read",
                            "CK208" if src.zarr else "CK206")
        strides = contiguous(full) if full != shape and count else None
        return _checked(Extent(src.root / item.file, "<" + code, item.offset, item.length, 0, shape, strides))
    if src.raw:
        views = legacy_views(src, item.file).get((item.offset, shape, dtype), set())
        if len(views) != 1:
            raise ReadError(f"{item.file}@{item.offset}: " + ("no tensor of this shape and dtype in data.pkl"
                            if not views else "several views of this shape and dtype at this offset"))
        rec_offset, rec_size, storage_offset, stride = next(iter(views))
        strides = stride if count and stride != contiguous(shape) else None
        return _checked(Extent(src.root / item.file, "<" + code, rec_offset, rec_size, storage_offset, shape,
                               strides))
    if item.transforms:
        # The values are read from the stored bytes; a stream-transformed item has no such bytes.
        raise ReadError(f"{item.file}@{item.offset}: stream-transformed item ({', '.join(item.transforms)}): values "
                        "not read", "CK208")
    archive = read_item_archive(src.root, item)
    ref = archive.obj
    if not isinstance(ref, TensorRef):
        raise ReadError(f"{item.file}@{item.offset}: archive does not hold a tensor")
    if ref.shape != shape:
        raise ReadError(f"{item.file}@{item.offset}: stored shape {ref.shape} != chunk sizes {shape}")
    if ref.dtype != dtype:
        raise ReadError(f"{item.file}@{item.offset}: stored dtype {ref.dtype} != tensor dtype {dtype}")
    rec = archive.records.get(f"data/{ref.storage_key}")
    if rec is None or rec.data_offset < 0:
        raise ReadError(f"{item.file}@{item.offset}: storage record data/{ref.storage_key} missing")
    if rec.compressed:
        raise ReadError(f"{item.file}@{item.offset}: storage record is compressed", "CK208")
    if rec.data_offset + rec.size > item.length:
        raise ReadError(f"{item.file}@{item.offset}: storage record extends past the stored item", "CK202")
    order = "<"
    bo = archive.records.get("byteorder")
    if bo is not None and 0 <= bo.data_offset and bo.size <= 16 and not bo.compressed:
        with open_regular(src.root / item.file) as f:
            f.seek(item.offset + bo.data_offset)
            order = ">" if f.read(bo.size).strip() == b"big" else "<"
    strides = ref.stride if count and ref.stride != contiguous(shape) else None
    return _checked(Extent(src.root / item.file, order + code, item.offset + rec.data_offset, rec.size,
                           ref.storage_offset, shape, strides))


def _checked(e: Extent) -> Extent:
    """`e`, once its view is known to lie inside its storage record (a hostile offset or stride is a ReadError)."""
    n = e.record_length // e.itemsize
    count = math.prod(e.shape)
    if e.strides is not None and len(e.strides) != len(e.shape):
        raise ReadError(f"{e.path.name}@{e.record_offset}: {len(e.strides)} strides for a {len(e.shape)}-d tensor")
    if count == 0:
        return e
    span = e.storage_offset + (1 + sum((s - 1) * st for s, st in zip(e.shape, e.strides)) if e.strides else count)
    if e.storage_offset < 0 or span > n or (e.strides and min(e.strides) < 0):
        raise ReadError(f"{e.path.name}@{e.record_offset}: tensor view [{e.storage_offset}, {span}) outside its "
                        f"storage ({n})", "CK202")
    return e


def open_chunk(src: ChunkSource, chunk: Chunk, dtype: str) -> npt.NDArray[Any]:
    """A read-only memory map of `chunk` with shape `chunk.sizes`, in its stored numpy dtype (bfloat16 as uint16)."""
    e = locate(src, chunk, dtype)
    return map_view(e.path, e.code, e.record_offset, e.record_length, e.storage_offset, e.shape, e.strides)


def legacy_views(src: ChunkSource, rel: str) -> dict[tuple[int, tuple[int, ...], str], set[View]]:
    """The views `data.pkl` of the legacy file `rel` describes, keyed as the legacy reader's `StoredItem`s are
    (`formats/legacy.py`: record offset + storage offset × element size)."""
    hit = src.views.get(rel)
    if hit is not None:
        return hit
    archive = read_torch_file(src.root / rel)
    if archive.report.unsafe:
        raise ReadError(f"{rel}: pickle would run code; values not read")
    out: dict[tuple[int, tuple[int, ...], str], set[View]] = {}
    if src.nvrx:
        # a chunk's leading axes of size 1 take any stride: the element count, so a contiguous view stays one
        placed = sharded_tensors(archive.obj)[0]
        refs = [(p.sizes, (math.prod(p.ref.shape),) * (len(p.sizes) - len(p.ref.shape)) + tuple(p.ref.stride), p.ref)
                for p in placed]
    else:
        refs = [(tuple(ref.shape), tuple(ref.stride), ref) for _, ref in walk_tensors(to_plain(archive.obj))]
    for shape, stride, ref in refs:
        rec = archive.records.get(f"data/{ref.storage_key}")
        size = dtype_size(ref.dtype) or 0
        if rec is None or rec.data_offset < 0 or rec.compressed or not size:
            continue
        view = (rec.data_offset, rec.size, ref.storage_offset, stride)
        out.setdefault((rec.data_offset + ref.storage_offset * size, shape, ref.dtype), set()).add(view)
    if len(src.views) > 64:
        src.views.clear()  # bounded: a diff walks one file after the other
    src.views[rel] = out
    return out


def map_view(path: Path, code: str, offset: int, length: int, storage_offset: int, shape: tuple[int, ...],
         strides: tuple[int, ...] | None) -> npt.NDArray[Any]:
    dt = np.dtype(code)
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, dtype=dt)
    n = length // dt.itemsize
    if strides is not None and len(strides) != len(shape):
        raise ReadError(f"{path.name}@{offset}: {len(strides)} strides for a {len(shape)}-d tensor")
    span = storage_offset + (1 + sum((s - 1) * st for s, st in zip(shape, strides)) if strides else count)
    if storage_offset < 0 or span > n or (strides and min(strides) < 0):
        raise ReadError(f"{path.name}@{offset}: tensor view [{storage_offset}, {span}) outside its storage ({n})")
    try:
        mm = np.memmap(path, dtype=dt, mode="r", offset=offset, shape=(n,))
    except (OSError, ValueError) as e:
        raise ReadError(f"cannot map {path.name}@{offset}: {e}") from e
    flat = mm[storage_offset:]
    if strides is None:
        return flat[:count].reshape(shape)
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * dt.itemsize for s in strides), writeable=False)


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= max(s, 1)
    return tuple(reversed(out))
