"""A picture of one tensor's chunk grid: which chunk covers which block, with gaps and overlaps marked.

Coordinates are compressed to the chunk boundaries (as in the coverage check) along two axes — the two with the
most cuts; the other axes are projected (a cell shows a gap if any element of it along them is a gap, an overlap
likewise). Grids larger than `MAX_SIDE` cells per side are cut to their first `MAX_SIDE` rows / columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptinspect.model import Tensor

MAX_SIDE = 64
GAP = -1
OVERLAP = -2


@dataclass(frozen=True, slots=True)
class ChunkPicture:
    """Cells[row][col] = index of the covering chunk, GAP or OVERLAP. Bounds are element offsets."""

    key: str
    shape: tuple[int, ...]
    axes: tuple[int, ...]
    row_bounds: tuple[int, ...]
    col_bounds: tuple[int, ...]
    cells: tuple[tuple[int, ...], ...]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "shape": list(self.shape), "axes": list(self.axes),
                "row_bounds": list(self.row_bounds), "col_bounds": list(self.col_bounds),
                "cells": [list(r) for r in self.cells], "truncated": self.truncated,
                "legend": {"-1": "gap", "-2": "overlap", "n": "chunk index"}}


def chunk_picture(t: Tensor) -> ChunkPicture:
    shape = t.shape
    ndim = len(shape)
    if ndim == 0:
        n = len(t.chunks)
        return ChunkPicture(t.key, shape, (), (0, 1), (0, 1), ((0 if n == 1 else GAP if n == 0 else OVERLAP,),), False)
    cuts = [sorted({0, shape[d], *(c.offsets[d] for c in t.chunks if len(c.offsets) == ndim),
                    *(min(c.offsets[d] + c.sizes[d], shape[d]) for c in t.chunks if len(c.offsets) == ndim)})
            for d in range(ndim)]
    cuts = [[x for x in cut if 0 <= x <= shape[d]] for d, cut in enumerate(cuts)]
    order = sorted(range(ndim), key=lambda d: -len(cuts[d]))
    axes = tuple(sorted(order[:2]))
    row_axis = axes[0]
    col_axis = axes[1] if len(axes) > 1 else None
    rows = cuts[row_axis]
    cols = cuts[col_axis] if col_axis is not None else [0, 1]
    truncated = len(rows) - 1 > MAX_SIDE or len(cols) - 1 > MAX_SIDE
    rows, cols = rows[: MAX_SIDE + 1], cols[: MAX_SIDE + 1]
    # Per cell: the set of chunks touching it along the projected axes, and whether the projection is full.
    grid: list[list[list[int]]] = [[[] for _ in range(len(cols) - 1)] for _ in range(len(rows) - 1)]
    for idx, c in enumerate(t.chunks):
        if len(c.offsets) != ndim:
            continue
        r0, r1 = c.offsets[row_axis], c.offsets[row_axis] + c.sizes[row_axis]
        if col_axis is not None:
            c0, c1 = c.offsets[col_axis], c.offsets[col_axis] + c.sizes[col_axis]
        else:
            c0, c1 = 0, 1
        for i in range(len(rows) - 1):
            if rows[i] >= r1 or rows[i + 1] <= r0:
                continue
            for j in range(len(cols) - 1):
                if cols[j] < c1 and cols[j + 1] > c0:
                    grid[i][j].append(idx)
    other = [d for d in range(ndim) if d not in axes]
    cells = []
    for i in range(len(rows) - 1):
        row = []
        for j in range(len(cols) - 1):
            touching = grid[i][j]
            row.append(_classify(t, touching, other))
        cells.append(tuple(row))
    return ChunkPicture(t.key, shape, axes, tuple(rows), tuple(cols), tuple(cells), truncated)


def _classify(t: Tensor, touching: list[int], other: list[int]) -> int:
    if not touching:
        return GAP
    if not other:
        return touching[0] if len(touching) == 1 else OVERLAP
    # Projected axes: the touching chunks must tile the remaining axes exactly once (volume check per axis box).
    vol = 1
    for d in other:
        vol *= t.shape[d]
    covered = 0
    for idx in touching:
        c = t.chunks[idx]
        part = 1
        for d in other:
            part *= c.sizes[d]
        covered += part
    if covered < vol:
        return GAP
    if covered > vol:
        return OVERLAP
    return touching[0]
