"""Vectorised screening of a `ChunkTable` for the coverage and storage checks: no Python object per chunk.

Coverage: every 1-D tensor (Megatron's DistOpt buckets, torchtitan's FSDP2 flat shards: nearly every chunk of a
fully sharded checkpoint) is swept in one pass over all chunks at once. Each tensor gets a disjoint range of a global
coordinate line (its base + offset), so one lexicographic sort, one running maximum and one `bincount` give every
tensor's gap and overlap totals exactly as `coverage._cover_1d` computes them (a zero-length sentinel at each
tensor's base resets the running maximum). Out-of-bounds and no-storage counts are masks. Only tensors with a
problem, and N-D tensors (model weights: few chunks), go through the per-tensor exact code, so findings (regions
included) are those of the object path, in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptinspect.model.chunk_table import ChunkTable

I64 = np.int64


def chunk_tensor_ids(table: ChunkTable) -> Any:
    """Tensor index of every chunk row (int32 while the tensors fit it: 4 bytes a chunk)."""
    dtype = np.int32 if table.n_tensors < 2**31 else I64
    return np.repeat(np.arange(table.n_tensors, dtype=dtype), np.diff(table.tensor_start))


def tensors_to_check(table: ChunkTable, check_storage: bool = True) -> Any:
    """Boolean per tensor: True where the exact per-tensor computation is needed (a 1-D tensor with a gap, an
    overlap, a chunk out of bounds or without storage; every tensor that is not 1-D). Temporaries are dropped as
    soon as they are used (the peak is a few dozen bytes per chunk)."""
    t_nd = np.diff(table.shape_start)
    need = t_nd != 1
    n = table.n_chunks
    if n == 0:
        return need
    tid = chunk_tensor_ids(table)
    if check_storage:
        need |= np.bincount(tid[table.file_id < 0], minlength=table.n_tensors) > 0
    one = np.flatnonzero(t_nd == 1)
    if not len(one):
        return need
    dim = np.zeros(table.n_tensors, dtype=I64)
    dim[one] = table.shapes[table.shape_start[one]]
    rows = np.flatnonzero(t_nd[tid] == 1)
    t_r = tid[rows]
    del tid
    cs_all = table.coord_start[rows]
    nd1 = table.coord_start[rows + 1] - cs_all == 1
    del rows
    start = np.zeros(len(t_r), dtype=I64)
    size = np.zeros(len(t_r), dtype=I64)
    cs = cs_all[nd1]
    del cs_all
    start[nd1] = table.offsets[cs]
    size[nd1] = table.sizes[cs]
    del cs
    end = start + size
    oob = ~nd1 | (start < 0) | (size < 0) | (end > dim[t_r])
    del nd1
    need |= np.bincount(t_r[oob], minlength=table.n_tensors) > 0
    good = ~oob & (size > 0)
    del oob, size
    # the global line: tensor t owns [base[t], base[t] + dim[t]]
    if int(dim[one].sum()) + len(one) >= (1 << 62):
        need[one] = True  # coordinates would not fit one int64 line: leave them to the exact code
        return need
    base = np.zeros(table.n_tensors, dtype=I64)
    base[one] = np.cumsum(dim[one] + 1) - (dim[one] + 1)
    t_g = t_r[good]
    del t_r
    b_g = base[t_g]
    s = np.concatenate((b_g + start[good], base[one]))
    del start
    e = np.concatenate((b_g + end[good], base[one]))
    del end, b_g, good
    t_all = np.concatenate((t_g, one.astype(t_g.dtype)))
    real = np.zeros(len(t_all), dtype=bool)
    real[:len(t_g)] = True
    del t_g
    order = np.lexsort((e, s))
    s = s[order]
    e = e[order]
    t_all = t_all[order]
    real = real[order]
    del order
    reach = np.maximum.accumulate(e)
    del e
    prev = np.empty_like(reach)
    prev[0] = s[0]
    prev[1:] = reach[:-1]
    # a gap (s > prev) or an overlap (s < prev, and a real chunk has size > 0 so it overlaps by min(e, prev) - s)
    bad = np.bincount(t_all[real & (s != prev)], minlength=table.n_tensors) > 0
    del s, prev, real
    # what remains uncovered at each tensor's end
    last = np.flatnonzero(np.append(t_all[1:] != t_all[:-1], True))
    tail = base[t_all[last]] + dim[t_all[last]] - reach[last]
    bad[t_all[last][tail > 0]] = True
    need |= bad
    return need
