"""Chunk coverage of every tensor: gaps (CK301), overlaps (CK302), out of bounds (CK303), no storage (CK304).

Exact for N-D chunks of any shape, regular grid or not, without ever building a mask of the global tensor:
coordinates are compressed to the chunk boundaries along each axis (a regular TP×layer grid compresses to exactly
one cell per chunk; Megatron's 1-D irregular DistOpt buckets to one cell per chunk), every chunk adds +1 to its
box of cells through an N-D difference array, and a cumulative sum per axis gives the cover count of every cell.
Cost is O(n log n) per tensor in the number of chunks. When the compressed grid would be huge (very irregular N-D
cuts) the check falls back to the volume sum plus a sweep for overlaps, and reports gaps without coordinates.

Megatron specifics: DistOpt `dp_reshardable` buckets are 1-D and tile `[0, numel)` with padding chunks; 0.8–0.15
N-D reformulated tensors are checked in their on-disk space (`mcore_data` keeps the original shape); 0-dim
tensors have one chunk with empty offsets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckptinspect.checks import CheckContext
from ckptinspect.checks.layout_coords import describe, locate
from ckptinspect.findings import Finding
from ckptinspect.model import Checkpoint, Format, Tensor

MAX_CELLS = 20_000_000  # compressed cells per tensor for the exact method
MAX_REPORTED = 5  # regions listed per tensor and problem


@dataclass(frozen=True, slots=True)
class TensorCoverage:
    """Coverage of one tensor.

    covered: elements covered at least once; gap / overlap: elements covered 0 / >1 times.
    out_of_bounds / no_storage: chunk counts. gaps / overlaps: up to MAX_REPORTED regions as (offsets, sizes).
    exact: False when the fallback (volume sum) was used and gap regions are unknown.
    """

    key: str
    numel: int
    chunks: int
    covered: int
    gap: int
    overlap: int
    out_of_bounds: int
    no_storage: int
    gaps: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    overlaps: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    exact: bool

    @property
    def ok(self) -> bool:
        return not (self.gap or self.overlap or self.out_of_bounds or self.no_storage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "numel": self.numel, "chunks": self.chunks, "covered": self.covered,
            "gap": self.gap, "overlap": self.overlap, "out_of_bounds": self.out_of_bounds,
            "no_storage": self.no_storage, "ok": self.ok, "exact": self.exact,
            "gaps": [{"offsets": list(o), "sizes": list(s)} for o, s in self.gaps],
            "overlaps": [{"offsets": list(o), "sizes": list(s)} for o, s in self.overlaps],
        }


MAX_PAIR_CHECKS = 5_000_000  # chunk pairs the irregular-grid fallback compares
MAX_UNION_CHUNKS = 200_000  # chunks the fallback measures the exact union of when some overlap


def _in_bounds(offsets: tuple[int, ...], sizes: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    if len(offsets) != len(shape) or len(sizes) != len(shape):
        return False
    return all(o >= 0 and s >= 0 and o + s <= d for o, s, d in zip(offsets, sizes, shape))


def tensor_coverage(t: Tensor, check_storage: bool = True) -> TensorCoverage:
    """Compute the coverage of `t` by its chunks."""
    shape = t.shape
    total = math.prod(shape)
    no_storage = sum(1 for c in t.chunks if c.storage is None) if check_storage else 0
    if len(shape) == 1:
        # The common case at scale (DistOpt buckets): bounds checked inline, no per-chunk helper calls.
        dim = shape[0]
        intervals: list[tuple[int, int]] = []
        oob = 0
        for c in t.chunks:
            offs, sizes = c.offsets, c.sizes
            if len(offs) != 1 or len(sizes) != 1:
                oob += 1
                continue
            start, n = offs[0], sizes[0]
            if start < 0 or n < 0 or start + n > dim:
                oob += 1
            elif n:
                intervals.append((start, start + n))
        if total == 0:
            return TensorCoverage(t.key, 0, len(t.chunks), 0, 0, 0, oob, no_storage, (), (), True)
        return _cover_1d(t, intervals, total, oob, no_storage)
    oob = 0
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for c in t.chunks:
        if not _in_bounds(c.offsets, c.sizes, shape):
            oob += 1
            continue
        if math.prod(c.sizes) > 0 or not shape:
            boxes.append((c.offsets, c.sizes))
    if not shape:  # 0-dim tensor: one element, covered by every in-bounds chunk
        n = len(boxes)
        return TensorCoverage(t.key, 1, len(t.chunks), min(n, 1), 0 if n else 1, n - 1 if n > 1 else 0,
                              oob, no_storage, (((), ()),) if not n else (), (((), ()),) if n > 1 else (), True)
    if total == 0:
        return TensorCoverage(t.key, 0, len(t.chunks), 0, 0, 0, oob, no_storage, (), (), True)
    return _cover_nd(t, boxes, total, oob, no_storage)


def _cover_1d(t: Tensor, intervals: list[tuple[int, int]], total: int, oob: int, no_storage: int) -> TensorCoverage:
    """Sweep over sorted [start, end) intervals: the common case (DistOpt buckets) without numpy."""
    iv = sorted(intervals)
    gaps: list[tuple[int, int]] = []
    overlaps: list[tuple[int, int]] = []
    gap = overlap = 0
    reach = 0  # everything below `reach` is covered at least once
    for start, end in iv:
        if start > reach:
            gap += start - reach
            if len(gaps) < MAX_REPORTED:
                gaps.append((reach, start - reach))
        elif start < reach:
            o_end = min(end, reach)
            overlap += o_end - start
            if len(overlaps) < MAX_REPORTED:
                overlaps.append((start, o_end - start))
        reach = max(reach, end)
    if reach < total:
        gap += total - reach
        if len(gaps) < MAX_REPORTED:
            gaps.append((reach, total - reach))
    # `overlap` counts extra cover of elements; with nested triple overlaps it may count an element twice,
    # which still makes it nonzero exactly when some element is covered more than once.
    return TensorCoverage(
        t.key, total, len(t.chunks), total - gap, gap, overlap, oob, no_storage,
        tuple(((o,), (s,)) for o, s in gaps), tuple(((o,), (s,)) for o, s in overlaps), True,
    )


def _cover_nd(
    t: Tensor, boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], total: int, oob: int, no_storage: int
) -> TensorCoverage:
    import numpy as np  # lazily: numpy comes with pandas; sniff/ls never need it

    shape = t.shape
    ndim = len(shape)
    if not boxes:
        return TensorCoverage(t.key, total, len(t.chunks), 0, total, 0, oob, no_storage,
                              (((0,) * ndim, shape),), (), True)
    offs = np.array([b[0] for b in boxes], dtype=np.int64)
    sizes = np.array([b[1] for b in boxes], dtype=np.int64)
    ends = offs + sizes
    bounds = [np.unique(np.concatenate(([0, shape[d]], offs[:, d], ends[:, d]))) for d in range(ndim)]
    cells = math.prod(len(b) - 1 for b in bounds)
    if cells > MAX_CELLS:
        return _fallback(t, offs, sizes, total, oob, no_storage)
    lo = np.stack([np.searchsorted(bounds[d], offs[:, d]) for d in range(ndim)], axis=1)
    hi = np.stack([np.searchsorted(bounds[d], ends[:, d]) for d in range(ndim)], axis=1)
    diff = np.zeros(tuple(len(b) for b in bounds), dtype=np.int32)
    for corner in range(1 << ndim):
        idx = tuple(np.where((corner >> d) & 1, hi[:, d], lo[:, d]) for d in range(ndim))
        sign = -1 if bin(corner).count("1") % 2 else 1
        np.add.at(diff, idx, sign)
    count = diff
    for d in range(ndim):
        count = np.cumsum(count, axis=d)
    count = count[tuple(slice(0, len(b) - 1) for b in bounds)]
    widths = np.ones(count.shape, dtype=np.int64)
    for d in range(ndim):
        w = np.diff(bounds[d]).reshape([-1 if i == d else 1 for i in range(ndim)])
        widths = widths * w
    # Exact integers: a cell's width is at most the tensor's numel (bounded by the readers), but summing many of
    # them, or multiplying by a cover count, can pass 2**63 and wrap a gap to zero.
    gap = sum(int(w) for w in widths[count == 0].tolist())
    many = count > 1
    overlap = sum(int(w) * (int(c) - 1) for w, c in zip(widths[many].tolist(), count[many].tolist()))
    return TensorCoverage(
        t.key, total, len(t.chunks), total - gap, gap, overlap, oob, no_storage,
        _regions(count == 0, bounds), _regions(count > 1, bounds), True,
    )


def _regions(mask: Any, bounds: list[Any]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    import numpy as np

    out = []
    for cell in np.argwhere(mask)[:MAX_REPORTED]:
        o = tuple(int(bounds[d][i]) for d, i in enumerate(cell))
        s = tuple(int(bounds[d][i + 1] - bounds[d][i]) for d, i in enumerate(cell))
        out.append((o, s))
    return tuple(out)


def _fallback(t: Tensor, offs: Any, sizes: Any, total: int, oob: int, no_storage: int) -> TensorCoverage:
    """Exact volume sum + an overlap sweep along axis 0 (for grids too irregular to compress).

    The sweep keeps the chunks still open at each start sorted by their end (a heap), so chunks that end before it
    are dropped in O(log n); it compares at most `MAX_PAIR_CHECKS` pairs in all (a grid built to make every pair
    overlap on axis 0 would otherwise be quadratic): past that the overlap count is a lower bound and the result
    is marked inexact. With overlaps the union is measured exactly (`_union_volume`, up to `MAX_UNION_CHUNKS`
    chunks): an overlap must not hide a gap of the same volume. `overlap` is then elements covered more than once,
    as in the exact method; past either bound it stays the count of overlapping pairs, and the result is inexact."""
    import heapq

    order = offs[:, 0].argsort(kind="stable").tolist()
    o, z = offs.tolist(), sizes.tolist()
    ndim = len(o[0]) if o else 0
    overlap_pairs = 0
    checks = 0
    exact = False
    active: list[tuple[int, int]] = []  # (end on axis 0, chunk)
    for i in order:
        start = o[i][0]
        while active and active[0][0] <= start:
            heapq.heappop(active)
        for _, j in active:
            checks += 1
            if all(o[i][d] < o[j][d] + z[j][d] and o[j][d] < o[i][d] + z[i][d] for d in range(1, ndim)):
                overlap_pairs += 1
        if checks > MAX_PAIR_CHECKS:
            break
        heapq.heappush(active, (start + z[i][0], i))
    volume = sum(math.prod(row) for row in z)  # exact: Python ints never wrap
    overlap, union = overlap_pairs, volume
    if overlap_pairs and checks <= MAX_PAIR_CHECKS and len(o) <= MAX_UNION_CHUNKS:
        union = _union_volume([(tuple(a), tuple(x + y for x, y in zip(a, b))) for a, b in zip(o, z)], 0)
        overlap = volume - union
    gap = max(total - union, 0)
    return TensorCoverage(t.key, total, len(t.chunks), total - gap, gap, overlap, oob, no_storage,
                          (), (), exact)


def _union_volume(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], axis: int) -> int:
    """Volume of the union of half-open boxes `(lo, hi)`: sweep `axis`, recurse on the boxes spanning each slab.

    Cost grows with the boxes that share a slab, not with the tensor: chunks of a checkpoint overlap in few places.
    """
    if not boxes:
        return 0
    if axis == len(boxes[0][0]) - 1:
        covered, reach = 0, None
        for lo, hi in sorted((b[0][axis], b[1][axis]) for b in boxes):
            if reach is None or lo > reach:
                covered += hi - lo
                reach = hi
            elif hi > reach:
                covered += hi - reach
                reach = hi
        return covered
    cuts = sorted({b[0][axis] for b in boxes} | {b[1][axis] for b in boxes})
    by_start = sorted(boxes, key=lambda b: b[0][axis])
    total, nxt = 0, 0
    live: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for a, b in zip(cuts, cuts[1:]):
        while nxt < len(by_start) and by_start[nxt][0][axis] <= a:
            live.append(by_start[nxt])
            nxt += 1
        live = [x for x in live if x[1][axis] > a]
        if live:
            total += (b - a) * _union_volume(live, axis + 1)
    return total


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Coverage findings for every global tensor (legacy per-rank tensors are local: nothing to cover). The chunk
    table is screened at once (`columns.tensors_to_check`); only the tensors it flags are computed exactly."""
    if ckpt.format is Format.TORCH:
        return
    from ckptinspect.checks.columns import tensors_to_check

    # DCP per-rank metadata: each rank wrote (and loads) its own copy of what it holds replicated
    table = ckpt.table.replicas_once() if ckpt.rank_metadata else ckpt.table
    tensors = table.tensors
    for i in tensors_to_check(table).nonzero()[0].tolist():
        yield from tensor_findings(ckpt, tensors[i])
    for o in ckpt.objects:
        if o.storage is None:
            yield Finding("CK304", f"byte item {o.key} has no storage entry", o.key, ckpt.path)


