"""Values of N-D reformulated tensors (Megatron-Core 0.8–0.15 flattened DistOpt state, `mcore_data`), for `diff`.

Such a tensor is stored as `(*grid, local numel)`: one axis per axis of the original's model-parallel sharding grid,
then the flattened local shard (reference §5.4; `checks.coverage.orig_region` maps coverage gaps the same way; e.g.
output_layer (128, 16) at TP2 is stored as (2, 1, 1024)). Its stored chunks are flat ranges of a local shard, which
are no boxes in the original shape, so the box-by-box comparison of `values.compare_tensor_values` cannot pair them
with the other side's chunks. Here both sides are assembled whole in the original shape and compared at once — only
up to `MAX_ELEMENTS` elements per tensor (a few arrays of that size live at once), larger ones are skipped with the
reason. Nothing is assembled for tensors that are not reformulated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptinspect.commands.diff.values import ValueComparison, Acc, chunk_box, compare_box, supported
from ckptinspect.services.chunk_bytes import ChunkSource, open_chunk
from ckptinspect.errors import ReadError
from ckptinspect.model import Tensor

# Elements per side assembled in memory (float32: 128 MiB a side).
MAX_ELEMENTS = 1 << 25


def reformulated(t: Tensor) -> bool:
    """True when `t` is stored N-D reformulated and its original shape can be restored from the stored one."""
    return t.reformulated_local is not None


def _assemble(t: Tensor, src: ChunkSource) -> npt.NDArray[Any]:
    """The whole tensor in its logical (original) shape, from its stored chunks. Raises ReadError when a chunk is
    unreadable or the chunks do not cover it."""
    arrays = [(c, open_chunk(src, c, t.dtype)) for c in t.chunks]
    if not arrays:
        raise ReadError(f"{t.key}: no chunk stored")
    out = np.zeros(t.shape, dtype=arrays[0][1].dtype)
    covered = 0
    for c, arr in arrays:
        lo, hi = chunk_box(c)
        out[tuple(slice(a, b) for a, b in zip(lo, hi))] = arr
        covered += math.prod(c.sizes)
    if covered != math.prod(t.shape):
        raise ReadError(f"{t.key}: stored chunks cover {covered} of {math.prod(t.shape)} elements")
    local = t.reformulated_local
    if local is None:
        return out
    grid = t.shape[:-1]
    n = len(grid)
    # (*grid, *local) -> interleave (g0, l0, g1, l1, ...) -> original shape: element [b*local + c] of axis i.
    blocks = out.reshape(*grid, *local).transpose([ax for i in range(n) for ax in (i, n + i)])
    return np.ascontiguousarray(blocks).reshape(t.orig_shape or ())


def compare_logical(a: Tensor, a_src: ChunkSource, b: Tensor, b_src: ChunkSource) -> ValueComparison:
    """Compare `a` and `b` in their logical shape when either is N-D reformulated (both assembled whole)."""
    shape = a.orig_shape or a.shape
    if shape != (b.orig_shape or b.shape) or a.dtype != b.dtype:
        raise ReadError(f"{a.key}: shapes/dtypes differ, values not comparable")
    why = supported(a.dtype)
    if why is not None:
        raise ReadError(why)
    numel = math.prod(shape)
    if numel > MAX_ELEMENTS:
        raise ReadError(f"N-D reformulated tensor of {numel} elements: larger than the {MAX_ELEMENTS} assembled "
                        "in memory for a comparison in its original shape")
    xa, xb = _assemble(a, a_src), _assemble(b, b_src)
    acc = Acc()
    zero = (0,) * len(shape)
    compare_box(xa, zero, xb, zero, (zero, tuple(shape)), a.dtype, acc)
    return ValueComparison(a.key, acc.compared, numel - acc.compared, acc.mismatched, acc.max_diff, acc.first,
                           acc.a_value, acc.b_value)
