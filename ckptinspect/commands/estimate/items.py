"""Model + target → the items a torch_dist save writes, each with the ranks that hold a copy and its main replica.

How Megatron-Core lays a model out (reference: producers.md "Parallel layouts", megatron-formats.md §5.2–5.3):
- a layer's tensors live on the stage holding the layer (`sharded_pp_offset`, global layer index on the stacked axis);
  embeddings on the first stage, final norm and output layer on the last;
- a TP-split tensor has one chunk per TP rank (SwiGLU `linear_fc1`: two, W and V), replica_id (0, 0, dp): every
  DP×CP rank of that (pp, tp) holds it, DP rank 0 is the main replica;
- a tensor that TP does not split (layernorms, row-parallel biases, position embeddings) has replica_id
  (0, tp, dp): only TP rank 0's DP group holds a main replica, so only that group writes it;
- expert tensors split the expert axis over EP (offset ep_rank × local experts) and their TP axis over ETP, with
  replicas over the expert-data-parallel group;
- the DistributedOptimizer's state (fp32 master + moments) is sharded over DP (dp_reshardable: 1-D bucket slices,
  one owner each) or, fully_reshardable, saved as one fp32 tensor per model tensor chunk with the weight's replicas.
Objects (rng, TE `_extra_state`, rerun state, optimizer param groups) are placed by the rules in `ObjectCosts`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ckptinspect.commands.estimate.buckets import BufferParam, rank_slices, unpadded_numel
from ckptinspect.commands.estimate.ranks import dense_rank, expert_rank, stage_of_layer
from ckptinspect.commands.estimate.spec import (
    TENSOR_ITEM_OVERHEAD,
    ModelSpec,
    ObjectCosts,
    OptimSharding,
    ParamSpec,
    SaveOptions,
    Stage,
    Target,
)
from ckptinspect.model import StrEnum, dtype_size

FP32 = 4


class BufferKind(StrEnum):
    """DDP grad buffers: dense params over DP×CP, expert params over the expert DP group (`expert_parallel_buffers`).
    The value is the word in the DistributedOptimizer's sharded keys (`optimizer.distributed.<kind>....`)."""

    DENSE = "dense"
    EXPERT = "expert"


@dataclass(frozen=True, slots=True)
class WriteItem:
    """One stored item.

    component: model / optimizer / rng / other (the `audit` summary's split).
    payload: tensor bytes (numel × element size); what the fully parallel distribution balances.
    stored: bytes on disk (payload + archive overhead, or an object's pickled size).
    shard_id: (key, global offsets), Megatron's `_sharded_tensor_shard_id`, the distribution's tie-break.
    holders: ranks holding a copy; main: the rank whose copy is the main replica.
    tensor: False for a byte item (ShardedObject), which the fully parallel save never moves.
    """

    component: str
    payload: int
    stored: int
    shard_id: tuple[str, tuple[int, ...]]
    holders: tuple[int, ...]
    main: int
    tensor: bool = True


@dataclass(frozen=True, slots=True)
class Copy:
    """One saved chunk of a parameter: where it lives and who holds it."""

    param: ParamSpec
    offsets: tuple[int, ...]
    numel: int
    stage: int
    vchunk: int
    tp: int  # TP (or ETP) rank; -1 when replicated over TP
    ep: int  # EP rank; -1 for a dense tensor
    holders: tuple[int, ...]
    main: int
    order: tuple[int, int, int, int]  # registration order: (first / layers / last, layer, param index, expert)


def _placement(m: ModelSpec, t: Target, p: ParamSpec) -> list[tuple[int | None, int, int]]:
    """(layer, stage, vchunk) of every copy of `p` along the layer axis."""
    if p.layers:
        return [(lay, *stage_of_layer(t, m.num_layers, lay)) for lay in p.layers]
    if p.stage is Stage.FIRST:
        return [(None, 0, 0)]
    return [(None, t.pp - 1, t.vpp - 1)]


