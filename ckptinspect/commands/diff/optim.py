"""Optimizer state across DistributedOptimizer formats, for `diff`.

Megatron-Core's DistributedOptimizer saves its state in one of several on-disk formats, chosen by
`--dist-ckpt-optim-fully-reshardable` / the release's default (megatron/core/optimizer/distrib_optimizer.py,
`sharded_state_dict`, the `sharding_type` branches):

- **bucket tensors** (`dp_reshardable`, 0.15+): `optimizer.distributed.dp_group_idx_G.gbuf_idx_B.dtype_(…).
  bucket_idx_K.STATE` — one 1-D tensor per DP group, grad buffer, bucket and state;
- **per-parameter tensors** (`fully_reshardable` 0.16+, and the flattened `fully_sharded_model_space` of ≤0.14 with
  `mcore_data`): `optimizer.state.STATE.PARAM` — one tensor per parameter and state. The main (fp32) parameter is
  `fp32_param` in the ≤0.14 flattened format and `param` since; both name the same tensor;
- **per-DP-group objects** (`dp_zero_gather_scatter`): `optimizer.distributed.dp_group_idx_G.param_state`, a
  ShardedObject, no tensor keys at all.

Two saves of the same model in two formats share no optimizer tensor key. Listing them one row per key (60 rows for
a 2-layer model) hides the one fact that matters: the optimizer format changed. `summarise` turns those keys into
one summary per side and format, which is not blocking: Megatron loads each format by the checkpoint's own
`content_metadata` (`dist_checkpointing.load_content_metadata`), and whether a given release still can is `resume`'s
question. `pair_aliases` matches keys that name the same tensor under both spellings (`fp32_param` ↔ `param`), so
their shapes, layouts and values are compared.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.commands.diff.args import Which
from ckptinspect.model import ObjectItem


class OptimFormat(enum.Enum):
    """A DistributedOptimizer on-disk format, as its keys show it."""

    BUCKETS = "buckets"  # dp_reshardable
    PER_PARAM = "per_param"  # fully_reshardable, fully_sharded_model_space (flattened, ≤0.14)
    DP_GROUP_OBJECTS = "dp_group_objects"  # dp_zero_gather_scatter

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    OptimFormat.BUCKETS: "DistOpt bucket tensors (dp_reshardable)",
    OptimFormat.PER_PARAM: "per-parameter tensors (fully_reshardable / flattened fully_sharded_model_space)",
    OptimFormat.DP_GROUP_OBJECTS: "one param_state object per DP group (dp_zero_gather_scatter)",
}

_PREFIX = r"(?P<chain>chained_\d+\.)?optimizer\."
_BUCKET = re.compile(_PREFIX + r"distributed\.dp_group_idx_(?P<group>\d+)\.gbuf_idx_\d+\.dtype_.*"
                     r"\.bucket_idx_(?P<bucket>\d+)\.(?P<state>[A-Za-z0-9_]+)$")
_PER_PARAM = re.compile(_PREFIX + r"state\.(?P<state>[A-Za-z0-9_]+)\.(?P<param>.+)$")
_DP_OBJECT = re.compile(_PREFIX + r"distributed\.dp_group_idx_(?P<group>\d+)\.param_state$")

# The ≤0.14 flattened format's name for the main parameter, and today's.
_STATE_ALIASES = {"fp32_param": "param"}


def classify(key: str) -> tuple[OptimFormat, str] | None:
    """(format, state name) of an optimizer tensor key; None for any other key."""
    m = _BUCKET.match(key)
    if m:
        return OptimFormat.BUCKETS, m["state"]
    m = _PER_PARAM.match(key)
    if m:
        return OptimFormat.PER_PARAM, m["state"]
    return None


def _canonical(key: str) -> str | None:
    """The per-parameter key with the state spelled as today; None when the key has no other spelling."""
    m = _PER_PARAM.match(key)
    if not m or m["state"] not in _STATE_ALIASES:
        return None
    return f"{m['chain'] or ''}optimizer.state.{_STATE_ALIASES[m['state']]}.{m['param']}"


def pair_aliases(only_a: Iterable[str], only_b: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(key in A, key in B) for keys on one side only that name the same tensor (`fp32_param` ↔ `param`)."""
    set_a, set_b = set(only_a), set(only_b)
    pairs: list[tuple[str, str]] = []
    for ka in sorted(set_a):
        ca = _canonical(ka)
        if ca is not None and ca in set_b:
            pairs.append((ka, ca))
    for kb in sorted(set_b):
        cb = _canonical(kb)
        if cb is not None and cb in set_a and (cb, kb) not in pairs:
            pairs.append((cb, kb))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class OptimSummary:
    """The optimizer tensor keys of one format present on one side only, summarised."""

    side: Which
    format: OptimFormat
    keys: tuple[str, ...]
    states: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"side": self.side.value, "format": self.format.value, "label": self.format.label,
                "count": len(self.keys), "states": list(self.states), "keys": list(self.keys), "blocking": False}


def formats(tensor_keys: Iterable[str], objects: Iterable[ObjectItem]) -> frozenset[OptimFormat]:
    """The optimizer formats a checkpoint's keys show."""
    out = {c[0] for c in map(classify, tensor_keys) if c is not None}
    if any(_DP_OBJECT.match(o.key) or _DP_OBJECT.match(o.family) for o in objects):
        out.add(OptimFormat.DP_GROUP_OBJECTS)
    return frozenset(out)


def summarise(
    only_a: tuple[str, ...], only_b: tuple[str, ...], fmt_a: frozenset[OptimFormat], fmt_b: frozenset[OptimFormat],
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[OptimSummary, ...]]:
    """When both sides carry optimizer state in different formats: (only_a, only_b) without the optimizer keys of the
    formats the other side lacks, and one summary per side and format. Otherwise everything unchanged."""
    if not fmt_a or not fmt_b or fmt_a == fmt_b:
        return only_a, only_b, ()
    summaries: list[OptimSummary] = []
    rest: list[tuple[str, ...]] = []
    for side, keys, mine, other in ((Which.A, only_a, fmt_a, fmt_b), (Which.B, only_b, fmt_b, fmt_a)):
        by_format: dict[OptimFormat, list[tuple[str, str]]] = {}
        kept: list[str] = []
        for k in keys:
            c = classify(k)
            if c is not None and c[0] in mine - other:
                by_format.setdefault(c[0], []).append((k, c[1]))
            else:
                kept.append(k)
        rest.append(tuple(kept))
        for fmt in sorted(by_format, key=lambda f: f.value):
            items = by_format[fmt]
            summaries.append(OptimSummary(side, fmt, tuple(k for k, _ in items), tuple(sorted({s for _, s in items}))))
    return rest[0], rest[1], tuple(summaries)


def describe(fmts: Mapping[str, frozenset[OptimFormat]]) -> str:
    """One line for the notes: which format each side saved its optimizer in."""
    parts = [f"{side} {', '.join(f.label for f in sorted(f_, key=lambda x: x.value)) or 'none'}"
             for side, f_ in fmts.items()]
    return ("optimizer state saved in different DistributedOptimizer formats (" + "; ".join(parts) +
            "): its keys are summarised per format, not compared one by one; Megatron loads each format by the "
            "checkpoint's content_metadata, see `resume` for what a given release accepts")
