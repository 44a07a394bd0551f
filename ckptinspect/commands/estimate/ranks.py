"""Rank arithmetic of Megatron's default process-group order, and the layer → pipeline stage map.

Megatron-Core's `RankGenerator` with the default order ``tp-cp-ep-dp-pp`` numbers ranks with TP fastest:
``rank = tp + TP·(cp + CP·(dp + DP·pp))`` for the dense grid. Expert layers use a second decomposition of the same
ranks, ``etp-ep-dp-pp``: ``rank = etp + ETP·(ep + EP·(edp + EDP·pp))`` with ETP·EP·EDP = TP·CP·DP
(`core/parallel_state.py`, `RankGenerator`). The legacy and sample-checkpoint file names (`__{rank}_{i}.distcp`,
`mp_rank_TT_PPP`) use these numbers.
"""

from __future__ import annotations

from ckptinspect.commands.estimate.spec import Target


def dense_rank(t: Target, pp: int, dp: int, tp: int, cp: int = 0) -> int:
    return tp + t.tp * (cp + t.cp * (dp + t.dp * pp))


def expert_rank(t: Target, pp: int, edp: int, ep: int, etp: int) -> int:
    return etp + t.etp_ * (ep + t.ep * (edp + t.edp * pp))


def dense_coords(t: Target, rank: int) -> tuple[int, int, int, int]:
    """(pp, dp, tp, cp) of `rank`."""
    tp = rank % t.tp
    rest = rank // t.tp
    cp = rest % t.cp
    rest //= t.cp
    return rest // t.dp, rest % t.dp, tp, cp


def dp_group(t: Target, rank: int) -> tuple[int, ...]:
    """The data-parallel group (with context parallel, as Megatron's fully parallel save uses) holding `rank`."""
    pp, _, tp, _ = dense_coords(t, rank)
    return tuple(dense_rank(t, pp, d, tp, c) for d in range(t.dp) for c in range(t.cp))


def stage_of_layer(t: Target, num_layers: int, layer: int) -> tuple[int, int]:
    """(pipeline stage, virtual model chunk) holding global `layer` for an even split.

    Without VPP stage s holds layers [s·L/PP, (s+1)·L/PP). With VPP v the layers are cut into PP·v equal pieces and
    piece c goes to stage c mod PP as model chunk c div PP (Megatron's interleaved schedule,
    `get_transformer_layer_offset`). Layer counts that do not divide evenly put the remainder on the last pieces.
    """
    pieces = max(t.pp * t.vpp, 1)
    per = max(num_layers // pieces, 1)
    piece = min(layer // per, pieces - 1)
    return piece % t.pp, piece // t.pp


def node_of(t: Target, rank: int) -> int:
    return rank // max(t.gpus_per_node, 1)
