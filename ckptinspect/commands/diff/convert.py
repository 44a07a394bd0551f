"""Conversion equivalence: `diff SOURCE HF_DIR` between a Megatron checkpoint and its Hugging Face safetensors
export (or the reverse: an HF model and its Megatron import). Every Megatron parameter is mapped by the architecture's
table (`mappings/`) to its Hugging Face tensor(s) through the named transform, and each pair is proven equal value by
value (`convert_values.py`), one row block at a time.

Findings (docs/contract.md "Conversion diff"): CK960 no mapping (an unknown architecture, a parameter no rule
names), CK961 a source parameter whose target is missing (or not loadable: its shard is not in the index), CK962 an
export tensor nothing maps to, CK963 a target claimed twice, CK964 a shape that is not the transform's, CK965 a
tensor whose dtype is not the export's, CK966 values that differ, CK967 tied embeddings broken, CK968 the vocabulary
rows wrong (truncated, or padding kept), CK969 values that could not be read. `equal` only when a table applied and
none of these was found.

Only the Megatron model tensors are mapped: a legacy checkpoint must be one shard dir (TP = PP = 1; its keys lose the
``model.`` prefix); a global one (torch_dist / DCP) gives its model keys (``optimizer.*`` left out), a stacked
``decoder.layers.<name>`` tensor (layers along axis 0, Megatron-Core's sharded_state_dict) one `Part` per layer.
"""

from __future__ import annotations

import fnmatch
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptinspect.commands.diff.convert_values import Mode, Part, Tally, compare_blocks, mode_of
from ckptinspect.commands.diff.mappings import Pick, Rule, Transform, blocks, pick, target_rows
from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.io import location
from ckptinspect.io.local import read_small
from ckptinspect.model import Checkpoint, Format
from ckptinspect.services.chunk_bytes import ChunkSource

MAX_CONFIG_BYTES = 1 << 20
_LM_HEAD, _EMBED = "lm_head.weight", "model.embed_tokens.weight"


@dataclass(frozen=True, slots=True)
class Param:
    """One source parameter and what became of it. status: equal / different / missing / unreadable / shape /
    dtype / unmapped."""

    source: str
    targets: tuple[str, ...]
    transform: str | None
    status: str
    mode: str | None = None
    source_dtype: str | None = None
    target_dtypes: tuple[str, ...] = ()
    compared_elements: int = 0
    mismatched_elements: int = 0
    padding_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "targets": list(self.targets), "transform": self.transform,
                "status": self.status, "mode": self.mode, "source_dtype": self.source_dtype,
                "target_dtypes": list(self.target_dtypes), "compared_elements": self.compared_elements,
                "mismatched_elements": self.mismatched_elements, "padding_rows": self.padding_rows}