def tensor_findings(ckpt: Checkpoint, t: Tensor) -> Iterator[Finding]:
    """The exact coverage findings of one tensor of `ckpt` (a gap with its place in the parallel layout)."""
    cov = tensor_coverage(t)
    for f in findings_for(cov, ckpt.path, t):
        yield _with_layout(f, ckpt, t, cov) if f.code == "CK301" and cov.gaps else f


def _with_layout(f: Finding, ckpt: Checkpoint, t: Tensor, cov: TensorCoverage) -> Finding:
    """A gap's place in the parallel layout (layer, PP rank, virtual stage, expert, EP rank, writer rank)."""
    coords = [locate(ckpt, t, o, s) for o, s in cov.gaps]
    text = describe(coords[0]) if coords else ""
    if not text:
        return f
    return dataclasses.replace(f, message=f"{f.message} ({text})",
                               details={**(f.details or {}), "layout": coords})


def findings_for(cov: TensorCoverage, path: str, tensor: Tensor | None = None) -> Iterator[Finding]:
    key = cov.key
    if cov.out_of_bounds:
        yield Finding("CK303", f"{key}: {cov.out_of_bounds} chunk(s) outside the global shape", key, path,
                      {"chunks": cov.out_of_bounds})
    if cov.no_storage:
        yield Finding("CK304", f"{key}: {cov.no_storage} chunk(s) without a storage entry", key, path,
                      {"chunks": cov.no_storage})
    if cov.gap:
        where = "; ".join(_fmt(o, s) for o, s in cov.gaps) or "coordinates unknown (irregular grid)"
        data: dict[str, object] = {"elements": cov.gap, "regions": [r for r in cov.to_dict()["gaps"]]}
        orig = [r for r in (orig_region(tensor, o, s) for o, s in cov.gaps) if r] if tensor is not None else []
        if orig and tensor is not None:
            where += f" = in the original {list(tensor.orig_shape or ())} (mcore_data): {orig[0]}"
            data["orig_regions"] = orig
        yield Finding("CK301", f"{key}: {cov.gap} of {cov.numel} elements covered by no chunk, e.g. {where}",
                      key, path, data)
    if cov.overlap:
        where = "; ".join(_fmt(o, s) for o, s in cov.overlaps) or "coordinates unknown"
        yield Finding("CK302", f"{key}: {cov.overlap} element(s) covered more than once, e.g. {where}",
                      key, path, {"elements": cov.overlap, "regions": [r for r in cov.to_dict()["overlaps"]]})


