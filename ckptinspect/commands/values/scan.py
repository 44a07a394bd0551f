"""The value scan of one checkpoint: every stored chunk of every tensor read from its byte range (`services/
chunk_bytes.locate`), fed to the value kernel (`services/values.py`) in pieces of `PIECE_BYTES`, merged per tensor.

Work is split into units, one per (tensor, chunk box): a box listed twice is read once, its first copy (DCP per-rank
metadata: every rank's own copy of what it saved; the contract's "Value scan"). Units run in (file, offset) order, in `jobs` forked worker processes (the kernel's
fingerprint is a BLAS product that threads would serialise), each holding one `PIECE_BYTES` buffer: memory is bounded
by ``jobs × PIECE_BYTES`` plus the kernel's scratch, whatever the checkpoint's size. `--shard K/N` takes the K-th of
N slices of the units cut by cumulative bytes, so N processes on N machines read disjoint bytes and `merge` of their
JSON reports equals the unsharded scan.

A tensor item is never unpickled: `locate` reads the item's torch archive records through the allowlisting reader,
and a storage offset, length or stride outside its record is a `ReadError` (a CK908 finding), not a crash.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ckptinspect.errors import CkptInspectError, ReadError
from ckptinspect.io.local import open_regular
from ckptinspect.model import Checkpoint, Chunk, Format, ShardedBackend, Tensor, dtype_size
from ckptinspect.progress import ProgressHook
from ckptinspect.commands.values.layers import LayerNonzero, is_stacked
from ckptinspect.formats.transforms import decode_item, tensor_bound
from ckptinspect.pickling.builders import TensorRef
from ckptinspect.pickling.torch_archive import read_torch_archive
from ckptinspect.services.chunk_bytes import BITS_CODES, NUMPY_CODES, ChunkSource, Extent, contiguous, locate, map_view
from ckptinspect.services.values import SUPPORTED, TensorValues, scan_chunk
from ckptinspect.services.values_stats import CODECS, Kind

PIECE_BYTES = 16 << 20  # bytes read per call into a worker's one buffer
_PARALLEL_BYTES = 64 << 20  # below this, forking workers costs more than it saves


@dataclass(frozen=True, slots=True)
class Place:
    """Where one element lies: global coordinates, its chunk (offsets), the file and the byte offset in it."""

    index: tuple[int, ...]
    chunk: tuple[int, ...]
    file: str
    byte_offset: int

    def to_dict(self) -> dict[str, object]:
        return {"index": list(self.index), "chunk": list(self.chunk), "file": self.file,
                "byte_offset": self.byte_offset}

    @staticmethod
    def from_dict(d: dict[str, object]) -> Place:
        return Place(tuple(d["index"]), tuple(d["chunk"]), str(d["file"]), int(d["byte_offset"]))  # type: ignore[arg-type,call-overload]


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work: the chunks of one box of tensor `tensor` (index into the checkpoint's tensor list): the
    first is read, a repeat of the box is not. `negative`: find the first negative element (Adam's exp_avg_sq)."""

    tensor: int
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]
    negative: bool
    padding: bool = False
    stored_shape: tuple[int, ...] | None = None  # zarr: the array's full chunk shape
    stacked: bool = False  # Megatron's stacked layers along axis 0 (`layers.is_stacked`): zero layers recorded

    @property
    def nbytes(self) -> int:
        return math.prod(self.chunks[0].sizes) * (dtype_size(self.dtype) or 0)

    @property
    def order(self) -> tuple[str, int]:
        s = self.chunks[0].storage
        return (s.file, s.offset) if s is not None else ("", 0)


@dataclass(frozen=True, slots=True)
class Done:
    """What one `Job` gave: the values of its box (None when it could not be read), the first offending elements by
    kind (``nan`` / ``inf`` / ``subnormal`` / ``negative``), or the error."""

    tensor: int
    values: TensorValues | None
    padding: bool
    places: tuple[tuple[str, int, Place], ...]  # (kind, global flat index, place)
    error: tuple[str, str] | None  # (finding code, message)
    nbytes: int
    layer_span: tuple[int, int] | None = None  # stacked tensors: the layers the chunk covers [lo, hi)
    zero_layers: tuple[int, ...] = ()  # ... and those of them that are zero throughout in it


def jobs_of(ckpt: Checkpoint) -> list[Job]:
    """Every unit of the checkpoint's tensors whose dtype the kernel decodes, in (file, offset) order."""
    zarr = is_zarr(ckpt)
    jobs = [j for i, t in enumerate(ckpt.tensors) for j in tensor_jobs(i, t, zarr)]
    jobs.sort(key=lambda j: j.order)
    return jobs


