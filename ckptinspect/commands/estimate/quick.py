"""`estimate --params N`: the design notes' by-hand arithmetic, for a model known only by its parameter count.

The parameters are spread evenly over the TP×PP model-parallel domains (P / (TP·PP) each; the notes' "P/4 ≈ 1.9e9
per (tp,pp) domain"), and a domain's bytes evenly over its DP×CP ranks where the save spreads them:
- torch_dist + distributed optimizer: every rank writes 1/DP of its domain's optimizer state (fp32 master + moments,
  12 B per parameter for Adam: 22.5 GB / 64 ≈ 352 MB in the 7.5B example) and, with fully parallel save, 1/DP of
  its domain's weights (3.75 GB / 64 ≈ 59 MB); without it DP rank 0 writes the whole domain's weights;
- legacy: DP rank 0 of each domain writes the domain's weights and its whole optimizer state (3.75 + 22.5 ≈ 26.3 GB).
Per-item archive overhead is left out here (the item count is unknown); the exact form counts it.
"""

from __future__ import annotations

from ckptinspect.commands.estimate.items import FP32, saved_states
from ckptinspect.commands.estimate.ranks import dense_rank
from ckptinspect.commands.estimate.spec import ObjectCosts, SaveOptions, Target
from ckptinspect.commands.estimate.volumes import ByRank, add_bytes
from ckptinspect.model import dtype_size


def quick_torch_dist(params: int, dtype: str, t: Target, o: SaveOptions, costs: ObjectCosts,
                     fully_parallel: bool) -> ByRank:
    by_rank: ByRank = {}
    domain = t.tp * t.pp
    replicas = t.dp * t.cp
    model = params * (dtype_size(dtype) or 2) / domain
    optim = params * FP32 * len(saved_states(o, dtype)) / domain
    for pp in range(t.pp):
        for tp in range(t.tp):
            for dp in range(t.dp):
                for cp in range(t.cp):
                    r = dense_rank(t, pp, dp, tp, cp)
                    first = dp == 0 and cp == 0
                    if fully_parallel:
                        add_bytes(by_rank, r, "model", round(model / replicas))
                    elif first:
                        add_bytes(by_rank, r, "model", round(model))
                    if o.distributed_optimizer:
                        add_bytes(by_rank, r, "optimizer", round(optim / replicas))
                    elif fully_parallel:
                        add_bytes(by_rank, r, "optimizer", round(optim / replicas))
                    elif first:
                        add_bytes(by_rank, r, "optimizer", round(optim))
                    if first:
                        add_bytes(by_rank, r, "rng", costs.rng)
                    add_bytes(by_rank, r, "other", costs.rerun)
    return by_rank


def quick_legacy(params: int, dtype: str, t: Target, o: SaveOptions, costs: ObjectCosts) -> tuple[ByRank, int]:
    by_rank: ByRank = {}
    domain = t.tp * t.pp
    states = len(saved_states(o, dtype))
    dtype_bytes = dtype_size(dtype) or 2
    for pp in range(t.pp):
        for tp in range(t.tp):
            r = dense_rank(t, pp, 0, tp)
            add_bytes(by_rank, r, "model", round(params * dtype_bytes / domain))
            add_bytes(by_rank, r, "optimizer", round(params * FP32 * states / domain))
            add_bytes(by_rank, r, "rng", costs.rng)
            add_bytes(by_rank, r, "other", costs.common)
    return by_rank, domain * (2 if o.distributed_optimizer else 1)