def _fmt(offsets: tuple[int, ...], sizes: tuple[int, ...]) -> str:
    if not offsets:
        return "the scalar"
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes)) + "]"


def orig_region(t: Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> str | None:
    """Map a region of an N-D reformulated tensor back to its original shape (`mcore_data`), or None.

    Megatron-Core 0.8-0.15 stores a flattened DistOpt tensor as (*grid, local numel): one axis per axis of the
    original's model-parallel sharding grid, then the flattened local shard (reference §5.4; checked on
    sample_ckpts/mcore_0_13_1, e.g. output_layer (128, 16) at TP2 -> (2, 1, 1024)). The region's first and last
    elements are given as original coordinates, with the block (grid cell) and flat range they came from.
    """
    local = t.reformulated_local
    if local is None or not offsets or not sizes or 0 in sizes:
        return None

    def coords(block: tuple[int, ...], flat: int) -> list[int]:
        out = []
        for n in reversed(local):
            out.append(flat % n)
            flat //= n
        return [b * n + c for b, n, c in zip(block, local, reversed(out))]

    first_block = offsets[:-1]
    last_block = tuple(o + s - 1 for o, s in zip(offsets[:-1], sizes[:-1]))
    a, b = offsets[-1], offsets[-1] + sizes[-1]
    return (f"elements {coords(first_block, a)} .. {coords(last_block, b - 1)} "
            f"(grid cell {list(first_block)}{'' if first_block == last_block else f'..{list(last_block)}'}, "
            f"flat {a}:{b} of a {list(local)} shard)")