def copies(m: ModelSpec, t: Target) -> Iterator[Copy]:
    """Every saved chunk of every parameter at target `t` (tied output layers included, `saved` tells)."""
    for index, p in enumerate(m.params):
        if not p.saved and t.pp == 1:
            continue  # a tied output layer is its own parameter only on a last stage that is not the first
        tp_size = t.etp_ if p.experts else t.tp
        pieces = tp_size * p.tp_pieces if p.tp_axis is not None else 1
        numel = p.numel // pieces
        for layer, stage, vchunk in _placement(m, t, p):
            lead = (layer,) if layer is not None else ()
            for e in range(max(p.experts, 1)) if p.experts else (None,):
                ep = e // max(p.experts // t.ep, 1) if e is not None else -1
                for j in range(pieces):
                    tp = j % tp_size if p.tp_axis is not None else -1
                    offs = [0] * len(p.shape)
                    if p.tp_axis is not None:
                        offs[p.tp_axis] = j * (p.shape[p.tp_axis] // pieces)
                    key_offs = lead + ((e,) if e is not None else ()) + tuple(offs)
                    holders, main = _holders(t, stage, tp, ep)
                    region = 1 if layer is not None else (0 if p.stage is Stage.FIRST else 2)
                    order = (region, layer or 0, index, e or 0)
                    yield Copy(p, key_offs, numel, stage, vchunk, tp, ep, holders, main, order)


def _holders(t: Target, stage: int, tp: int, ep: int) -> tuple[tuple[int, ...], int]:
    if ep >= 0:
        etps = range(t.etp_) if tp < 0 else (tp,)
        hold = tuple(expert_rank(t, stage, d, ep, x) for d in range(t.edp) for x in etps)
        return hold, expert_rank(t, stage, 0, ep, max(tp, 0))
    tps = range(t.tp) if tp < 0 else (tp,)
    hold = tuple(dense_rank(t, stage, d, x, c) for d in range(t.dp) for c in range(t.cp) for x in tps)
    return hold, dense_rank(t, stage, 0, max(tp, 0), 0)


def saved_states(o: SaveOptions, model_dtype: str) -> tuple[str, ...]:
    """Optimizer state tensors saved per parameter: fp32 master (always with the distributed optimizer; with a
    16-bit model otherwise) and the moments."""
    moments = ("exp_avg", "exp_avg_sq") if o.optimizer.moments == 2 else ("momentum_buffer",)
    master = o.distributed_optimizer or model_dtype not in ("float32", "float64")
    return (("param",) if master else ()) + moments


def torch_dist_items(m: ModelSpec, t: Target, o: SaveOptions, costs: ObjectCosts) -> list[WriteItem]:
    """Every item a torch_dist save of `m` at `t` writes."""
    items: list[WriteItem] = []
    states = saved_states(o, m.param_dtype)
    all_copies = list(copies(m, t))
    for c in all_copies:
        if not c.param.saved:
            continue
        size = dtype_size(c.param.dtype or m.param_dtype) or 2
        payload = c.numel * size
        items.append(WriteItem("model", payload, payload + TENSOR_ITEM_OVERHEAD, (c.param.key, c.offsets),
                               c.holders, c.main))
        if o.save_optim and (not o.distributed_optimizer or o.optim_sharding is OptimSharding.FULLY_RESHARDABLE):
            for s in states:
                items.append(WriteItem("optimizer", c.numel * FP32, c.numel * FP32 + TENSOR_ITEM_OVERHEAD,
                                       (f"optimizer.state.{s}.{c.param.key}", c.offsets), c.holders, c.main))
    if o.save_optim and o.distributed_optimizer and o.optim_sharding is not OptimSharding.FULLY_RESHARDABLE:
        items.extend(_dp_sharded(t, all_copies, states, costs, o.optim_sharding))
    items.extend(_objects(m, t, costs))
    return items


def _dp_sharded(t: Target, all_copies: list[Copy], states: tuple[str, ...], costs: ObjectCosts,
                sharding: OptimSharding) -> Iterator[WriteItem]:
    # One grad buffer per (model-parallel group, model chunk); dense and expert params in separate buffers over
    # their own DP groups (DDP's `expert_parallel_buffers`).
    # A parameter's chunks on one TP rank are one buffer entry: SwiGLU's W and V pieces are halves of one
    # `linear_fc1.weight` (dict order keeps registration order).
    sizes: dict[tuple[tuple[BufferKind, int, int, int, int], tuple[int, int, int, int]], BufferParam] = {}
    tied_model = _tied(all_copies)
    for c in sorted(all_copies, key=lambda c: c.order):
        if c.ep >= 0:
            group = (BufferKind.EXPERT, c.stage, c.vchunk, c.ep, max(c.tp, 0))
            tps = [max(c.tp, 0)] if c.tp >= 0 else list(range(t.etp_))
        else:
            group = (BufferKind.DENSE, c.stage, c.vchunk, -1, max(c.tp, 0))
            tps = [c.tp] if c.tp >= 0 else list(range(t.tp))
        for x in tps:  # a TP-replicated parameter sits in every TP rank's buffer
            g = group[:4] + (x,)
            tied = not c.param.saved or (tied_model and c.param.key == "embedding.word_embeddings.weight")
            prev = sizes.get((g, c.order))
            sizes[(g, c.order)] = BufferParam(c.param.key, c.numel + (prev.numel if prev else 0), tied, c.tp < 0)
    buffers: dict[tuple[BufferKind, int, int, int, int], list[BufferParam]] = {}
    for (g, _), bp in sizes.items():
        buffers.setdefault(g, []).append(bp)
    for (kind, stage, vchunk, ep, tp), params in buffers.items():
        dp = t.edp if kind is BufferKind.EXPERT else t.dp * t.cp
        key = f"optimizer.distributed.{kind}.{stage}.{ep}.{tp}.gbuf_{vchunk}"
        if sharding is OptimSharding.DP_ZERO_GATHER_SCATTER:
            # the whole group's state gathered to its DP rank 0 and saved as one byte item
            rank = expert_rank(t, stage, 0, ep, tp) if kind is BufferKind.EXPERT else dense_rank(t, stage, 0, tp)
            n = unpadded_numel(params, dp) * FP32 * len(states)
            yield WriteItem("optimizer", 0, n + TENSOR_ITEM_OVERHEAD, (key, ()), (rank,), rank, tensor=False)
            continue
        padding = sharding is not OptimSharding.FULLY_SHARDED_MODEL_SPACE
        for d, slices in enumerate(rank_slices(params, dp, padding=padding)):
            if not padding and tp > 0:
                # per-parameter keys (0.8-0.13): a TP-replicated parameter's state is saved by TP rank 0 only
                slices = [sl for sl in slices if sl.param < 0 or not params[sl.param].tp_replicated]
            if kind is BufferKind.EXPERT:
                rank = expert_rank(t, stage, d, ep, tp)
            else:
                rank = dense_rank(t, stage, d // t.cp, tp, d % t.cp)
            for s in states:
                for sl in slices:
                    yield WriteItem("optimizer", sl.length * FP32, sl.length * FP32 + TENSOR_ITEM_OVERHEAD,
                                    (f"{key}.bucket_{sl.bucket}.{s}", (sl.offset,)), (rank,), rank)
    # Param groups, per_bucket_numel, per_bucket_numel_unpadded: one set per dense model-parallel group, and with
    # MoE one per expert group (chained optimizer).
    for stage in range(t.pp):
        for tp in range(t.tp):
            r = dense_rank(t, stage, 0, tp)
            yield WriteItem("optimizer", 0, costs.optim_objects, (f"optimizer.distributed.{stage}.{tp}", ()),
                            (r,), r, tensor=False)
        if any(c.ep >= 0 for c in all_copies) and costs.expert_optim_objects:
            for ep in range(t.ep):
                for etp in range(t.etp_):
                    r = expert_rank(t, stage, 0, ep, etp)
                    yield WriteItem("optimizer", 0, costs.expert_optim_objects,
                                    (f"chained_1.optimizer.distributed.{stage}.{ep}.{etp}", ()), (r,), r, tensor=False)


def _tied(all_copies: list[Copy]) -> bool:
    return any(not c.param.saved for c in all_copies)


def _objects(m: ModelSpec, t: Target, costs: ObjectCosts) -> Iterator[WriteItem]:
    for stage in range(t.pp):
        for tp in range(t.tp):
            for dp in range(t.dp if costs.rng_per_dp else 1):
                r = dense_rank(t, stage, dp, tp)
                yield WriteItem("rng", 0, costs.rng, (f"rng_state/{stage}.{tp}.{dp}", ()), (r,), r, tensor=False)
    if costs.rerun_per_rank:
        for r in range(t.world):
            yield WriteItem("other", 0, costs.rerun, (f"rerun_state_machine_state/{r}", ()), (r,), r, tensor=False)
    else:  # megatron-core <= 0.13: a (PP, TP) grid like the rng state, written by DP rank 0
        for stage in range(t.pp):
            for tp in range(t.tp):
                r = dense_rank(t, stage, 0, tp)
                yield WriteItem("other", 0, costs.rerun, (f"rerun_state_machine_state/{stage}.{tp}", ()), (r,), r,
                                tensor=False)
    experts = max((p.experts for p in m.params), default=0)
    for layer in range(m.num_layers):
        stage, _ = stage_of_layer(t, m.num_layers, layer)
        r = dense_rank(t, stage, 0, 0)
        for k in range(costs.extra_state_modules):
            yield WriteItem("model", 0, costs.extra_state, (f"_extra_state.{k}/{layer}", ()), (r,), r, tensor=False)
        for e in range(experts if costs.expert_extra_state_modules else 0):
            r = expert_rank(t, stage, 0, e // max(experts // t.ep, 1), 0)
            for k in range(costs.expert_extra_state_modules):
                yield WriteItem("model", 0, costs.extra_state, (f"experts._extra_state.{k}/{layer}.{e}", ()), (r,), r,
                                tensor=False)
    for family, size in sorted(costs.others.items()):
        yield WriteItem("other", 0, size, (family, ()), (0,), 0, tensor=False)
