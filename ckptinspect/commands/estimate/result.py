"""The result of `estimate`: sizes by component, bytes per rank, files, stall seconds, host memory; and the two entry
points that build it (`estimate_params` for the quick form, `estimate_model` for the exact one).

Units: every byte count is an exact integer number of bytes; renderers print decimal units (1 GB = 10^9 bytes,
1 MB = 10^6 bytes), the convention of the design notes and of storage vendors. Seconds are plain floats.

Stall model (design notes, "numbers for a 7.5B configuration"):
- legacy sync: the heaviest writer serializes its whole shard through one stream: max writer bytes / `write`;
- torch_dist sync: all ranks write in parallel: max(total bytes / `aggregate`, heaviest rank / `write`);
- torch_dist async: training only waits for planning + the device-to-host copy: heaviest rank / `d2h`;
- async host memory: the D2H copies stay in host memory until the write finalizes: per node, the sum of its ranks'
  bytes (ranks are packed `gpus_per_node` to a node in rank order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptinspect.commands.estimate.items import FP32, saved_states, torch_dist_items
from ckptinspect.commands.estimate.quick import quick_legacy, quick_torch_dist
from ckptinspect.commands.estimate.ranks import node_of
from ckptinspect.commands.estimate.spec import (
    Bandwidths,
    ModelSpec,
    ObjectCosts,
    SaveFormat,
    SaveOptions,
    Target,
)
from ckptinspect.commands.estimate.volumes import COMPONENTS, assign, legacy_by_rank
from ckptinspect.model import dtype_size, frozen

UNITS = "decimal: 1 kB = 10^3 B, 1 MB = 10^6 B, 1 GB = 10^9 B; bandwidths in decimal bytes per second"


@dataclass(frozen=True, slots=True)
class Volume:
    """Bytes written per rank by one way of saving.

    fmt: ``torch_dist`` or ``torch``; fully_parallel: None for legacy.
    by_rank: component bytes of every rank that writes something (a rank absent writes nothing).
    world: ranks in the job. files: data files written (plus the metadata files, see `Estimate.files`).
    """

    fmt: SaveFormat
    fully_parallel: bool | None
    by_rank: Mapping[int, Mapping[str, int]]
    world: int
    files: int

    def __post_init__(self) -> None:
        # Read-only without a copy: a million-rank job has a million rows (copying each costs seconds).
        if not isinstance(self.by_rank, MappingProxyType):
            object.__setattr__(self, "by_rank", MappingProxyType(self.by_rank))

    def total(self, rank: int) -> int:
        return sum(self.by_rank.get(rank, {}).values())

    @property
    def totals(self) -> list[int]:
        return [self.total(r) for r in range(self.world)]

    @property
    def bytes(self) -> int:
        return sum(sum(c.values()) for c in self.by_rank.values())

    @property
    def max(self) -> int:
        return max(self.totals, default=0)

    @property
    def min(self) -> int:
        return min(self.totals, default=0)

    @property
    def mean(self) -> float:
        return self.bytes / self.world if self.world else 0.0

    @property
    def writers(self) -> int:
        return sum(1 for v in self.totals if v > 0)

    def heaviest(self, n: int = 5) -> list[int]:
        """The `n` ranks writing the most (ties by rank)."""
        return sorted(range(self.world), key=lambda r: (-self.total(r), r))[:n]

    def to_dict(self, n: int = 5) -> dict[str, Any]:
        top = self.heaviest(n)
        return {
            "format": self.fmt.value, "fully_parallel": self.fully_parallel, "bytes": self.bytes,
            "max": self.max, "mean": self.mean, "min": self.min, "writers": self.writers, "files": self.files,
            "max_rank": _rank_dict(self, top[0]) if top else None,
            "heaviest": [_rank_dict(self, r) for r in top],
        }


def _rank_dict(v: Volume, r: int) -> dict[str, Any]:
    return {"rank": r, "bytes": v.total(r), **v.by_rank.get(r, dict.fromkeys(COMPONENTS, 0))}


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a save costs.

    components: logical size of one checkpoint (one copy of everything): model, fp32_master, optimizer_moments,
        rng_args_scheduler.
    chosen: the save as configured; torch_dist / legacy: both formats for the comparison.
    concentration: legacy's heaviest writer / torch_dist's heaviest rank.
    stall_seconds: legacy_sync, torch_dist_sync, torch_dist_async (the torch_dist figures use `torch_dist`), and
        configured: the one of the save as configured (`--format`, `--async`).
    host_memory_per_node: async save, bytes held in host memory on the busiest node while the write runs.
    """

    source: str
    params: int
    param_dtype: str
    target: Target
    options: SaveOptions
    bandwidths: Bandwidths
    costs: ObjectCosts
    components: Mapping[str, int]
    chosen: Volume
    torch_dist: Volume
    legacy: Volume
    concentration: float
    stall_seconds: Mapping[str, float | None]
    host_memory_per_node: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", frozen(self.components))
        object.__setattr__(self, "stall_seconds", frozen(self.stall_seconds))

    @property
    def files(self) -> int:
        """Files of the chosen save: data files + `.metadata`, `metadata.json`, `common.pt` (torch_dist) or the
        tracker-free legacy shard files."""
        return self.chosen.files + (3 if self.chosen.fmt is SaveFormat.TORCH_DIST else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "units": UNITS,
            "model": {"source": self.source, "params": self.params, "dtype": self.param_dtype},
            "target": self.target.to_dict(), "options": self.options.to_dict(),
            "assumptions": {**self.bandwidths.to_dict(), "rng_object_bytes": self.costs.rng,
                            "rerun_object_bytes": self.costs.rerun, "common_state_bytes": self.costs.common},
            "totals": {**self.components, "total": sum(self.components.values())},
            "per_rank": self.chosen.to_dict(), "files": self.files,
            "torch_dist": self.torch_dist.to_dict(), "legacy": self.legacy.to_dict(),
            "writer_concentration": self.concentration,
            "stall_seconds": dict(self.stall_seconds),
            "async_host_memory_per_node": self.host_memory_per_node,
            "by_rank": {str(r): {"bytes": self.chosen.total(r), **c} for r, c in sorted(self.chosen.by_rank.items())},
            "notes": list(self.notes),
        }


