"""`values CKPT`: the value scan's report — per tensor its statistics, fingerprint and first offending elements —
built from the scan's units (`scan.py`), judged by the value rules (`rules.py`), and merged across `--shard K/N`
reports (each shard's JSON carries the mergeable `state` of every tensor).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptinspect.commands.values.desync import desync_findings
from ckptinspect.commands.values.rules import TensorFacts, value_findings
from ckptinspect.commands.values.scan import (
    Done, Place, default_workers, is_zarr, jobs_of, run_jobs, shard_slice, source_of, tensor_jobs,
)
from ckptinspect.errors import UsageError
from ckptinspect.findings import Finding, Status, filter_findings, status_of
from ckptinspect.model import Checkpoint, Tensor
from ckptinspect.model.components import component_of
from ckptinspect.progress import ProgressHook
from ckptinspect.services.values import SUPPORTED, TensorValues
from ckptinspect.services.values_fingerprint import Lanes
from ckptinspect.services.values_stats import ValueStats

_KINDS = ("nan", "inf", "subnormal", "negative")


@dataclass(frozen=True, slots=True)
class TensorScan:
    """The value scan of one tensor (of the part a `--shard` read).

    values: statistics and fingerprint lanes of every element scanned.
    judged: the statistics the value rules read: `values` without DistributedOptimizer alignment pads
      (`scan.is_alignment_pad`).
    places: the first offending element of each kind met (``nan`` / ``inf`` / ``subnormal`` / ``negative``), by
      (global flat index, where it lies).
    errors: (code, message) of chunks that could not be read. unsupported: why the dtype is not decoded.
    layer_cover / layer_zero: Megatron stacked tensors (`layers.py`): per layer, the chunks covering it and those
      in which it is zero throughout.
    """

    key: str
    shard: str | None
    dtype: str
    shape: tuple[int, ...]
    component: str
    values: TensorValues
    judged: ValueStats = ValueStats()
    places: Mapping[str, tuple[int, Place]] = field(default_factory=dict)
    errors: tuple[tuple[str, str], ...] = ()
    unsupported: str | None = None
    layer_cover: Mapping[int, int] = field(default_factory=dict)  # stacked: chunks covering each layer
    layer_zero: Mapping[int, int] = field(default_factory=dict)  # ... of which zero throughout in that layer

    @property
    def facts(self) -> TensorFacts:
        return TensorFacts(self.key, self.shard, self.dtype, self.shape, self.component, self.judged,
                           self.values.complete, {k: p for k, (_, p) in self.places.items()},
                           self.errors, self.unsupported, self.zero_layers)

    @property
    def zero_layers(self) -> tuple[int, ...]:
        """Layers of a stacked tensor that are zero throughout (every chunk covering them says so)."""
        return tuple(sorted(k for k, n in self.layer_cover.items() if n and self.layer_zero.get(k, 0) == n))

    def absorb(self, d: Done) -> TensorScan:
        places = _earliest(self.places, d.places)
        judged = self.judged.merge(d.values.stats) if d.values is not None and not d.padding else self.judged
        cover, zero = dict(self.layer_cover), dict(self.layer_zero)
        if d.layer_span is not None:
            for k in range(*d.layer_span):
                cover[k] = cover.get(k, 0) + 1
            for k in d.zero_layers:
                zero[k] = zero.get(k, 0) + 1
        return replace(
            self, layer_cover=cover, layer_zero=zero,
            values=self.values.merge(d.values) if d.values is not None else self.values, judged=judged,
            places=places,
            errors=self.errors + ((d.error,) if d.error is not None else ()),
        )

    def merge(self, other: TensorScan) -> TensorScan:
        """This slice's scan of the tensor and `other`'s (another `--shard` slice), as one scan."""
        places = _earliest(self.places, ((k, g, p) for k, (g, p) in other.places.items()))
        return replace(
            self, values=self.values.merge(other.values), judged=self.judged.merge(other.judged), places=places,
            errors=self.errors + other.errors, unsupported=self.unsupported or other.unsupported,
            layer_cover=_added(self.layer_cover, other.layer_cover), layer_zero=_added(self.layer_zero, other.layer_zero),
        )

    def to_dict(self, state: bool = False) -> dict[str, Any]:
        fp = self.values.fingerprint
        out: dict[str, Any] = {"key": self.key}
        if self.shard is not None:
            out["shard"] = self.shard
        s = self.judged
        out.update({
            "dtype": self.dtype, "shape": list(self.shape), "component": self.component, "count": s.count,
            "pad_elements": self.values.stats.count - s.count,
            "nan": s.nan, "posinf": s.posinf, "neginf": s.neginf, "zeros": s.zeros, "subnormal": s.subnormal,
            "min": _num(s.min), "max": _num(s.max), "mean": _num(s.mean) if s.finite else None, "std": _num(s.std),
            "l2": _num(s.l2), "absmax": _num(s.absmax), "fingerprint": fp, "complete": self.values.complete,
            "first": {k: {"flat_index": g, **p.to_dict()} for k, (g, p) in sorted(self.places.items())},
        })
        if self.unsupported:
            out["unsupported"] = self.unsupported
        if self.errors:
            out["errors"] = [{"code": c, "message": m} for c, m in self.errors]
        if self.zero_layers and self.values.complete:
            out["zero_layers"] = list(self.zero_layers)
        if state:
            out["state"] = _state(self.values, self.judged)
            if self.layer_cover:
                out["state"]["layer_cover"] = {str(k): v for k, v in sorted(self.layer_cover.items())}
                out["state"]["layer_zero"] = {str(k): v for k, v in sorted(self.layer_zero.items())}
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> TensorScan:
        """A tensor of a `--shard` report (`to_dict(state=True)`); ValueError when the state is missing or bad."""
        st = d.get("state")
        if not isinstance(st, Mapping):
            raise ValueError(f"tensor {d.get('key')!r} has no 'state' (not a `values --shard` report)")
        shape = tuple(int(x) for x in d["shape"])
        stats = ValueStats(**{k: st[k] for k in _STAT_FIELDS})
        judged = ValueStats(**{k: st["judged"][k] for k in _STAT_FIELDS})
        lanes = Lanes(tuple(int(x, 16) for x in st["lanes"]))
        values = TensorValues(str(d["dtype"]), shape, stats, lanes, d.get("unsupported"))
        places = {k: (int(v["flat_index"]), Place.from_dict(v)) for k, v in dict(d.get("first") or {}).items()}
        errors = tuple((str(e["code"]), str(e["message"])) for e in d.get("errors") or ())
        cover = {int(k): int(v) for k, v in dict(st.get("layer_cover") or {}).items()}
        zero = {int(k): int(v) for k, v in dict(st.get("layer_zero") or {}).items()}
        return TensorScan(str(d["key"]), d.get("shard"), str(d["dtype"]), shape, str(d["component"]), values, judged,
                          places,
                          errors, d.get("unsupported"), cover, zero)


def _earliest(places: Mapping[str, tuple[int, Place]], more: Iterable[tuple[str, int, Place]]
              ) -> dict[str, tuple[int, Place]]:
    """The first offending element of each kind: the smallest global flat index of `places` and `more`."""
    out = dict(places)
    for kind, g, p in more:
        if kind not in out or g < out[kind][0]:
            out[kind] = (g, p)
    return out


def _added(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}


_STAT_FIELDS = ("count", "nan", "posinf", "neginf", "zeros", "subnormal", "finite", "min", "max", "mean", "m2",
                "first_nan", "first_inf", "first_subnormal")


def _state(v: TensorValues, judged: ValueStats) -> dict[str, Any]:
    s = v.stats
    return {**{k: getattr(s, k) for k in _STAT_FIELDS}, "lanes": [f"{x:016x}" for x in v.lanes.sums],
            "judged": {k: getattr(judged, k) for k in _STAT_FIELDS}}


def _num(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


@dataclass(frozen=True, slots=True)
class ValuesReport:
    """The value scan of one checkpoint (or of slice `shard` of it).

    tensors: every tensor of the checkpoint, in its order, with what was scanned of it.
    findings: the reader's findings, then the value findings (CK901-CK911), filtered by select / ignore.
    bytes_read: tensor bytes read (replicas included). shard: (K, N) of a sliced scan, None for all of it.
    """

    path: str
    tensors: tuple[TensorScan, ...]
    findings: tuple[Finding, ...]
    status: Status
    bytes_read: int
    shard: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        sliced = self.shard is not None
        return {
            "path": self.path, "status": self.status.value,
            "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None, "bytes_read": self.bytes_read,
            "tensors": [t.to_dict(state=sliced) for t in self.tensors],
            "findings": [f.to_dict() for f in self.findings],
        }


def scan_tensors(ckpt: Checkpoint, *, shard: tuple[int, int] | None = None, workers: int | None = None,
                 progress: ProgressHook | None = None) -> tuple[tuple[TensorScan, ...], int]:
    """Scan the tensors of `ckpt` (slice `shard` of the work): every tensor, and the tensor bytes read."""
    tensors = list(ckpt.tensors)
    scans = [_empty(t.key, t.shard, t.dtype, tuple(t.shape)) for t in tensors]
    jobs = shard_slice(jobs_of(ckpt), shard)
    total = sum(j.nbytes for j in jobs)
    read = [0]

    def take(d: Done) -> None:
        scans[d.tensor] = scans[d.tensor].absorb(d)
        read[0] += d.nbytes
        if progress is not None:
            progress(d.nbytes, total, tensors[d.tensor].key)

    run_jobs(source_of(ckpt), jobs, workers if workers is not None else default_workers(jobs), take)
    return tuple(scans), read[0]


def fingerprint_of(ckpt: Checkpoint, t: Tensor) -> str | None:
    """The value fingerprint of one tensor of `ckpt` (None when a chunk cannot be read, its dtype is not decoded or
    its chunks do not cover it exactly once)."""
    values = TensorValues(t.dtype, tuple(t.shape))
    ok = [True]

    def take(d: Done) -> None:
        nonlocal values
        if d.values is None:
            ok[0] = False
        else:
            values = values.merge(d.values)

    jobs = tensor_jobs(0, t, is_zarr(ckpt))
    if not jobs:
        return None
    run_jobs(source_of(ckpt), jobs, 1, take)
    return values.fingerprint if ok[0] else None


def _empty(key: str, shard: str | None, dtype: str, shape: tuple[int, ...]) -> TensorScan:
    why = None if dtype in SUPPORTED else f"values of dtype {dtype} are not decoded"
    return TensorScan(key, shard, dtype, shape, component_of(key), TensorValues(dtype, shape, unsupported=why),
                      unsupported=why)


def values_report(ckpt: Checkpoint, *, shard: tuple[int, int] | None = None, workers: int | None = None,
                  select: Iterable[str] = (), ignore: Iterable[str] = (),
                  progress: ProgressHook | None = None) -> ValuesReport:
    """`values CKPT`: scan and judge. The reader's findings come first (a broken container is said as such)."""
    scans, read = scan_tensors(ckpt, shard=shard, workers=workers, progress=progress)
    desync = desync_findings(ckpt, source_of(ckpt), ckpt.path, shard)
    return judged(ckpt.path, scans, read, shard, [*ckpt.findings, *desync], select, ignore)