def tensor_jobs(index: int, t: Tensor, zarr: bool = False) -> list[Job]:
    """The units of one tensor (`index` in its checkpoint's tensor list): one per chunk box; none for a dtype the
    kernel does not decode."""
    if t.dtype not in SUPPORTED:
        return []
    boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], list[Chunk]] = {}
    for c in t.chunks:
        boxes.setdefault((tuple(c.offsets), tuple(c.sizes)), []).append(c)
    neg = is_second_moment(t.key)
    bucket = is_bucket(t.key)
    full = tuple(max(c.sizes[a] for c in t.chunks) for a in range(len(t.shape))) if zarr and t.chunks else None
    stacked = is_stacked(t.key, tuple(t.shape))
    return [Job(index, t.dtype, tuple(t.shape), tuple(cs), neg, bucket and is_alignment_pad(cs[0]), full, stacked)
            for cs in boxes.values()]


def is_second_moment(key: str) -> bool:
    """Adam's `exp_avg_sq` in every naming the readers produce (Megatron per-parameter and bucket state, DCP optimizer
    state dicts, legacy `distrib_optim`)."""
    return "exp_avg_sq" in key


_BUCKET = re.compile(r"\.bucket_idx_\d+\.(param|exp_avg|exp_avg_sq)$")
PARAM_ALIGN = 64


def is_bucket(key: str) -> bool:
    """A DistributedOptimizer bucket's flattened state (dp_reshardable: ``...bucket_idx_0.exp_avg``)."""
    return _BUCKET.search(key) is not None