def _components(params: int, dtype: str, o: SaveOptions, t: Target, costs: ObjectCosts) -> dict[str, int]:
    states = saved_states(o, dtype)
    master = "param" in states
    return {
        "model": params * (dtype_size(dtype) or 2),
        "fp32_master": params * FP32 if master else 0,
        "optimizer_moments": params * FP32 * (len(states) - int(master)),
        "rng_args_scheduler": costs.rng * t.pp * t.tp * (t.dp if costs.rng_per_dp else 1)
        + costs.rerun * (t.world if costs.rerun_per_rank else t.pp * t.tp) + costs.common,
    }


def _finish(source: str, params: int, dtype: str, t: Target, o: SaveOptions, bw: Bandwidths, costs: ObjectCosts,
            td: Volume, legacy: Volume, notes: list[str]) -> Estimate:
    chosen = legacy if o.format is SaveFormat.TORCH else td
    node_bytes: dict[int, int] = {}
    for r in range(t.world):
        node_bytes[node_of(t, r)] = node_bytes.get(node_of(t, r), 0) + td.total(r)
    stalls: dict[str, float | None] = {
        "legacy_sync": legacy.max / bw.write,
        "torch_dist_sync": max(td.bytes / bw.aggregate, td.max / bw.write),
        "torch_dist_async": td.max / bw.d2h,
    }
    # The stall of the save as configured (legacy has no async path: Megatron raises, so it counts as sync).
    if o.format is SaveFormat.TORCH:
        stalls["configured"] = stalls["legacy_sync"]
    else:
        stalls["configured"] = stalls["torch_dist_async" if o.async_save else "torch_dist_sync"]
    notes = [f"units: {UNITS}", "legacy (--ckpt-format torch) cannot save asynchronously (Megatron raises)",
             *notes]
    return Estimate(source, params, dtype, t, o, bw, costs, _components(params, dtype, o, t, costs), chosen, td,
                    legacy, legacy.max / td.max if td.max else 0.0, stalls, max(node_bytes.values(), default=0),
                    tuple(notes))


def estimate_params(params: int, dtype: str, t: Target, o: SaveOptions, bw: Bandwidths | None = None,
                    costs: ObjectCosts | None = None) -> Estimate:
    """The quick form: a model known only by its parameter count (see `quick`)."""
    bw, costs = bw or Bandwidths(), costs or ObjectCosts()
    td = Volume(SaveFormat.TORCH_DIST, o.fully_parallel, quick_torch_dist(params, dtype, t, o, costs, o.fully_parallel),
                t.world, t.world * o.files_per_rank)
    by_rank, files = quick_legacy(params, dtype, t, o, costs)
    legacy = Volume(SaveFormat.TORCH, None, by_rank, t.world, files)
    return _finish("params", params, dtype, t, o, bw, costs, td, legacy,
                   ["quick form: parameters spread evenly over TP x PP domains, per-item overhead not counted"])


def estimate_model(m: ModelSpec, t: Target, o: SaveOptions, bw: Bandwidths | None = None,
                   costs: ObjectCosts | None = None) -> Estimate:
    """The exact form: every tensor placed the way Megatron-Core lays it out (see `items`, `volumes`)."""
    bw, costs = bw or Bandwidths(), costs or ObjectCosts()
    by_rank, counts = assign(torch_dist_items(m, t, o, costs), t, o.fully_parallel)
    files = sum(min(o.files_per_rank, n) for n in counts.values() if n)
    td = Volume(SaveFormat.TORCH_DIST, o.fully_parallel, by_rank, t.world, files)
    lby, lfiles = legacy_by_rank(m, t, o, costs)
    legacy = Volume(SaveFormat.TORCH, None, lby, t.world, lfiles)
    return _finish(m.source, m.total_params, m.param_dtype, t, o, bw, costs, td, legacy,
                   ["legacy volumes are tensor payload plus object sizes: the per-tensor torch.save archive records "
                    "are not counted (a few hundred bytes per tensor)"])