def judged(path: str, scans: Sequence[TensorScan], read: int, shard: tuple[int, int] | None,
           reader_findings: Iterable[Finding], select: Iterable[str], ignore: Iterable[str]) -> ValuesReport:
    found = list(reader_findings) + value_findings([t.facts for t in scans], path, partial=shard is not None)
    kept = tuple(filter_findings(found, select, ignore))
    return ValuesReport(path, tuple(scans), kept, status_of(kept), read, shard)


def merge_reports(docs: Sequence[Mapping[str, Any]], select: Iterable[str] = (),
                  ignore: Iterable[str] = ()) -> ValuesReport:
    """Combine the JSON reports of `values --shard K/N -o json` for K = 0..N-1 into the unsharded report.

    Raises `UsageError` when they are not the N slices of one checkpoint."""
    if not docs:
        raise UsageError("no reports to merge")
    try:
        slices = [str(d["shard"]) for d in docs]
        ns = {int(s.split("/")[1]) for s in slices}
        ks = sorted(int(s.split("/")[0]) for s in slices)
        paths = {str(d["path"]) for d in docs}
        tensor_lists = [[TensorScan.from_dict(t) for t in d["tensors"]] for d in docs]
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise UsageError(f"not a `values --shard K/N -o json` report: {e}") from e
    if len(ns) != 1 or ks != list(range(next(iter(ns)))):
        raise UsageError(f"reports are slices {sorted(slices)}: need each of 0..N-1 of one N exactly once")
    if len(paths) != 1:
        raise UsageError(f"reports are of different checkpoints: {sorted(paths)}")
    keys = [[(t.shard, t.key) for t in ts] for ts in tensor_lists]
    if any(k != keys[0] for k in keys):
        raise UsageError("reports list different tensors: not slices of one checkpoint")
    merged = list(tensor_lists[0])
    for ts in tensor_lists[1:]:
        merged = [a.merge(b) for a, b in zip(merged, ts)]
    reader = _reader_findings(docs[0]) + [
        Finding(str(f["code"]), str(f.get("message", "")), f.get("subject"), f.get("path"), dict(f.get("details") or {}))
        for d in docs for f in d.get("findings") or () if f.get("code") == "CK911"]
    return judged(next(iter(paths)), merged, sum(int(d.get("bytes_read") or 0) for d in docs), None, reader,
                  select, ignore)


def _reader_findings(doc: Mapping[str, Any]) -> list[Finding]:
    """The reader's findings of a shard report (every shard has the same): those not of the value family, and the
    cross-tensor findings each slice judged for its own share of pairs (CK911), from every report."""
    out = []
    for f in doc.get("findings") or ():
        code = str(f.get("code", ""))
        if not code.startswith("CK9"):
            out.append(Finding(code, str(f.get("message", "")), f.get("subject"), f.get("path"),
                               dict(f.get("details") or {})))
    return out
