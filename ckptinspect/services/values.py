"""The value scan's engine: statistics and the shard-invariant fingerprint of a tensor computed from its raw stored
bytes, chunk by chunk, without torch (docs/contract.md, "Value fingerprint").

- `scan_run`: a buffer holding a contiguous run of elements that starts at a given global flat index;
- `scan_chunk`: a buffer holding (a part of) one chunk of an N-D tensor, C-contiguous in the chunk's own shape;
- `chunk_runs` / `ChunkGeometry.local_runs`: where a chunk's elements lie in the tensor's global flat index space,
  as (global start, run length) runs;
- `TensorValues.merge`: results of disjoint parts (chunks, blocks, files, `--shard` slices) combine in any order.

Buffers are read in blocks of `BLOCK` elements through per-thread scratch (memory bounded whatever the tensor's
size). Scan in parallel with processes, not threads: the fingerprint is a float64 matrix product, and numpy's
bundled OpenBLAS runs concurrent dgemm calls one at a time (measured: two threads, GIL released, no faster than
one), while two processes scan at twice the rate of one (benchmarks/bench_values.py). The statistics alone do
scale with threads (no BLAS call in them: OpenBLAS would also spread a long dot over all cores). Bytes are
little-endian, as torch writes them. A dtype outside `SUPPORTED` gives a result marked `unsupported`, never an
error; bad geometry (a chunk outside its tensor, a buffer that is not a whole number of elements) is a
`ValueError` for the caller to turn into a finding.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptinspect.services.values_fingerprint import Lanes, block_lanes, digest, symbols, symbols_per_element
from ckptinspect.services.values_stats import (
    CODECS, Codec, Kind, Scratch, ToGlobal, ValueStats, byte_block, float_block, int_block,
)

BLOCK = 1 << 18  # elements per block: bounded scratch (~10 MiB per thread); measured best of 2^16..2^20 (bench_values)
SUPPORTED = frozenset(CODECS)
MAX_NUMEL = 1 << 62  # global flat indices are int64


@dataclass(frozen=True, slots=True)
class TensorValues:
    """The value scan of (part of) one tensor.

    dtype / shape: the tensor's, as the checkpoint declares them (the fingerprint mixes both in).
    stats: statistics of the elements scanned so far.
    lanes: the fingerprint's two lane sums over those elements.
    unsupported: why the values were not decoded (a dtype outside `SUPPORTED`); None when they were.
    """

    dtype: str
    shape: tuple[int, ...]
    stats: ValueStats = ValueStats()
    lanes: Lanes = Lanes()
    unsupported: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def complete(self) -> bool:
        """Whether as many elements were scanned as the tensor has (each once: the caller's coverage proves it)."""
        return self.unsupported is None and self.stats.count == self.numel

    @property
    def fingerprint(self) -> str | None:
        """The value fingerprint (32 hex digits) once `complete`, else None."""
        return digest(self.dtype, self.shape, self.lanes) if self.complete else None

    def merge(self, other: TensorValues) -> TensorValues:
        if (self.dtype, self.shape) != (other.dtype, other.shape):
            raise ValueError(f"cannot merge values of {other.dtype}{list(other.shape)} into {self.dtype}{list(self.shape)}")
        return TensorValues(
            self.dtype, self.shape, self.stats.merge(other.stats), self.lanes + other.lanes,
            self.unsupported or other.unsupported,
        )


@dataclass(frozen=True, slots=True)
class ChunkGeometry:
    """Where the elements of one chunk (its local C-order positions) lie in the tensor's global flat index space.

    The chunk's elements form runs of `run` consecutive global indices: the axes after `split` are whole, so a run
    covers the chunk's extent along `split` times everything after it. Run ``q`` (C order over the chunk's extent
    along the axes before `split`) starts at ``base + sum((lead_offsets + unravel(q, lead_sizes)) * lead_strides)``.
    """

    numel: int
    run: int
    base: int
    lead_sizes: tuple[int, ...]
    lead_offsets: tuple[int, ...]
    lead_strides: tuple[int, ...]

    def run_starts(self, q0: int, q1: int) -> npt.NDArray[np.int64]:
        """Global start of runs ``q0 .. q1 - 1``."""
        q = np.arange(q0, q1, dtype=np.int64)
        starts = np.full(len(q), self.base, dtype=np.int64)
        if self.lead_sizes:
            for idx, off, stride in zip(np.unravel_index(q, self.lead_sizes), self.lead_offsets, self.lead_strides):
                starts += (idx.astype(np.int64) + off) * stride
        return starts

    def local_runs(self, p: int, n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(global starts, lengths) of the pieces of runs that hold local elements ``p .. p + n - 1``, in order."""
        if n <= 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        r = self.run
        q0, q1 = p // r, (p + n - 1) // r + 1
        if q1 - q0 == 1:  # one piece of one run (every block of a 1-D run): no arrays to build
            start = self.base + p - q0 * r
            if self.lead_sizes:
                idx = np.unravel_index(q0, self.lead_sizes)
                start += sum((int(i) + o) * st for i, o, st in zip(idx, self.lead_offsets, self.lead_strides))
            return np.array([start], dtype=np.int64), np.array([n], dtype=np.int64)
        starts = self.run_starts(q0, q1)
        first = np.arange(q0, q1, dtype=np.int64) * np.int64(r)
        begin = np.maximum(first, np.int64(p))
        end = np.minimum(first + np.int64(r), np.int64(p + n))
        out_starts: npt.NDArray[np.int64] = starts + (begin - first)
        out_lengths: npt.NDArray[np.int64] = end - begin
        return out_starts, out_lengths


def geometry(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> ChunkGeometry:
    """The `ChunkGeometry` of a chunk at `offsets` with extent `sizes` in a tensor of global `shape`.
    ValueError when the chunk does not lie inside the tensor."""
    shape, offsets, sizes = tuple(shape), tuple(offsets), tuple(sizes)
    if not (len(shape) == len(offsets) == len(sizes)):
        raise ValueError(f"chunk rank {len(offsets)}/{len(sizes)} differs from the tensor's {len(shape)}")
    if any(s < 0 for s in shape) or any(o < 0 or z < 0 or o + z > s for s, o, z in zip(shape, offsets, sizes)):
        raise ValueError(f"chunk at {list(offsets)} of size {list(sizes)} lies outside the tensor's shape {list(shape)}")
    if math.prod(shape) > MAX_NUMEL:
        raise ValueError(f"shape {list(shape)} has more than 2^62 elements")
    strides = [math.prod(shape[a + 1 :]) for a in range(len(shape))]
    numel = math.prod(sizes)
    split = max((a for a in range(len(shape)) if (offsets[a], sizes[a]) != (0, shape[a])), default=-1)
    if split < 0:
        return ChunkGeometry(numel, max(numel, 1), 0, (), (), ())
    return ChunkGeometry(
        numel=numel, run=max(sizes[split] * strides[split], 1), base=offsets[split] * strides[split],
        lead_sizes=sizes[:split], lead_offsets=offsets[:split], lead_strides=tuple(strides[:split]),
    )


def chunk_runs(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(global start index, run length) of every contiguous run of a chunk, in the chunk's local C order."""
    g = geometry(shape, offsets, sizes)
    if g.numel == 0:
        return
    per = max(1, BLOCK // g.run) * g.run
    for p in range(0, g.numel, per):
        starts, lengths = g.local_runs(p, min(per, g.numel - p))
        yield from zip(starts.tolist(), lengths.tolist())


_local = threading.local()


def _scratch() -> Scratch:
    s: Scratch | None = getattr(_local, "scratch", None)
    if s is None:
        s = _local.scratch = Scratch(BLOCK)
    return s


def _mapper(starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> ToGlobal:
    def to_global(k: int) -> int:  # called only for a block that holds a NaN, an Inf or a subnormal
        ends = np.cumsum(lengths)
        q = int(np.searchsorted(ends, k, side="right"))
        return int(starts[q]) + k - int(ends[q] - lengths[q])

    return to_global


def _block_stats(bits: npt.NDArray[Any], codec: Codec, scratch: Scratch, to_global: ToGlobal) -> ValueStats:
    if codec.kind is Kind.FLOAT:
        return float_block(bits, codec, scratch, to_global)
    if codec.kind is Kind.BYTE:
        return byte_block(bits, codec, to_global)
    return int_block(bits, codec)


def _elements(buf: Any, codec: Codec) -> npt.NDArray[Any]:
    raw = np.frombuffer(buf, dtype=np.uint8)
    if len(raw) % codec.itemsize:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {codec.name} elements ({codec.itemsize} B)")
    return raw.view(codec.bits) if raw.ctypes.data % codec.itemsize == 0 else raw.copy().view(codec.bits)


def _scan(buf: Any, dtype: str, shape: tuple[int, ...], g: ChunkGeometry, local_start: int) -> TensorValues:
    codec = CODECS.get(dtype)
    if codec is None:
        return TensorValues(dtype, shape, unsupported=f"values of dtype {dtype} are not decoded")
    elems = _elements(buf, codec)
    n_all = len(elems)
    if local_start < 0 or local_start + n_all > g.numel:
        raise ValueError(f"{n_all} elements from position {local_start} overrun the chunk's {g.numel}")
    scratch = _scratch()
    per = max(1, BLOCK // g.run) * g.run if g.run < BLOCK else BLOCK
    stats = ValueStats()
    lanes = Lanes()
    pos = 0
    while pos < n_all:
        n = min(per, n_all - pos)
        # a block after an unaligned start: end it on a run boundary so that the next ones are whole rows
        if (local_start + pos) % g.run and g.run < BLOCK:
            n = min(n, g.run - (local_start + pos) % g.run)
        bits = elems[pos : pos + n]
        starts, lengths = g.local_runs(local_start + pos, n)
        stats = stats.merge(_block_stats(bits, codec, scratch, _mapper(starts, lengths)))
        lanes = lanes + block_lanes(symbols(bits), symbols_per_element(codec.itemsize), starts, lengths, scratch.sym)
        pos += n
    return TensorValues(dtype, shape, stats, lanes)


def scan_run(buf: Any, dtype: str, shape: Sequence[int], start: int = 0) -> TensorValues:
    """Scan a bytes-like buffer holding consecutive elements of a tensor of global `shape`, the first at global flat
    index `start`."""
    shape = tuple(shape)
    codec = CODECS.get(dtype)
    if codec is None:
        return TensorValues(dtype, shape, unsupported=f"values of dtype {dtype} are not decoded")
    count = len(memoryview(buf).cast("B")) // codec.itemsize
    numel = math.prod(shape)
    if start < 0 or start + count > numel:
        raise ValueError(f"{count} elements from index {start} overrun the tensor's {numel}")
    # a run is the chunk (start..) of the tensor seen as 1-D: the same mapping, no lead axes
    g = ChunkGeometry(numel=numel - start, run=max(numel - start, 1), base=start, lead_sizes=(), lead_offsets=(),
                      lead_strides=())
    return _scan(buf, dtype, shape, g, 0)


def scan_chunk(
    buf: Any, dtype: str, shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], local_start: int = 0
) -> TensorValues:
    """Scan a bytes-like buffer holding a chunk's elements ``local_start ..`` (C order in the chunk's `sizes`) of a
    tensor of global `shape`; the chunk lies at `offsets`. A chunk may be fed in several buffers (`local_start`)."""
    return _scan(buf, dtype, tuple(shape), geometry(shape, offsets, sizes), local_start)
