"""The value rules: findings CK901-CK911 from the scanned statistics of every tensor (`TensorFacts`), pure.

What a tensor is, from its key (every naming the readers produce):
- a *moment*: Adam's ``exp_avg`` / ``exp_avg_sq`` — a key segment (split at ``.`` / ``/``) of that name: Megatron's
  per-parameter ``optimizer.state.exp_avg.NAME`` and bucket ``...bucket_idx_0.exp_avg``, a DCP optimizer state dict's
  ``optimizer.state.NAME.exp_avg``, legacy ``distrib_optim.0.(...).exp_avg``;
- a *weight*: a model-component tensor (`model.components`), or an optimizer's fp32 main copy (segment ``param``);
- a *matrix*: a weight of rank >= 2 whose last key segment names neither a bias nor a norm (Megatron stacks layers,
  so a ``decoder.layers.mlp.linear_fc1.bias`` is ``[layers, hidden]``: rank alone cannot tell; biases start at zero).

Subnormals (CK903) are judged in float32, bfloat16 and float64 only, where they lie below 1.2e-38 and no trained
weight holds more than a stray one; float16 (below 6.1e-5) and float8 weights hold many in normal use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptinspect.findings import CODES, Finding
from ckptinspect.services.values_stats import ValueStats

SUBNORMAL_FRACTION = 1e-3
_SUBNORMAL_DTYPES = frozenset({"float32", "bfloat16", "float64"})
_FLOATS = frozenset({"float32", "bfloat16", "float64", "float16", "float8_e4m3fn", "float8_e5m2"})
_SEGMENT = re.compile(r"[./]")
MOMENTS = ("exp_avg", "exp_avg_sq")
_NOT_MATRIX = re.compile(r"bias|norm|_extra_state", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class TensorFacts:
    """What the rules read of one tensor's scan (see `report.TensorScan`)."""

    key: str
    shard: str | None
    dtype: str
    shape: tuple[int, ...]
    component: str
    stats: ValueStats
    complete: bool
    places: Mapping[str, Any]  # kind -> Place
    errors: tuple[tuple[str, str], ...]
    unsupported: str | None
    zero_layers: tuple[int, ...] = ()  # Megatron stacked tensors: layers zero throughout (`layers.py`)

    @property
    def label(self) -> str:
        return f"{self.shard}/{self.key}" if self.shard else self.key


def segments(key: str) -> list[str]:
    return _SEGMENT.split(key)


def moment_of(key: str) -> str | None:
    """``exp_avg`` / ``exp_avg_sq`` when `key` is an Adam moment, else None."""
    segs = segments(key)
    for m in ("exp_avg_sq", "exp_avg"):
        if m in segs:
            return m
    return None


def role(t: TensorFacts) -> str | None:
    """``weight``, ``moment``, ``optimizer state`` or None (rng, counters, other state: not judged)."""
    if moment_of(t.key):
        return "moment"
    if t.component == "model":
        return "weight"
    if t.component == "optimizer":
        return "weight" if "param" in segments(t.key) else "optimizer state"
    return None


def _where(t: TensorFacts, kind: str) -> tuple[str, dict[str, Any]]:
    p = t.places.get(kind)
    if p is None:
        return "", {}
    return (f"; the first at {list(p.index)} (chunk at {list(p.chunk)}, {p.file} byte {p.byte_offset})",
            {"first": p.to_dict()})


def _f(code: str, t: TensorFacts, path: str, message: str, **details: Any) -> Finding:
    return Finding(code, message, t.label, path, {"tensor": t.key, **({"shard": t.shard} if t.shard else {}),
                                                   "dtype": t.dtype, "shape": list(t.shape), **details})


def value_findings(tensors: Sequence[TensorFacts], path: str, partial: bool = False) -> list[Finding]:
    """Every value finding of a checkpoint's scanned tensors. `partial`: a `--shard` slice (no whole-tensor rules:
    all-zero needs every element, a missing moment every key — those are judged once the slices are merged)."""
    out: list[Finding] = []
    for t in tensors:
        out.extend(_tensor_findings(t, path, partial))
    out.extend(cause_findings(tensors, path))
    if not partial:
        out.extend(missing_state(tensors, path))
    return out


def cause_findings(tensors: Sequence[TensorFacts], path: str) -> list[Finding]:
    """What made chunks unreadable, as the container finding it is (CK202 an item past the end of its file, CK201
    a missing file, CK206 a broken archive, ...), once per distinct cause: CK908 says a tensor's values are partial,
    these give the status (a truncated checkpoint is `corrupt` to `values` as to `audit`)."""
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for t in tensors:
        for code, msg in t.errors:
            info = CODES.get(code)
            if info is None or info.status is None or (code, msg) in seen:
                continue
            seen.add((code, msg))
            out.append(Finding(code, msg, t.label, path, {"tensor": t.key, "found_by": "values"}))
    return out


