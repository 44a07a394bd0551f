"""Topology (TP/PP/DP/CP/EP/ETP/VPP/world size) from args, cross-checked with what the files show.

On-disk witnesses (reference §5.2): the `rng_state/shard_{pp}.{tp}_{PP}.{TP}` grid gives PP and TP (with EP > 1
Megatron-LM's `get_rng_state` writes a (PP, TP, DP×CP) grid instead), the length of Megatron's `all_local_plans`
and the `rerun_state_machine_state/shard_{r}_{W}` grid give the save-time world size; legacy `model0..N` keys give
the virtual pipeline size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ckptinspect.formats.args_values import arg_int
from ckptinspect.formats.dcp.metadata import DcpMetadata
from ckptinspect.model import Tensor, Topology

EXPERT_TP_SOURCE = "expert linear_fc2 chunk layout"


def layout_from_metadata(md: DcpMetadata | None) -> dict[str, int]:
    """What the `.metadata` itself says about the layout: rng grid (pp, tp), world size witnesses."""
    out: dict[str, int] = {}
    if md is None:
        return out
    for o in md.objects:
        if o.grid is None:
            continue
        if o.family.endswith("rng_state") and len(o.grid) == 2 and "rng_pp" not in out:
            out["rng_pp"], out["rng_tp"] = o.grid
        elif o.family.endswith("rng_state") and len(o.grid) == 3 and "rng_pp" not in out:
            # EP > 1: Megatron-LM get_rng_state shards rng by (PP, TP, DP x CP), replica 0
            out["rng_pp"], out["rng_tp"], out["rng_dpcp"] = o.grid
        elif o.family.endswith("rerun_state_machine_state") and len(o.grid) == 1 and "rerun_world" not in out:
            out["rerun_world"] = o.grid[0]
    if md.rank_items:
        out["plans_world"] = len(md.rank_items)
    etp = expert_tp_from_chunks(md.tensors)
    if etp is not None:
        out["expert_tp"] = etp
    return out


def expert_tp_from_chunks(tensors: Iterable[Tensor]) -> int | None:
    """The expert tensor-parallel size the expert weights' chunks show, or None when no expert weight shows it.

    Megatron-Core's expert `linear_fc2` is row-parallel over the expert-TP group: its ShardedTensor
    (`…experts….linear_fc2.weight`, global `(layers, experts, hidden, ffn)` with the layer / expert axes prepended)
    is cut along its last axis into ETP pieces, one per expert-TP rank; EP cuts the expert axis only. So the
    number of distinct offsets along the last axis is ETP (1 when the experts are not TP-split, whatever TP is).
    Every such tensor must agree and tile its last axis evenly, else None (no claim).
    """
    found: set[int] = set()
    for t in tensors:
        if t.key.startswith("optimizer.") or ".experts." not in t.key or not t.key.endswith("linear_fc2.weight"):
            continue
        if len(t.shape) < 3 or not t.chunks or not t.shape[-1]:
            continue
        offsets = {c.offsets[-1] for c in t.chunks}
        sizes = {c.sizes[-1] for c in t.chunks}
        if len(sizes) != 1 or t.shape[-1] != len(offsets) * next(iter(sizes)):
            return None
        found.add(len(offsets))
    return found.pop() if len(found) == 1 else None


def topology_from(
    args: Mapping[str, Any] | None, md: DcpMetadata | None, shard_grid: Mapping[str, int] | None = None
) -> tuple[Topology, dict[str, int]]:
    """Topology from args, falling back to on-disk witnesses; also returns the witnesses (`layout`)."""
    layout = layout_from_metadata(md)
    if shard_grid:
        layout.update(shard_grid)
    sources: dict[str, str] = {}
    tp = arg_int(args, "tensor_model_parallel_size", "model_parallel_size")
    pp = arg_int(args, "pipeline_model_parallel_size")
    ep = arg_int(args, "expert_model_parallel_size")
    world = arg_int(args, "world_size")
    dp = arg_int(args, "data_parallel_size")
    cp = arg_int(args, "context_parallel_size") or 1
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("world_size", world), ("dp", dp)):
        if value is not None:
            sources[name] = "args"
    if tp is None and "rng_tp" in layout:
        tp, sources["tp"] = layout["rng_tp"], "rng_state grid"
    if pp is None and "rng_pp" in layout:
        pp, sources["pp"] = layout["rng_pp"], "rng_state grid"
    if tp is None and "shard_tp" in layout:
        tp, sources["tp"] = layout["shard_tp"], "mp_rank_* dirs"
    if pp is None and "shard_pp" in layout:
        pp, sources["pp"] = layout["shard_pp"], "mp_rank_* dirs"
    if ep is None and layout.get("shard_ep", 1) > 1:
        ep, sources["ep"] = layout["shard_ep"], "mp_rank_* dirs"
    if world is None:
        for key, src in (("plans_world", "all_local_plans"), ("rerun_world", "rerun_state_machine_state grid")):
            if key in layout:
                world, sources["world_size"] = layout[key], src
                break
    if dp is None and world and tp and pp and world % (tp * pp * cp) == 0:
        dp, sources["dp"] = world // (tp * pp * cp), "world_size / (tp * pp * cp)"
    if world is None and dp and tp and pp:
        world, sources["world_size"] = dp * tp * pp * cp, "tp * pp * dp * cp"
    if dp is None and "rng_dpcp" in layout and layout["rng_dpcp"] % cp == 0:
        dp, sources["dp"] = layout["rng_dpcp"] // cp, "rng_state grid (PP, TP, DP×CP)"
    if ep is None and "rng_dpcp" in layout:
        sources["ep"] = "rng_state grid (PP, TP, DP×CP): EP > 1, size unknown"
    elif ep is None and (tp or pp):
        ep = 1
        sources["ep"] = "default"
    cp_out, etp, vpp = _layout_extras(args, layout, tp, sources)
    return Topology(tp, pp, dp, ep, world, sources, cp_out, etp, vpp), layout


def _layout_extras(args: Mapping[str, Any] | None, layout: Mapping[str, int], tp: int | None,
                   sources: dict[str, str]) -> tuple[int | None, int | None, int | None]:
    """CP, expert-TP and VPP: args first; VPP also from the legacy `model0..N` keys; defaults only with args."""
    cp = arg_int(args, "context_parallel_size")
    if cp is not None:
        sources["cp"] = "args"
    elif args:
        cp, sources["cp"] = 1, "default"
    experts = arg_int(args, "num_experts", "num_moe_experts")
    etp = arg_int(args, "expert_tensor_parallel_size")
    on_disk = layout.get("expert_tp")
    if on_disk is not None and on_disk != etp:
        # args silent (Megatron's default would say ETP = TP) or contradicted by the expert weights' chunks: the
        # chunks are what a load reshards from
        said = f"; args say {etp}" if etp is not None else (f"; args silent, Megatron's default would be TP = {tp}"
                                                             if tp else "")
        etp, sources["etp"] = on_disk, f"{EXPERT_TP_SOURCE}{said}"
    elif etp is not None and (experts or on_disk is not None):
        sources["etp"] = "args"
    elif experts and tp:
        etp, sources["etp"] = tp, "default (= TP)"  # Megatron-LM validate_args
    else:
        etp = None
    vpp = arg_int(args, "virtual_pipeline_model_parallel_size")
    chunks = layout.get("model_chunks")
    if vpp is not None:
        sources["vpp"] = "args"
    elif chunks:
        vpp, sources["vpp"] = chunks, "model0..N keys" if chunks > 1 else "model key"
    elif args:
        vpp, sources["vpp"] = 1, "default"
    return cp, etp, vpp
