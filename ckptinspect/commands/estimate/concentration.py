"""CK801: the weights of a torch_dist checkpoint were written by DP rank 0 alone, which a fully parallel save spreads.

Megatron-Core saves each weight chunk from its main replica. Without `FullyParallelSaveStrategyWrapper`
(`--no-ckpt-fully-parallel-save`) the main replica is DP rank 0 of every (tp, pp) group, so those ranks write all
of their shard's weights while the other DP ranks write none (the design notes: "each (tp,pp) shard's weights,
deduplicated over DP=64, are spread so each rank writes 1/64"). From the bytes each rank actually wrote (`audit`'s
summary) this finds that concentration and, with the same arithmetic as `estimate`, says how much lighter the
heaviest rank would be with the flag on. Info only: the checkpoint is fine, the save was slower than it had to be.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

from ckptinspect.findings import Finding
from ckptinspect.model import Checkpoint, Format

CODE = "CK801"
FLAG = "--ckpt-fully-parallel-save"
# Share of the weight bytes DP×CP rank 0 must have written to call it a concentration. The fully parallel greedy
# gives DP rank 0 about 1/DP of them (it also balances against the optimizer slices, so a little more or less).
THRESHOLD = 0.99


def writer_concentration(ckpt: Checkpoint, by_rank: Mapping[int, Mapping[str, int]]) -> Iterator[Finding]:
    """CK801 when DP rank 0 wrote (nearly) all weight bytes of a torch_dist checkpoint saved with DP×CP > 1."""
    if ckpt.format is not Format.TORCH_DIST or not by_rank:
        return
    from ckptinspect.commands.estimate.from_ckpt import costs_from, model_from, options_from, target_from
    from ckptinspect.commands.estimate.ranks import dense_coords
    from ckptinspect.commands.estimate.result import estimate_model

    t = target_from(ckpt)
    if t.dp * t.cp < 2 or t.world != (ckpt.topology.world_size or t.world):
        return
    total = sum(c.get("model", 0) for c in by_rank.values())
    first = sum(c.get("model", 0) for r, c in by_rank.items() if r < t.world and dense_coords(t, r)[1::2] == (0, 0))
    if total <= 0 or first < THRESHOLD * total:
        return
    model = model_from(ckpt)
    if not model.params:
        return
    opts = options_from(ckpt)
    costs = costs_from(ckpt, t, model.num_layers)
    spread = estimate_model(model, t, replace(opts, fully_parallel=True), costs=costs)
    measured_max = max(sum(c.values()) for c in by_rank.values())
    predicted_model_max = max((c.get("model", 0) for c in spread.chosen.by_rank.values()), default=0)
    measured_model_max = max(c.get("model", 0) for c in by_rank.values())
    if predicted_model_max >= measured_model_max:
        return  # nothing to move (e.g. every weight is TP-replicated and tiny)
    yield Finding(
        CODE,
        f"DP rank 0 wrote {first / total:.0%} of the weight bytes (the heaviest rank wrote {measured_model_max:,} B of"
        f" weights, {measured_max:,} B in all); a fully parallel save would spread the weights over the DP group"
        f" (heaviest rank about {predicted_model_max:,} B of weights, {spread.chosen.max:,} B in all): save with"
        f" {FLAG} (Megatron's default; drop --no-ckpt-fully-parallel-save)",
        details={"dp_rank0_weight_share": first / total, "measured_max_rank_bytes": measured_max,
                 "measured_max_rank_weight_bytes": measured_model_max,
                 "fully_parallel_max_rank_bytes": spread.chosen.max,
                 "fully_parallel_max_rank_weight_bytes": predicted_model_max, "flag": FLAG},
    )
