"""Tensor values for `diff --values`: chunk bytes read straight from their stored byte ranges and compared with numpy.

Where a chunk's bytes are and how they are mapped: `services/chunk_bytes.py`.

Views with a zero stride (`torch.zeros(1).expand(10**8)`: 4 stored bytes for 10**8 elements) are compared without
expanding them: an axis along which both sides repeat one stored element is compared once and counted as its length,
so work follows the stored elements. A pair of views whose overlap would still take far more comparisons than the
elements they store (A repeats along one axis, B along another) is not compared (`ReadError`, the key is skipped
with that reason).

Nothing is loaded whole: chunks are memory-mapped, and the overlap of one A chunk with one B chunk is compared in
slabs of at most `SLAB_ELEMENTS` elements, so memory stays bounded whatever the chunk sizes. When the chunk grids of A
and B differ (another TP/PP split, another DCP mesh), every A chunk box is intersected with the B chunk boxes that
overlap it and the overlapping sub-boxes are compared. torch is never imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptinspect.errors import ReadError
from ckptinspect.model import Chunk, Tensor, dtype_size
from ckptinspect.services.chunk_bytes import BITS_CODES, NUMPY_CODES, ChunkSource, ValueKind, open_chunk

# Elements per compared slab (a few temporaries of this many elements live at once: ~100 MB at float64).
SLAB_ELEMENTS = 1 << 22

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (lo, hi) corners, hi exclusive


@dataclass(frozen=True, slots=True)
class ValueComparison:
    """The values of one tensor in A and B.

    compared_elements: elements compared (the overlap of A's and B's chunks).
    uncovered_elements: elements of the tensor not compared because a chunk was missing on one side.
    mismatched_elements: compared elements that differ (NaN equals NaN; -0.0 equals 0.0).
    max_abs_diff: largest |a - b| over the mismatches where neither side is NaN; None when there is none, or for
        dtypes compared bit for bit (float8, ...).
    first_mismatch: global index of the first mismatch met (in chunk order), with its values in A and B.
    """

    key: str
    compared_elements: int
    uncovered_elements: int
    mismatched_elements: int
    max_abs_diff: float | None
    first_mismatch: tuple[int, ...] | None
    a_value: Any
    b_value: Any

    @property
    def identical(self) -> bool:
        return self.mismatched_elements == 0


def supported(dtype: str) -> str | None:
    """None when values of `dtype` can be compared, else why not."""
    if dtype in NUMPY_CODES or (dtype_size(dtype) or 0) in BITS_CODES:
        return None
    return f"dtype {dtype} not supported"


def compare_tensor_values(
    a: Tensor, a_src: ChunkSource, b: Tensor, b_src: ChunkSource, advance: Callable[[int], None] | None = None,
    atol: float = 0.0, rtol: float = 0.0,
) -> ValueComparison:
    """Compare the values of `a` and `b` (same shape and dtype), one A chunk against the B chunks it overlaps.

    `advance(n)` is called with the bytes of each A chunk once it is done. Raises `ReadError` when a chunk cannot be
    read (missing storage, transforms, compressed record, shape/dtype disagreeing with the metadata). `atol` /
    `rtol`: float elements with ``|a - b| <= atol + rtol * |b|`` count as equal (numpy's `isclose`; 0, 0 = exact).
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ReadError(f"{a.key}: shapes/dtypes differ, values not comparable")
    why = supported(a.dtype)
    if why is not None:
        raise ReadError(why)
    acc = Acc()
    itemsize = dtype_size(a.dtype) or 0
    b_boxes = [(chunk_box(c), c) for c in b.chunks]
    for ca in a.chunks:
        box_a = chunk_box(ca)
        arr_a: npt.NDArray[Any] | None = None
        for box_b, cb in b_boxes:
            inter = _intersect(box_a, box_b)
            if inter is None:
                continue
            if arr_a is None:
                arr_a = open_chunk(a_src, ca, a.dtype)
            arr_b = open_chunk(b_src, cb, b.dtype)
            compare_box(arr_a, box_a[0], arr_b, box_b[0], inter, a.dtype, acc, atol, rtol)
            del arr_b
        del arr_a
        if advance is not None:
            advance(math.prod(ca.sizes) * itemsize)
    uncovered = max(0, a.numel - acc.compared)
    return ValueComparison(a.key, acc.compared, uncovered, acc.mismatched, acc.max_diff, acc.first, acc.a_value,
                           acc.b_value)


def chunk_box(c: Chunk) -> Box:
    return tuple(c.offsets), tuple(o + s for o, s in zip(c.offsets, c.sizes))


def _intersect(x: Box, y: Box) -> Box | None:
    lo = tuple(max(a, b) for a, b in zip(x[0], y[0]))
    hi = tuple(min(a, b) for a, b in zip(x[1], y[1]))
    if len(x[0]) != len(y[0]) or any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, hi  # for 0-dim tensors ((), ()): the one chunk always overlaps


class Acc:
    """Running totals of one tensor's comparison."""

    __slots__ = ("compared", "mismatched", "max_diff", "first", "a_value", "b_value")

    def __init__(self) -> None:
        self.compared = 0
        self.mismatched = 0
        self.max_diff: float | None = None
        self.first: tuple[int, ...] | None = None
        self.a_value: Any = None
        self.b_value: Any = None


def _slabs(lo: tuple[int, ...], hi: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Split a box along axis 0 into pieces of at most SLAB_ELEMENTS elements (at least one row each)."""
    if not lo:
        yield lo, hi
        return
    row = math.prod(h - l for l, h in zip(lo[1:], hi[1:]))
    rows = max(1, SLAB_ELEMENTS // max(row, 1))
    for start in range(lo[0], hi[0], rows):
        yield (start, *lo[1:]), (min(start + rows, hi[0]), *hi[1:])


def _collapse(va: npt.NDArray[Any], vb: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any], int]:
    """Keep one index of every axis along which both views repeat one element (stride 0 on both sides): the values
    do not change along it. Returns the views and how many elements each compared one stands for. Raises
    `ReadError` when what is left would take far more comparisons than the elements the two views store."""
    weight = 1
    index: list[slice] = []
    for ax, n in enumerate(va.shape):
        if n > 1 and va.strides[ax] == 0 and vb.strides[ax] == 0:
            weight *= n
            index.append(slice(0, 1))
        else:
            index.append(slice(None))
    va, vb = va[tuple(index)], vb[tuple(index)]
    work = math.prod(va.shape)
    stored = sum(math.prod(n for n, st in zip(v.shape, v.strides) if st) for v in (va, vb))
    if work > 2 * stored + SLAB_ELEMENTS:
        raise ReadError(f"views repeat stored elements along different axes: {work} comparisons for {stored} "
                        "stored elements; values not compared")
    return va, vb, weight


def compare_box(arr_a: npt.NDArray[Any], off_a: tuple[int, ...], arr_b: npt.NDArray[Any], off_b: tuple[int, ...],
                 inter: Box, dtype: str, acc: Acc, atol: float = 0.0, rtol: float = 0.0) -> None:
    kind = NUMPY_CODES.get(dtype, ("", ValueKind.BITS))[1]
    lo0, hi0 = inter
    va, vb, weight = _collapse(arr_a[tuple(slice(l - o, h - o) for l, h, o in zip(lo0, hi0, off_a))],
                               arr_b[tuple(slice(l - o, h - o) for l, h, o in zip(lo0, hi0, off_b))])
    zero = tuple(0 for _ in va.shape)
    for lo, hi in _slabs(zero, tuple(va.shape)):
        cut = tuple(slice(l, h) for l, h in zip(lo, hi))
        xa = _values(va[cut], kind)
        xb = _values(vb[cut], kind)
        lo = tuple(a + b for a, b in zip(lo, lo0))  # global coordinates (a collapsed axis keeps its first index)
        acc.compared += int(xa.size) * weight
        if kind in (ValueKind.FLOAT, ValueKind.BF16):
            with np.errstate(invalid="ignore", over="ignore"):
                same = (xa == xb) | (np.isnan(xa) & np.isnan(xb))
                if atol or rtol:
                    wide = np.complex128 if np.iscomplexobj(xa) else np.float64
                    wa, wb = xa.astype(wide), xb.astype(wide)
                    same |= np.abs(wa - wb) <= atol + rtol * np.abs(wb)
        else:
            same = xa == xb
        mism = ~same
        n = int(np.count_nonzero(mism))
        if not n:
            continue
        acc.mismatched += n * weight
        if acc.first is None:
            local = np.unravel_index(int(np.argmax(mism)), mism.shape) if mism.ndim else ()
            acc.first = tuple(int(l) + int(i) for l, i in zip(lo, local))
            acc.a_value, acc.b_value = _scalar(xa[local]), _scalar(xb[local])
        if kind is ValueKind.BITS:
            continue
        da, db = xa[mism], xb[mism]
        if kind is ValueKind.BOOL:
            diff = np.ones(da.shape, dtype=np.float64)
        elif np.iscomplexobj(da):
            diff = np.abs(da.astype(np.complex128) - db.astype(np.complex128))
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(da.astype(np.float64) - db.astype(np.float64))
        diff = diff[~np.isnan(diff)]
        if diff.size:
            m = float(diff.max())
            acc.max_diff = m if acc.max_diff is None else max(acc.max_diff, m)


def _values(x: npt.NDArray[Any], kind: ValueKind) -> npt.NDArray[Any]:
    if kind is ValueKind.BF16:
        return (np.asarray(x).astype(np.uint32) << 16).view(np.float32)
    if kind is ValueKind.BOOL:
        out: npt.NDArray[Any] = np.asarray(x) != 0
        return out
    return np.asarray(x)


def _scalar(v: Any) -> Any:
    """A numpy scalar as a plain JSON-able Python value (NaN / inf as strings)."""
    out = v.item() if hasattr(v, "item") else v
    if isinstance(out, complex):
        return str(out)
    if isinstance(out, float) and not math.isfinite(out):
        return str(out)
    return out
