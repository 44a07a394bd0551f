"""Layer slices of Megatron's stacked tensors: which layers of a key are zero throughout (CK905 / CK906 per layer).

Megatron-Core's `torch_dist` sharded state dict stacks the layers of a pipeline stage along a leading axis
(`decoder.layers.mlp.linear_fc1.weight` is ``[layers, out, in]``; `optimizer.state.exp_avg.decoder.layers...` too),
so a zeroed layer hides inside a key that is not zero as a whole. A stacked key is one with a ``layers`` segment not
followed by a layer number (torchtitan's and the legacy format's `layers.0.` keys are per layer already).

A chunk records, per layer its extent covers, whether an element of it is non-zero (-0.0 counts as zero). The scan
only looks at the bits of a piece that held a zero: a piece without one marks every layer it touches as non-zero at
no cost. A layer is zero throughout when every chunk covering it says so.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ckptinspect.model import Chunk
from ckptinspect.services.values_stats import CODECS, Kind

_NUMBERED = re.compile(r"(?:^|[./])layers[./]\d")
_STACKED = re.compile(r"(?:^|[./])layers(?:[./]|$)")


def is_stacked(key: str, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and _STACKED.search(key) is not None and _NUMBERED.search(key) is None


class LayerNonzero:
    """Per layer of one chunk's extent: whether a non-zero element was seen."""

    def __init__(self, chunk: Chunk, dtype: str) -> None:
        self.base = chunk.offsets[0]
        self.row = max(1, math.prod(chunk.sizes[1:]))
        self.nonzero = np.zeros(chunk.sizes[0], dtype=bool)
        codec = CODECS[dtype]
        # the magnitude bits of a float (a sign alone is -0.0: zero); every bit of an integer or bool
        self.mask = codec.abs_mask if codec.kind is Kind.FLOAT or dtype.startswith("float8") else None
        self.bits = codec.bits

    def add(self, piece: Any, local_start: int, had_zero: bool) -> None:
        raw = np.frombuffer(piece, dtype=np.uint8)
        bits = raw.view(self.bits) if raw.ctypes.data % np.dtype(self.bits).itemsize == 0 else raw.copy().view(
            self.bits)
        n = len(bits)
        if n == 0:
            return
        l0, l1 = local_start // self.row, (local_start + n - 1) // self.row + 1
        if not had_zero:
            self.nonzero[l0:l1] = True
            return
        nz = (bits & bits.dtype.type(self.mask)) != 0 if self.mask is not None else bits != 0
        starts = np.maximum(np.arange(l0, l1, dtype=np.int64) * self.row - local_start, 0)
        self.nonzero[l0:l1] |= np.add.reduceat(nz, starts) > 0

    def span(self) -> tuple[int, int]:
        return self.base, self.base + len(self.nonzero)

    def zero_layers(self) -> tuple[int, ...]:
        return tuple(int(i) + self.base for i in np.flatnonzero(~self.nonzero))
