"""Who writes what: the items of a save assigned to ranks, for torch_dist (fully parallel or not) and legacy.

torch_dist without the fully parallel wrapper: every item is written by its main replica (DP rank 0 of its group for
model tensors, the owner for dp_reshardable optimizer slices): `TorchDistSaveShardedStrategy(keep_only_main_replica)`.

torch_dist with `--ckpt-fully-parallel-save` (Megatron's default): `FullyParallelSaveStrategyWrapper` re-elects the
main replica of every sharded *tensor* inside the DP×CP group that holds its main replica, with the deterministic
greedy `distribute_shards_to_ranks` (`dist_checkpointing/exchange_utils.py`): shards sorted by (number of ranks that
hold them, descending payload bytes, shard id), each given to the least-loaded holder. Byte items (rng, extra state,
rerun state) are not moved. The result: a (tp, pp) shard's weights spread over its DP ranks instead of piling on DP
rank 0, which is the design notes' "each rank writes 1/DP of its domain's weights".

Legacy (`--ckpt-format torch`): one `model_optim_rng.pt` per (tp, pp[, ep]) holding that shard's whole model state,
and with the distributed optimizer a `distrib_optim.pt` holding the whole DP-gathered optimizer state; both written
by DP rank 0 (`dp_rank == 0 or expt_dp_rank == 0`, training/checkpointing.py). TP-replicated tensors (layernorms)
appear in every TP rank's file.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator

from ckptinspect.commands.estimate.items import FP32, WriteItem, copies, saved_states
from ckptinspect.commands.estimate.ranks import dense_rank, dp_group, expert_rank
from ckptinspect.commands.estimate.spec import ModelSpec, ObjectCosts, SaveOptions, Target
from ckptinspect.model import dtype_size

COMPONENTS = ("model", "optimizer", "rng", "other")
ByRank = dict[int, dict[str, int]]


def add_bytes(by_rank: ByRank, rank: int, component: str, n: int) -> None:
    by_rank.setdefault(rank, dict.fromkeys(COMPONENTS, 0))[component] += n


def place(items: Iterable[WriteItem], t: Target, fully_parallel: bool) -> Iterator[tuple[WriteItem, int]]:
    """Every item with the rank that writes it."""
    groups: dict[tuple[int, ...], list[WriteItem]] = defaultdict(list)
    for it in items:
        if fully_parallel and it.tensor:
            groups[dp_group(t, it.main)].append(it)
        else:
            yield it, it.main
    for group, members in groups.items():
        yield from _greedy(group, members)


def assign(items: Iterable[WriteItem], t: Target, fully_parallel: bool) -> tuple[ByRank, dict[int, int]]:
    """Bytes per rank and component, and items per rank."""
    by_rank: ByRank = {}
    counts: dict[int, int] = defaultdict(int)
    for it, rank in place(items, t, fully_parallel):
        add_bytes(by_rank, rank, it.component, it.stored)
        counts[rank] += 1
    return by_rank, dict(counts)


def _greedy(group: tuple[int, ...], members: list[WriteItem]) -> Iterable[tuple[WriteItem, int]]:
    """Megatron's `distribute_shards_to_ranks` over one DP×CP group; loads are payload bytes."""
    in_group = frozenset(group)
    load = dict.fromkeys(group, 0)
    heap = [(0, r) for r in group]  # lazy: an entry is valid while it matches `load`
    keyed = []
    for it in members:
        cand = in_group if len(it.holders) >= len(group) and in_group.issubset(it.holders) else \
            tuple(r for r in it.holders if r in in_group)
        keyed.append(((len(cand), -it.payload, it.shard_id), it, cand))
    keyed.sort(key=lambda k: k[0])
    for _, it, cand in keyed:
        if cand is in_group:
            while True:
                size, rank = heapq.heappop(heap)
                if load[rank] == size:
                    break
        else:
            size, rank = min((load[r], r) for r in cand)
        load[rank] = size + it.payload
        heapq.heappush(heap, (load[rank], rank))
        yield it, rank


def legacy_by_rank(m: ModelSpec, t: Target, o: SaveOptions, costs: ObjectCosts) -> tuple[ByRank, int]:
    """Bytes each legacy writer serializes, and the number of files (model_optim_rng.pt [+ distrib_optim.pt])."""
    by_rank: ByRank = {}
    states = len(saved_states(o, m.param_dtype))
    shards: set[tuple[int, int, int]] = set()
    for c in copies(m, t):
        # The writer of a copy: DP rank 0 of its (tp, pp) for dense tensors, expert-DP rank 0 for experts; a
        # TP-replicated tensor is written by every TP rank's writer (each file is a full state dict).
        tps = [c.tp] if c.tp >= 0 else list(range(t.etp_ if c.ep >= 0 else t.tp))
        for tp in tps:
            writer = expert_rank(t, c.stage, 0, c.ep, tp) if c.ep >= 0 else dense_rank(t, c.stage, 0, tp)
            shards.add((c.stage, tp, max(c.ep, 0)))
            size = dtype_size(c.param.dtype or m.param_dtype) or 2
            add_bytes(by_rank, writer, "model", c.numel * size)  # a tied output layer is in the last stage's file too
            add_bytes(by_rank, writer, "optimizer", c.numel * FP32 * states)
    for stage in range(t.pp):
        for tp in range(t.tp):
            add_bytes(by_rank, dense_rank(t, stage, 0, tp), "rng", costs.rng)
            add_bytes(by_rank, dense_rank(t, stage, 0, tp), "other", costs.common)
    files = len(shards) * (2 if o.distributed_optimizer else 1)
    return by_rank, files