@dataclass(frozen=True, slots=True)
class ConversionReport:
    """direction: ``megatron_to_hf`` (A Megatron, B the export) or ``hf_to_megatron``."""

    direction: str
    architecture: str | None
    evidence: tuple[str, ...]
    params: tuple[Param, ...]
    extra: tuple[str, ...]
    unmapped: tuple[str, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def equal(self) -> bool:
        return self.architecture is not None and not self.findings

    def to_dict(self) -> dict[str, Any]:
        counts = Counter(p.status for p in self.params)
        return {"equal": self.equal, "direction": self.direction, "architecture": self.architecture,
                "evidence": list(self.evidence), "params": [p.to_dict() for p in self.params],
                "counts": dict(sorted(counts.items())), "extra": list(self.extra), "unmapped": list(self.unmapped),
                "findings": [{"code": f.code, "message": f.message, "subject": f.subject, "details": dict(f.details)}
                             for f in self.findings]}


def is_conversion(a: Checkpoint, b: Checkpoint) -> bool:
    """One side a Hugging Face export, the other a Megatron / DCP checkpoint."""
    other = (Format.TORCH, Format.TORCH_DIST, Format.TORCH_DCP, Format.FSDP_DTENSOR)
    return ((a.format is Format.SAFETENSORS and b.format in other)
            or (b.format is Format.SAFETENSORS and a.format in other))


def _config(hf: Checkpoint) -> dict[str, Any] | None:
    base = Path(location(hf.data_dir))
    for d in (base, base.parent) if base.suffix == ".safetensors" else (base,):
        try:
            out = json.loads(read_small(d / "config.json", MAX_CONFIG_BYTES))
        except (OSError, ValueError):
            continue
        return out if isinstance(out, dict) else None
    return None


def _megatron_params(m: Checkpoint) -> tuple[dict[str, Part], str | None]:
    if m.format is Format.TORCH:
        shards = {t.shard for t in m.tensors}
        if len(shards) > 1:
            return {}, f"legacy checkpoint with {len(shards)} shard dirs (TP or PP > 1): not mapped"
        return {t.key[len("model."):]: Part(t) for t in m.tensors if t.key.startswith("model.")}, None
    out: dict[str, Part] = {}
    for t in m.tensors:
        if t.key.startswith("optimizer."):
            continue
        head, _, rest = t.key.partition("decoder.layers.")
        if rest and not rest.split(".")[0].isdigit() and t.shape:
            # Megatron-Core's sharded_state_dict stacks the layers of a block along a leading axis
            for layer in range(t.shape[0]):
                out[f"{head}decoder.layers.{layer}.{rest}"] = Part(t, layer)
        else:
            out[t.key] = Part(t)
    return out, None


def _not_loadable(hf: Checkpoint) -> dict[str, str]:
    """Export tensors transformers would not load: not named by the index (CK155), in a shard it lists none of
    (CK153)."""
    out: dict[str, str] = {}
    unlisted = {str(f.details.get("file")) for f in hf.findings if f.code == "CK153"}
    for f in hf.findings:
        if f.code == "CK155" and f.details.get("tensor"):
            out[str(f.details["tensor"])] = "not named by model.safetensors.index.json"
    for t in hf.tensors:
        files = {c.storage.file for c in t.chunks if c.storage is not None}
        if files & unlisted:
            out[t.key] = f"its shard {sorted(files)[0]} is not in model.safetensors.index.json"
    return out


def _src(c: Checkpoint) -> ChunkSource:
    return ChunkSource(location(c.data_dir), raw=c.format is Format.TORCH, payload=c.format is Format.SAFETENSORS)


class _Run:
    def __init__(self, label: str, atol: float, rtol: float, reverse: bool = False) -> None:
        self.label = label
        self.reverse = reverse  # hf_to_megatron: the HF side is the original, the Megatron side what was made
        self.atol, self.rtol = atol, rtol
        self.findings: list[Finding] = []

    def add(self, code: str, subject: str, message: str, **details: Any) -> None:
        self.findings.append(Finding(code, message, subject, self.label, details))


def compare_conversion(a: Checkpoint, b: Checkpoint, *, atol: float = 0.0, rtol: float = 0.0,
                       ignore: tuple[str, ...] = ()) -> ConversionReport:
    """Prove the Hugging Face side of (a, b) the same model as the Megatron side, parameter by parameter.
    `ignore`: key globs (`--ignore`) left out on both sides (Megatron keys as mapped, without ``model.``)."""
    hf, m = (b, a) if b.format is Format.SAFETENSORS else (a, b)
    direction = "megatron_to_hf" if m is a else "hf_to_megatron"
    run = _Run(hf.path, atol, rtol, reverse=direction == "hf_to_megatron")
    params, why = _megatron_params(m)
    params = {k: v for k, v in params.items() if not any(fnmatch.fnmatchcase(k, g) for g in ignore)}
    config = _config(hf)
    chosen: Pick = pick(m.args, config) if why is None else Pick(None, None, (why,))
    if chosen.table is None or chosen.geometry is None:
        run.add("CK960", m.path, "no mapping for this pair: " + "; ".join(chosen.evidence), evidence=chosen.evidence)
        return ConversionReport(direction, None, chosen.evidence, (), (), tuple(sorted(params)), tuple(run.findings))
    table, geo = chosen.table, chosen.geometry
    hf_t = {t.key: Part(t) for t in hf.tensors if not any(fnmatch.fnmatchcase(t.key, g) for g in ignore)}
    blocked = _not_loadable(hf)
    export_dtype = str((config or {}).get("dtype") or (config or {}).get("torch_dtype") or
                       Counter(t.dtype for t in hf.tensors).most_common(1)[0][0] if hf.tensors else "")
    patterns = [(r, r.pattern()) for r in table.rules]
    claimed: dict[str, str] = {}
    out: list[Param] = []
    unmapped: list[str] = []
    s_src, t_src = _src(m), _src(hf)
    for key in sorted(params):
        if any(fnmatch.fnmatchcase(key, g) for g in table.ignored):
            continue
        hit = next(((r, mt) for r, p in patterns if (mt := p.match(key)) is not None), None)
        if hit is None:
            unmapped.append(key)
            run.add("CK960", key, f"{key}: no rule of the {table.name} table maps this parameter")
            continue
        rule, match = hit
        layer = match.groupdict().get("L")
        targets = tuple(t.replace("{L}", layer) if layer is not None else t for t in rule.targets)
        out.append(_param(run, key, params[key], rule, targets, geo, hf_t, blocked, claimed, export_dtype, s_src,
                          t_src))
    _tied(run, geo, config, params, hf_t, blocked, claimed, out, s_src, t_src, export_dtype)
    extra = tuple(sorted(k for k in hf_t if k not in claimed and k not in blocked
                         and not any(fnmatch.fnmatchcase(k, g) for g in table.ignored)))
    for k in extra:
        run.add("CK962", k, f"{k}: an export tensor no source parameter maps to (renamed, or from another model)",
                shape=list(hf_t[k].shape))
    return ConversionReport(direction, table.name, chosen.evidence, tuple(out), extra, tuple(unmapped),
                            tuple(run.findings))


def _param(run: _Run, key: str, st: Part, rule: Rule, targets: tuple[str, ...], geo: Any,
           hf_t: Mapping[str, Part], blocked: Mapping[str, str], claimed: dict[str, str], export_dtype: str,
           s_src: ChunkSource, t_src: ChunkSource) -> Param:
    base = dict(source=key, targets=targets, transform=rule.transform.value, source_dtype=st.dtype)
    for t in targets:
        if t in claimed:
            run.add("CK963", t, f"{t}: claimed by both {claimed[t]} and {key}", sources=[claimed[t], key])
            return Param(**base, status="duplicated")  # type: ignore[arg-type]
        claimed[t] = key
    gone = [t for t in targets if t not in hf_t or t in blocked]
    for t in gone:
        why = blocked.get(t, "absent from the export")
        run.add("CK961", key, f"{key}: its target {t} is {why}", target=t)
    if gone:
        return Param(**base, status="missing")  # type: ignore[arg-type]
    rows = st.shape[0] if st.shape else 1
    if rule.transform is Transform.VOCAB_PAD and rows < geo.vocab:
        run.add("CK964", key, f"{key}: {rows} rows, fewer than the vocabulary's {geo.vocab}", rows=rows)
        return Param(**base, status="shape")  # type: ignore[arg-type]
    if rule.transform is Transform.QKV_INTERLEAVE and rows != geo.num_query_groups * (
            geo.num_heads // geo.num_query_groups + 2) * geo.head_dim:
        run.add("CK964", key, f"{key}: {rows} rows do not fit {geo.num_heads} heads in {geo.num_query_groups} "
                "groups of head_dim {geo.head_dim}", rows=rows)
        return Param(**base, status="shape")  # type: ignore[arg-type]
    bad_shape = False
    for i, t in enumerate(targets):
        want = (target_rows(rule.transform, geo, i, rows), *st.shape[1:]) if st.shape else ()
        got = hf_t[t].shape
        if got != want:
            bad_shape = True
            code = "CK968" if rule.transform is Transform.VOCAB_PAD else "CK964"
            what = "vocabulary rows" if code == "CK968" else "shape"
            run.add(code, t, f"{t}: {what} {list(got)}, the {rule.transform.value} of {key} {list(st.shape)} gives "
                    f"{list(want)}", expected=list(want), actual=list(got), source=key)
    if bad_shape:
        return Param(**base, status="shape")  # type: ignore[arg-type]
    dtypes = tuple(hf_t[t].dtype for t in targets)
    for t, dt in zip(targets, dtypes):
        if export_dtype and dt != export_dtype:
            run.add("CK965", t, f"{t}: dtype {dt}, not the export's {export_dtype} (source {key}: {st.dtype})",
                    dtype=dt, export_dtype=export_dtype, source_dtype=st.dtype)
    mode = _mode(run, st.dtype, dtypes[0])
    tallies = _values(run, key, st, s_src, targets, hf_t, t_src, rule.transform, geo, mode)
    if tallies is None:
        return Param(**base, status="unreadable", mode=mode.value, target_dtypes=dtypes)  # type: ignore[arg-type]
    compared = sum(x.compared for x in tallies)
    mism = sum(x.mismatched for x in tallies)
    status = "different" if mism else ("dtype" if any(dt != export_dtype for dt in dtypes if export_dtype)
                                       else "equal")
    pad = rows - geo.vocab if rule.transform is Transform.VOCAB_PAD else 0
    return Param(**base, status=status, mode=mode.value, target_dtypes=dtypes,  # type: ignore[arg-type]
                 compared_elements=compared, mismatched_elements=mism, padding_rows=pad)


def _mode(run: _Run, megatron_dtype: str, hf_dtype: str) -> Mode:
    """From the original's dtype to the converted side's: Megatron -> HF for an export, HF -> Megatron for an
    import (an fp32 HF model imported as bf16 must be its rounding)."""
    tolerant = bool(run.atol or run.rtol)
    return (mode_of(hf_dtype, megatron_dtype, tolerant) if run.reverse
            else mode_of(megatron_dtype, hf_dtype, tolerant))


def _values(run: _Run, key: str, st: Part, s_src: ChunkSource, targets: tuple[str, ...],
            hf_t: Mapping[str, Part], t_src: ChunkSource, transform: Transform, geo: Any,
            mode: Mode) -> list[Tally] | None:
    rows = st.shape[0] if st.shape else 1
    per_target = blocks(transform, geo, len(targets), rows)
    tallies: list[Tally] = []
    for t, blk in zip(targets, per_target):
        try:
            tally = compare_blocks(st, s_src, hf_t[t], t_src, blk, mode, run.atol, run.rtol, run.reverse)
        except (ReadError, OSError, ValueError) as e:
            run.add("CK969", t, f"{t}: values not read ({e})", source=key)
            return None
        if tally.mismatched:
            run.add("CK966", t, f"{t}: {tally.mismatched} of {tally.compared} elements are not the "
                    f"{transform.value} of {key} ({mode.value}); first at target row {tally.first}: "
                    f"{tally.target_value!r}, source {tally.source_value!r}", source=key, mode=mode.value,
                    mismatched_elements=tally.mismatched, compared_elements=tally.compared,
                    first_row=tally.first)
        tallies.append(tally)
    return tallies


def _tied(run: _Run, geo: Any, config: Mapping[str, Any] | None, params: Mapping[str, Part],
          hf_t: Mapping[str, Part], blocked: Mapping[str, str], claimed: dict[str, str], out: list[Param],
          s_src: ChunkSource, t_src: ChunkSource, export_dtype: str) -> None:
    """Tied embeddings: a tied source has no output_layer; its export must tie too, or hold an lm_head equal to the
    embedding. An untied source's export must not declare the tie (transformers would drop its lm_head)."""
    declared = bool((config or {}).get("tie_word_embeddings", False))
    emb = params.get("embedding.word_embeddings.weight")
    if not geo.tied:
        if declared:
            run.add("CK967", _LM_HEAD, "the source has its own output layer, but config.json says "
                    "tie_word_embeddings=true: transformers would use the embedding as lm_head", declared=True)
        return
    has_head = _LM_HEAD in hf_t and _LM_HEAD not in blocked
    if not has_head and not declared:
        run.add("CK967", _LM_HEAD, "the source ties the output layer to the embedding, but the export has no "
                "lm_head.weight and config.json does not declare tie_word_embeddings: transformers would "
                "initialise lm_head at random", declared=False)
        return
    if has_head and emb is not None:
        claimed[_LM_HEAD] = "embedding.word_embeddings.weight"
        t = hf_t[_LM_HEAD]
        want = (min(geo.vocab, emb.shape[0]), *emb.shape[1:])
        if t.shape != want:
            run.add("CK967", _LM_HEAD, f"lm_head.weight {list(t.shape)}: the tied embedding gives {list(want)}")
            return
        mode = _mode(run, emb.dtype, t.dtype)
        tallies = _values(run, "embedding.word_embeddings.weight", emb, s_src, (_LM_HEAD,), hf_t, t_src,
                          Transform.VOCAB_PAD, geo, mode)
        if tallies is not None and tallies[0].mismatched:
            run.add("CK967", _LM_HEAD, "lm_head.weight is not the tied embedding", **{"mismatched_elements":
                    tallies[0].mismatched})