def is_alignment_pad(chunk: Chunk) -> bool:
    """Whether a chunk of a bucket tensor lies in the pad before a parameter's start: Megatron's
    DistributedOptimizer starts every parameter of a bucket at a multiple of `PARAM_ALIGN` elements
    (`param_and_grad_buffer._pad_start_of_param_if_needed`) and saves the pad as a chunk of its own. megatron-core
    0.16.1 saves zeros there, 0.19.2 uninitialized memory (sample `mcore_0_19_2`: 3.1e-41, -5.7e35, ...); a load
    copies parameter ranges only, so the value rules do not judge it. A chunk that starts off the alignment and ends
    at or before the next aligned offset is such a pad (a DP shard boundary can also start a chunk off it: a tail
    of a parameter that short is then not judged either)."""
    if len(chunk.offsets) != 1:
        return False
    start, size = chunk.offsets[0], chunk.sizes[0]
    return start % PARAM_ALIGN != 0 and start + size <= -(-start // PARAM_ALIGN) * PARAM_ALIGN


def shard_slice(jobs: Sequence[Job], shard: tuple[int, int] | None) -> list[Job]:
    """The jobs of slice K of N: cut where the cumulative bytes cross k/N of the total (every slice contiguous in
    file order; all slices together are every job, once)."""
    if shard is None:
        return list(jobs)
    k, n = shard
    total = sum(j.nbytes for j in jobs) or 1
    out, before = [], 0
    for j in jobs:
        if min(n - 1, before * n // total) == k:
            out.append(j)
        before += j.nbytes
    return out


def is_zarr(ckpt: Checkpoint) -> bool:
    return ckpt.sharded_backend is ShardedBackend.ZARR


def source_of(ckpt: Checkpoint) -> ChunkSource:
    from ckptinspect.io import location

    return ChunkSource.of(ckpt, location(ckpt.data_dir))


def run_jobs(src: ChunkSource, jobs: Sequence[Job], workers: int, progress: Callable[[Done], None]) -> None:
    """Run `jobs`, calling `progress` with each result (in completion order)."""
    if workers <= 1 or len(jobs) < 2:
        for j in jobs:
            progress(run_job(src, j))
        return
    batches = _batches(jobs, workers * 8)
    ctx = mp.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for fut in cf.as_completed([pool.submit(_run_batch, src, b) for b in batches]):
            for d in fut.result():
                progress(d)


def _batches(jobs: Sequence[Job], n: int) -> list[list[Job]]:
    """`jobs` cut into about `n` contiguous runs of similar bytes (file order kept inside each)."""
    total = sum(j.nbytes for j in jobs) or 1
    out: list[list[Job]] = [[]]
    acc = 0
    for j in jobs:
        if out[-1] and acc * n // total != (acc + j.nbytes) * n // total:
            out.append([])
        out[-1].append(j)
        acc += j.nbytes
    return [b for b in out if b]


def _run_batch(src: ChunkSource, jobs: list[Job]) -> list[Done]:
    return [run_job(src, j) for j in jobs]


def default_workers(jobs: Sequence[Job]) -> int:
    if sum(j.nbytes for j in jobs) < _PARALLEL_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def run_job(src: ChunkSource, job: Job) -> Done:
    """Scan one unit. Never raises for a broken checkpoint: a chunk that cannot be read is `Done.error`."""
    first = job.chunks[0]
    layers = LayerNonzero(first, job.dtype) if job.stacked and math.prod(first.sizes) > 0 else None
    try:
        values, places = _scan_one(src, job, first, layers)
    except ReadError as e:
        return Done(job.tensor, None, job.padding, (), (e.code, str(e)), job.nbytes)
    except (OSError, ValueError, CkptInspectError) as e:
        return Done(job.tensor, None, job.padding, (), ("CK206", f"{type(e).__name__}: {e}"), job.nbytes)
    return Done(job.tensor, values, job.padding, () if job.padding else tuple(places), None,
                job.nbytes, layers.span() if layers else None, layers.zero_layers() if layers else ())


def _scan_one(src: ChunkSource, job: Job, chunk: Chunk, layers: LayerNonzero | None = None
              ) -> tuple[TensorValues, list[tuple[str, int, Place]]]:
    if chunk.storage is not None and chunk.storage.transforms and not (src.raw or src.zarr or src.payload):
        return _scan_transformed(src, job, chunk, layers)
    ext = locate(src, chunk, job.dtype, job.stored_shape)
    return _scan_pieces(job, chunk, ext, _pieces(chunk, ext), layers)


def _scan_pieces(job: Job, chunk: Chunk, ext: Extent, pieces: Iterator[tuple[int, Any]],
                 layers: LayerNonzero | None = None) -> tuple[TensorValues, list[tuple[str, int, Place]]]:
    values = TensorValues(job.dtype, job.shape)
    negatives: list[int] = []
    for local_start, piece in pieces:
        part = scan_chunk(piece, job.dtype, job.shape, chunk.offsets, chunk.sizes, local_start)
        if job.negative and not negatives and part.stats.min is not None and part.stats.min < 0:
            k = _first_negative(piece, job.dtype)
            if k is not None:
                negatives.append(local_start + k)
        if layers is not None:
            layers.add(piece, local_start, part.stats.zeros > 0)
        values = values.merge(part)
    places: list[tuple[str, int, Place]] = []
    s = values.stats
    for kind, g in (("nan", s.first_nan), ("inf", s.first_inf), ("subnormal", s.first_subnormal)):
        if g is not None:
            places.append((kind, g, _place_global(g, job.shape, chunk, ext)))
    if negatives:
        local = tuple(int(i) for i in np.unravel_index(negatives[0], chunk.sizes)) if chunk.sizes else ()
        index = tuple(o + i for o, i in zip(chunk.offsets, local))
        g = int(np.ravel_multi_index(index, job.shape)) if job.shape else 0
        places.append(("negative", g, _place(index, chunk, ext)))
    return values, places


def _pieces(chunk: Chunk, ext: Extent) -> Iterator[tuple[int, Any]]:
    """(first local element, bytes) of `chunk`'s elements in C order, `PIECE_BYTES` at a time, little-endian."""
    itemsize = ext.itemsize
    count = math.prod(ext.shape)
    if count == 0:
        return
    if ext.strides is not None:  # a view kept by torch.save (legacy files): read through a map, slab by slab
        stored = ext.record_length // itemsize
        if count > 4 * stored + (1 << 24):  # `zeros(1).expand(2**40)`: the work would not follow the stored bytes
            raise ReadError(f"{chunk.storage.file if chunk.storage else '?'}: a view of {count} elements repeats "
                            f"its {stored} stored elements: values not scanned", "CK908")  # legal torch.save, no status
        arr = map_view(ext.path, ext.code, ext.record_offset, ext.record_length, ext.storage_offset, ext.shape,
                       ext.strides)
        rows = max(1, PIECE_BYTES // max(1, (count // max(arr.shape[0], 1)) * itemsize)) if arr.ndim else 1
        pos = 0
        for r in range(0, arr.shape[0] if arr.ndim else 1, rows):
            block = np.ascontiguousarray(arr[r : r + rows] if arr.ndim else arr)
            if block.dtype.byteorder == ">":
                block = block.byteswap().view(block.dtype.newbyteorder("<"))
            yield pos, block
            pos += block.size
        return
    with open_regular(ext.path, window=(ext.start, ext.nbytes)) as f:
        f.seek(ext.start)
        yield from _read_pieces(f, ext.nbytes, itemsize, chunk.storage.file if chunk.storage else "?",
                                ext.code if ext.code.startswith(">") else None)


def _scan_transformed(src: ChunkSource, job: Job, chunk: Chunk,
                      layers: LayerNonzero | None = None) -> tuple[TensorValues, list[tuple[str, int, Place]]]:
    """A stream-transformed (DCP `ZStandard`) item: decoded into a bounded temporary (`transforms.decode_item`: its
    payload + 1 MiB), its archive read there, the payload scanned from it. A place's byte offset is then the stored
    item's first byte (the element's offset exists only in the decoded stream)."""
    item = chunk.storage
    assert item is not None  # checked by the caller
    itemsize = dtype_size(job.dtype) or 0
    count = math.prod(chunk.sizes)
    with open_regular(src.root / item.file, window=(item.offset, item.length)) as f:
        with decode_item(f, item.offset, item.length, item.transforms, tensor_bound(count * itemsize)) as dec:
            archive = read_torch_archive(dec)
            ref = archive.obj
            if not isinstance(ref, TensorRef) or ref.shape != tuple(chunk.sizes) or ref.dtype != job.dtype:
                raise ReadError(f"{item.file}@{item.offset}: decoded archive does not hold this chunk's tensor")
            rec = archive.records.get(f"data/{ref.storage_key}")
            if rec is None or rec.data_offset < 0 or rec.compressed:
                raise ReadError(f"{item.file}@{item.offset}: decoded storage record missing or compressed")
            if count and ref.stride != contiguous(tuple(chunk.sizes)):
                raise ReadError(f"{item.file}@{item.offset}: a strided view in a transformed item: not read", "CK208")
            start = rec.data_offset + ref.storage_offset * itemsize
            if ref.storage_offset < 0 or start + count * itemsize > rec.data_offset + rec.size:
                raise ReadError(f"{item.file}@{item.offset}: tensor view outside its storage record", "CK202")
            ext = Extent(src.root / item.file, "<" + (NUMPY_CODES.get(job.dtype) or (BITS_CODES[itemsize],))[0],
                         item.offset, item.length, 0, tuple(chunk.sizes), None)
            dec.seek(start)
            return _scan_pieces(job, chunk, ext, _read_pieces(dec, count * itemsize, itemsize, item.file),
                                layers)


def _read_pieces(f: Any, nbytes: int, itemsize: int, name: str, swap_code: str | None = None
                 ) -> Iterator[tuple[int, Any]]:
    """(first element, bytes) of the next `nbytes` of `f`, `PIECE_BYTES` at a time into one buffer."""
    per = max(1, PIECE_BYTES // itemsize) * itemsize
    buf = bytearray(min(per, nbytes))
    view = memoryview(buf)
    done = 0
    while done < nbytes:
        n = min(len(buf), nbytes - done)
        got = 0
        while got < n:
            r = f.readinto(view[got:n])
            if not r:
                raise ReadError(f"{name}: chunk bytes end early ({done + got} of {nbytes})", "CK202")
            got += r
        if swap_code is not None:
            yield done // itemsize, np.frombuffer(view[:n], dtype=swap_code).byteswap()
        else:
            yield done // itemsize, view[:n]
        done += n


def _first_negative(piece: Any, dtype: str) -> int | None:
    """The position of the first element below zero in a little-endian piece of a floating dtype (NaN is not)."""
    codec = CODECS.get(dtype)
    if codec is None or codec.kind is not Kind.FLOAT:
        return None
    raw = np.frombuffer(piece, dtype=np.uint8)
    bits = raw.view(codec.bits) if raw.ctypes.data % codec.itemsize == 0 else raw.copy().view(codec.bits)
    wide = bits.astype(np.uint64)
    mag = wide & np.uint64(codec.abs_mask)
    neg = ((wide >> np.uint64(codec.width - 1)) != 0) & (mag != 0) & (mag <= np.uint64(codec.exp_mask))  # not NaN
    hit = np.flatnonzero(neg)
    return int(hit[0]) if len(hit) else None


def _place_global(g: int, shape: tuple[int, ...], chunk: Chunk, ext: Extent) -> Place:
    index = tuple(int(i) for i in np.unravel_index(g, shape)) if shape else ()
    return _place(index, chunk, ext)


def _place(index: tuple[int, ...], chunk: Chunk, ext: Extent) -> Place:
    local = tuple(i - o for i, o in zip(index, chunk.offsets))
    file = chunk.storage.file if chunk.storage is not None else "?"
    return Place(index, tuple(chunk.offsets), file, ext.byte_of(local))