def _tensor_findings(t: TensorFacts, path: str, partial: bool) -> list[Finding]:
    out: list[Finding] = []
    s = t.stats
    r = role(t)
    what = {"weight": "model weight", "moment": "optimizer moment", "optimizer state": "optimizer state"}.get(r or "")
    if t.unsupported:
        return [_f("CK909", t, path, f"{t.label}: {t.unsupported}; not scanned")]
    if t.errors:
        code, msg = t.errors[0]
        more = f" (and {len(t.errors) - 1} more chunk(s))" if len(t.errors) > 1 else ""
        out.append(_f("CK908", t, path, f"{t.label}: values not read: {msg}{more}", cause=code,
                      chunks_unread=len(t.errors)))
    if r is None or t.dtype not in _FLOATS:
        return out
    if s.nan:
        where, d = _where(t, "nan")
        out.append(_f("CK901", t, path, f"{s.nan} NaN among {s.count} elements of {what} {t.label}{where}",
                      nan=s.nan, elements=s.count, **d))
    if s.posinf or s.neginf:
        where, d = _where(t, "inf")
        out.append(_f("CK902", t, path, f"{s.posinf} +Inf and {s.neginf} -Inf among {s.count} elements of {what} "
                      f"{t.label}{where}", posinf=s.posinf, neginf=s.neginf, elements=s.count, **d))
    if r == "weight" and t.dtype in _SUBNORMAL_DTYPES and s.subnormal > s.count * SUBNORMAL_FRACTION:
        where, d = _where(t, "subnormal")
        out.append(_f("CK903", t, path, f"{s.subnormal} subnormal values (below 1.2e-38) among {s.count} elements of "
                      f"{what} {t.label}{where}", subnormal=s.subnormal, elements=s.count, **d))
    if moment_of(t.key) == "exp_avg_sq" and s.min is not None and s.min < 0:
        where, d = _where(t, "negative")
        out.append(_f("CK904", t, path, f"Adam second moment {t.label} is negative (min {s.min!r}): a square cannot "
                      f"be{where}", min=s.min, **d))
    whole = t.complete and not partial and s.count > 0 and s.zeros == s.count
    if whole and r == "weight" and is_matrix(t):
        out.append(_f("CK905", t, path, f"model weight {t.label} {list(t.shape)} is zero throughout",
                      elements=s.count))
    if whole and r == "moment":
        out.append(_f("CK906", t, path, f"optimizer moment {t.label} {list(t.shape)} is zero throughout: reset or "
                      "never saved", elements=s.count))
    if t.zero_layers and t.complete and not partial and not whole:
        layers = list(t.zero_layers)
        if r == "weight" and is_matrix(TensorFacts(t.key, t.shard, t.dtype, t.shape[1:], t.component, s, True, {},
                                                   (), None)):
            out.append(_f("CK905", t, path, f"layer slice(s) {layers} of model weight {t.label} {list(t.shape)} "
                          "(Megatron's stacked layers, axis 0) are zero throughout", layers=layers))
        elif r == "moment":
            out.append(_f("CK906", t, path, f"layer slice(s) {layers} of optimizer moment {t.label} "
                          f"{list(t.shape)} (stacked layers, axis 0) are zero throughout: reset or never saved",
                          layers=layers))
    return out


def is_matrix(t: TensorFacts) -> bool:
    last = segments(t.key)[-1]
    return len(t.shape) >= 2 and all(d >= 2 for d in t.shape[-2:]) and not _NOT_MATRIX.search(last)


# --- CK910: a parameter without the state its optimizer format holds for the others -------------------------------

_PER_PARAM = re.compile(r"^optimizer\.state\.(param|exp_avg|exp_avg_sq)\.(.+)$")  # Megatron per-parameter
_DCP_STATE = re.compile(r"^optim(?:izer)?\.state\.(.+)\.(exp_avg|exp_avg_sq)$")  # a torch optimizer state dict
_BUCKET = re.compile(r"^(.*\.bucket_idx_\d+)\.(param|exp_avg|exp_avg_sq)$")  # Megatron DistOpt buckets


def missing_state(tensors: Sequence[TensorFacts], path: str) -> list[Finding]:
    """Parameters (or DistOpt buckets) that miss a piece of state every other one of their family has: in a family
    where at least two members hold a piece, each member must hold it (e.g. `exp_avg_sq` of one parameter missing
    while the others have both moments). Legacy shards are judged each on their own."""
    out: list[Finding] = []
    for shard in sorted({t.shard or "" for t in tensors}):
        keys = [t.key for t in tensors if (t.shard or "") == shard]
        for pattern, name_group, piece_group in ((_PER_PARAM, 2, 1), (_DCP_STATE, 1, 2), (_BUCKET, 1, 2)):
            have: dict[str, set[str]] = {}
            for k in keys:
                m = pattern.match(k)
                if m:
                    have.setdefault(m.group(name_group), set()).add(m.group(piece_group))
            if len(have) < 2:
                continue
            counts: dict[str, int] = {}
            for pieces in have.values():
                for p in pieces:
                    counts[p] = counts.get(p, 0) + 1
            expected = {p for p, n in counts.items() if n >= 2}
            for name, pieces in sorted(have.items()):
                lack = sorted(expected - pieces)
                if lack:
                    subject = f"{shard}/{name}" if shard else name
                    out.append(Finding("CK910", f"{subject}: no {', '.join(lack)} in the checkpoint, which holds "
                                       f"{', '.join(sorted(expected))} for {counts[lack[0]]} other parameter(s) or "
                                       "bucket(s) of its optimizer", subject, path,
                                       {"parameter": name, "missing": lack, "present": sorted(pieces),
                                        **({"shard": shard} if shard else {})}))
    return out
