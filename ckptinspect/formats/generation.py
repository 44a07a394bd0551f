"""Which Megatron-Core release family wrote a `torch_dist` / `zarr` checkpoint, and the evidence.

Each rule is an on-disk fact checked against real saves of that release (sample_ckpts/mcore_*):
- zarr backend (`metadata.json` `sharded_backend: "zarr"`): ≤0.15 (removed in 0.16, PR #2944).
- `.metadata` root class `MCoreMetadata`: 0.15 (0.16+ keeps only a dummy class for unpickling).
- `mcore_data` (N-D reformulated, flattened DistOpt state; `ShardedTensor.flattened_range`): 0.8–0.15 (flattened
  writing removed in 0.16, PR #2126). The `content_metadata` keys `singleton_local_shards` /
  `chained_optim_avoid_prefix` appear in 0.14, so without them (or without content metadata) it is 0.8–0.13.
- `MCoreSavePlan` plans without `MCoreMetadata`: 0.11–0.14.
- `common.pt` with a torch-only `.metadata`: 0.16–0.18. The `common_state/shard_0_1` item instead: ≥0.19.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.formats.dcp.metadata import DcpMetadata

COMMON_PT = "common.pt"
COMMON_STATE_KEY = "common_state/shard_0_1"
_V014_KEYS = ("singleton_local_shards", "chained_optim_avoid_prefix")

GEN_ZARR = "megatron-core<=0.15 (zarr backend)"
GEN_FLAT_013 = "megatron-core 0.8-0.13 (flattened DistOpt, mcore_data)"
GEN_FLAT_014 = "megatron-core 0.14-0.15 (flattened DistOpt, mcore_data)"
GEN_015 = "megatron-core 0.15 (MCoreMetadata)"
GEN_011_014 = "megatron-core 0.11-0.14 (MCoreSavePlan)"
GEN_013 = "megatron-core 0.13 (MCoreSavePlan, content_metadata)"
GEN_014 = "megatron-core 0.14 (MCoreSavePlan, 0.14 content_metadata)"
GEN_016_018 = "megatron-core 0.16-0.18 (common.pt)"
GEN_019 = "megatron-core>=0.19 (common_state item)"


@dataclass(frozen=True, slots=True)
class Generation:
    """The release family (`label`, None when nothing tells) and the facts that decided it."""

    label: str | None
    evidence: tuple[str, ...]


def megatron_generation(
    config: Mapping[str, Any] | None,
    common_source: str | None,
    md: DcpMetadata | None,
    common: Mapping[str, Any] | None,
) -> Generation:
    """Name the generation from `metadata.json`, where the common state lives, `.metadata` and the common state."""
    ev: list[str] = []
    if config is not None and config.get("sharded_backend") == "zarr":
        return Generation(GEN_ZARR, ('metadata.json sharded_backend "zarr" (removed in megatron-core 0.16)',))
    cm = common.get("content_metadata") if isinstance(common, Mapping) else None
    has_014_keys = isinstance(cm, Mapping) and any(k in cm for k in _V014_KEYS)
    mcore_root = md is not None and md.root_class.endswith("MCoreMetadata")
    save_plans = md is not None and any(g.endswith("MCoreSavePlan") for g in md.report.globals)
    if md is not None and md.mcore_data:
        ev.append(f".metadata mcore_data: {len(md.mcore_data)} N-D reformulated (flattened) DistOpt tensors")
        if mcore_root:
            ev.append(".metadata root class MCoreMetadata (0.15)")
        if has_014_keys or mcore_root:
            if has_014_keys:
                ev.append("content_metadata has singleton_local_shards / chained_optim_avoid_prefix (0.14+)")
            return Generation(GEN_FLAT_014, tuple(ev))
        ev.append("content_metadata " + ("without the 0.14 keys" if isinstance(cm, Mapping) else "absent"))
        return Generation(GEN_FLAT_013, tuple(ev))
    if mcore_root:
        return Generation(GEN_015, (".metadata root class MCoreMetadata",))
    if save_plans:
        ev = [".metadata all_local_plans are MCoreSavePlan (0.11-0.15)"]
        if has_014_keys:
            ev.append("content_metadata has singleton_local_shards / chained_optim_avoid_prefix (0.14+)")
            return Generation(GEN_014, tuple(ev))
        if isinstance(cm, Mapping):
            ev.append("content_metadata without the 0.14 keys (content_metadata is new in 0.13)")
            return Generation(GEN_013, tuple(ev))
        return Generation(GEN_011_014, tuple(ev))
    if common_source == COMMON_PT and md is not None:
        return Generation(GEN_016_018, ("common.pt present; .metadata holds torch classes only",))
    if common_source == COMMON_PT:
        return Generation("megatron-core<=0.18 (common.pt)", ("common.pt present (.metadata not read)",))
    if common_source == COMMON_STATE_KEY:
        return Generation(GEN_019, (f"{COMMON_STATE_KEY} item instead of common.pt",))
    if config is not None:
        if "common_backend" in config:
            return Generation("megatron-core<=0.18", ("4-key metadata.json (common_backend)",))
        return Generation("megatron-core>=0.19", ("2-key metadata.json",))
    return Generation(None, ())
