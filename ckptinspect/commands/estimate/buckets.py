"""The DistributedOptimizer's grad-buffer layout, and the slice of it each DP rank saves (dp_reshardable).

Megatron-Core 0.16 `_ParamAndGradBuffer.__init__` (`distributed/param_and_grad_buffer.py`) walks the parameters of
one model chunk in *reverse* registration order, starts every parameter at a multiple of 64 elements and pads every
bucket's end to a multiple of lcm(DP, 128) when the distributed optimizer is on; a shared (tied) embedding gets a
bucket of its own. Each DP rank owns the contiguous 1/DP of every bucket. In the `dp_reshardable` layout
(`distrib_optimizer.py`, `sharded_param_state_dp_reshardable`) a rank saves, per bucket and per state
(fp32 param, exp_avg, exp_avg_sq), one 1-D chunk per parameter slice and per padding gap in its range; the chunks tile
[0, numel_unpadded) of the bucket, so the bucket's tail padding is not stored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BufferParam:
    """One parameter in a grad buffer: a name (for reading only), local elements, whether it is a tied embedding."""

    name: str
    numel: int
    shared_embedding: bool = False
    tp_replicated: bool = False  # the same parameter sits in every TP rank's buffer (layernorms, row-parallel bias)


@dataclass(frozen=True, slots=True)
class Slice:
    """One saved 1-D chunk: bucket index, offset inside the bucket, length (elements), and the index (in
    registration order) of the parameter it belongs to, -1 for padding."""

    bucket: int
    offset: int
    length: int
    param: int = -1


def _pad(n: int, divisor: int) -> int:
    return int(math.ceil(n / divisor) * divisor)


def unpadded_numel(params: Sequence[BufferParam], dp: int, bucket_size: int | None = None) -> int:
    """Elements of the buffer without the bucket-end padding (what `dp_zero_gather_scatter` gathers)."""
    return sum((spans[-1][1] if spans else start) - start for start, _, spans in bucket_layout(params, dp, bucket_size))


def bucket_layout(params: Sequence[BufferParam], dp: int, bucket_size: int | None = None
                  ) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Buckets as (start, padded end, [(param start, param end)...]) in buffer coordinates.

    `params` in registration order; the buffer is filled in reverse, as Megatron does.
    """
    buckets: list[tuple[int, int, list[tuple[int, int]]]] = []
    start = 0
    bucket_start = 0
    current: list[tuple[int, int]] = []
    end = 0
    divisor = math.lcm(dp, 128)
    for p in reversed(params):
        start = _pad(start, 64)
        if p.shared_embedding and current:
            padded = _pad(start, divisor)
            buckets.append((bucket_start, padded, current))
            bucket_start, start, current = padded, padded, []
        end = start + p.numel
        current.append((start, end))
        if (bucket_size is not None and end - bucket_start >= bucket_size) or p.shared_embedding:
            padded = _pad(end, divisor)
            buckets.append((bucket_start, padded, current))
            bucket_start, start, current = padded, padded, []
        else:
            start = end
    if current:
        buckets.append((bucket_start, _pad(end, divisor), current))
    return buckets


def rank_slices(params: Sequence[BufferParam], dp: int, bucket_size: int | None = None,
                padding: bool = True) -> list[list[Slice]]:
    """Per DP rank, the chunks it saves for one state of one buffer: parameter slices and, with `padding`
    (dp_reshardable), the interior alignment gaps; without it (0.8-0.13 `fully_sharded_model_space`) only the
    parameter slices."""
    out: list[list[Slice]] = [[] for _ in range(dp)]
    order = list(reversed(range(len(params))))  # the buffer is filled in reverse registration order
    for b, (b_start, b_end, spans) in enumerate(bucket_layout(params, dp, bucket_size)):
        unpadded_end = spans[-1][1] if spans else b_start
        # Pieces tiling [b_start, unpadded_end): parameters and the 64-alignment gaps between them.
        pieces: list[tuple[int, int, int]] = []
        cursor = b_start
        for s, e in spans:
            if s > cursor and padding:
                pieces.append((cursor, s, -1))
            pieces.append((s, e, order.pop(0)))
            cursor = e
        per_rank = (b_end - b_start) // dp
        for r in range(dp):
            lo, hi = b_start + r * per_rank, b_start + (r + 1) * per_rank
            for s, e, index in pieces:
                a, z = max(s, lo), min(e, hi)
                if a < z:
                    out[r].append(Slice(b, a - b_start, z - a, index))
    return out
