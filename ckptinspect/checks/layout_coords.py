"""Where a coverage gap lies in the parallel layout, so a CK301 names the rank and stage that lost data.

Megatron-Core's sharded keys are global, so the layout has to be read back from the geometry (megatron-core 0.16.1,
checked on the samples in `sample_ckpts/`):
- stacked decoder keys (`decoder.layers.…`, no layer number) have the global layer on axis 0; with PP × VPP the
  layer's model chunk is `layer // (layers / (PP × VPP))`, its PP rank `chunk % PP`, its virtual stage
  `chunk // PP` (`transformer_block.get_transformer_layer_offset`);
- expert keys (`….experts.experts.…`) have the global expert on axis 1: EP rank = `expert // (experts / EP)`
  (`moe/experts.py`: expert offset = ep_rank × local experts);
- DistributedOptimizer buckets (`optimizer.distributed.…`, 1-D) are written per param range by the DP×CP rank that
  owns it: the writer rank of the chunks next to the gap (their `__{rank}_*.distcp` file) names it.
"""

from __future__ import annotations

import re
from typing import Any

from ckptinspect.model import Checkpoint, Tensor

_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp$")


def locate(ckpt: Checkpoint, t: Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Layout coordinates of the region `offsets`/`sizes` of `t` (empty when nothing is known)."""
    out: dict[str, Any] = {}
    topo = ckpt.topology
    stacked = ".layers." in t.key and not re.search(r"\.layers\.\d+\.", t.key) and len(offsets) >= 2
    if stacked:
        layer = offsets[0]
        out["layer"] = layer
        pp, vpp = topo.pp or 1, topo.vpp or 1
        per_chunk = t.shape[0] // (pp * vpp) if t.shape[0] % (pp * vpp) == 0 else 0
        if per_chunk and (pp > 1 or vpp > 1):
            chunk = layer // per_chunk
            out["pp_rank"] = chunk % pp
            if vpp > 1:
                out["virtual_stage"] = chunk // pp
    if ".experts.experts." in t.key and len(offsets) >= 3:
        expert, experts = offsets[1], t.shape[1]
        out["expert"] = expert
        ep = topo.ep or 1
        if ep > 1 and experts % ep == 0:
            out["ep_rank"] = expert // (experts // ep)
    if "optimizer.distributed." in t.key and len(offsets) == 1:
        writers = _neighbour_writers(t, offsets[0], offsets[0] + sizes[0])
        if writers:
            out["writer_ranks"] = writers
    return out


def describe(coords: dict[str, Any]) -> str:
    """`layer 2 (PP rank 0, virtual stage 1), expert 3 (EP rank 1)` style text ('' when nothing is known)."""
    parts = []
    if "layer" in coords:
        stage = [f"PP rank {coords['pp_rank']}"] if "pp_rank" in coords else []
        stage += [f"virtual stage {coords['virtual_stage']}"] if "virtual_stage" in coords else []
        parts.append(f"layer {coords['layer']}" + (f" ({', '.join(stage)})" if stage else ""))
    if "expert" in coords:
        parts.append(f"expert {coords['expert']}" + (f" (EP rank {coords['ep_rank']})" if "ep_rank" in coords else ""))
    if "writer_ranks" in coords:
        w = coords["writer_ranks"]
        parts.append(f"the DP×CP range written by rank {w[0]}" if len(w) == 1 else
                     f"between the DP×CP ranges written by ranks {', '.join(map(str, w))}")
    return ", ".join(parts)


def _neighbour_writers(t: Tensor, lo: int, hi: int) -> list[int]:
    """Save-time ranks that wrote the chunks ending at `lo` and starting at `hi` (sorted, distinct)."""
    ranks: set[int] = set()
    for c in t.chunks:
        if c.storage is None or not c.offsets:
            continue
        start, end = c.offsets[0], c.offsets[0] + c.sizes[0]
        if end == lo or start == hi:
            m = _RANK_FILE.search(c.storage.file)
            if m:
                ranks.add(int(m.group(1)))
    return sorted(ranks)
