"""Megatron FSDP (`--use-megatron-fsdp --ckpt-format fsdp_dtensor`): what a plain DCP reader cannot know.

The payload is plain DCP (Megatron-LM core_v0.16.1 `megatron/training/checkpointing.py` `save_checkpoint`
L643-655: `torch.distributed.checkpoint.save` of the whole state dict; no metadata.json, no common.pt). Read here:

- `args`: the Megatron `Namespace` is a byte item of its own (`generate_state_dict` L892), read with the allowlisting
  unpickler (never executed; a hostile one is left to the safety check, CK601) for the topology `info` / `diff` show.
- SwiGLU halves (CK515): `handle_swiglu_in_state_dict` (megatron/core/transformer/fsdp_dtensor_checkpoint.py
  L179-325) saves every `…linear_fc1.weight` (and per-expert `weight{i}`) as `…weight_w` + `…weight_v`, in the model
  and in each optimizer state. Megatron's load builds both halves and, with the default `allow_partial_load`
  (checkpointing.py L1305), leaves a half the checkpoint lacks at its fresh initial value without a word.
- The rng dict (CK516): `get_rng_state` (L384-389) keys it `"(pp_rank, tp_rank)"`; the load (L1846-1856) warns and
  takes another cell's state when its own cell is missing, and exits when a cell lacks a field.
- `optimizer.param_to_group_meta.<param>.<field>` (CK517): BytesIO items, one per param-group field
  (distrib_optimizer.py `_param_groups_to_param2group_meta` L1296-1306); the load (L719-724 →
  `_param2group_meta_to_param_groups` L1308-1345, strict) raises for a param with state but no group metadata, and
  for two params of one group whose metadata differ. SwiGLU state keys (`_w`/`_v`) map to the unsplit param's meta.
- Uneven DTensor shards (`megatron_fsdp/uneven_dtensor.py`): chunks of any size, empty local shards written as
  nothing; the generic coverage check proves them (a true gap is CK301), so nothing is added here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import islice
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import read_item_archive
from ckptinspect.formats.args_values import arg_int
from ckptinspect.formats.topology import topology_from
from ckptinspect.model import Checkpoint
from ckptinspect.pickling.plain import to_plain

ARGS_KEY = "args"
RNG_PREFIX = "rng_state."
META_PREFIX = "optimizer.param_to_group_meta."
STATE_PREFIX = "optimizer.state."
RNG_FIELDS = ("random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states")
_RNG_CELL = re.compile(r"^rng_state\.\((\d+), (\d+)\)\.(\d+)\.([A-Za-z_]+)")
_RNG_ANY = re.compile(r"^rng_state\.([^.]*)\.")
_SWIGLU = re.compile(r"^(?P<base>.*\.linear_fc1\.weight\d*)_(?P<half>[wv])(?P<rest>\..*)?$")
_STATE_LEAF = re.compile(r"^(?P<param>.*)\.(?P<leaf>[A-Za-z_]+)$")


def fsdp_enrich(ckpt: Checkpoint, path: Path, label: str) -> Checkpoint:
    """Args (topology) and the Megatron FSDP completeness findings CK515-CK517 of one fsdp_dtensor checkpoint."""
    shapes = {t.key: tuple(t.shape) for t in ckpt.tensors}
    keys = list(shapes) + [o.key for o in ckpt.objects]
    args = ckpt.args if ckpt.args is not None else _read_args(ckpt, path)
    findings = [*swiglu_findings(shapes, label), *rng_findings(keys, args, label), *group_meta_findings(keys, label)]
    changes: dict[str, Any] = {"findings": tuple(findings) + ckpt.findings}
    if ckpt.optimizer_sharding is None and any(k.startswith(STATE_PREFIX) for k in shapes):
        # _build_sharded_state_dict_metadata (checkpointing.py L418-419): the DistOpt sharding of this format
        changes["optimizer_sharding"] = "fsdp_dtensor"
    if args is not None and ckpt.args is None:
        topology, _ = topology_from(args, None, ckpt.layout)
        merged = {**ckpt.topology.sources, **{k: f"{ARGS_KEY} item" if v == "args" else v
                                              for k, v in topology.sources.items()}}
        if topology.world_size is None:
            topology = replace(topology, world_size=ckpt.topology.world_size)
        changes.update(args=args, topology=replace(topology, sources=merged))
        changes["extra"] = {**ckpt.extra, "args_source": f"{ARGS_KEY} byte item"}
    return replace(ckpt, **changes)


def _read_args(ckpt: Checkpoint, path: Path) -> dict[str, Any] | None:
    item = next((o for o in ckpt.objects if o.key == ARGS_KEY), None)
    if item is None or item.storage is None:
        return None
    try:
        archive = read_item_archive(path, item.storage)
    except (ReadError, OSError):
        return None  # the storage / safety checks report a missing, truncated or hostile item
    if archive.report.dangerous:
        return None
    try:
        plain = to_plain(archive.obj)
    except ReadError:
        return None
    return plain if isinstance(plain, dict) else None


def swiglu_findings(shapes: Mapping[str, tuple[int, ...]], label: str) -> list[Finding]:
    """CK515: a `…linear_fc1.weight_w` without its `_v` (or the reverse), or the two halves of different shapes."""
    halves: dict[tuple[str, str], dict[str, tuple[int, ...]]] = defaultdict(dict)
    for key, shape in shapes.items():
        m = _SWIGLU.match(key)
        if m:
            halves[(m["base"], m["rest"] or "")][m["half"]] = shape
    out: list[Finding] = []
    for (base, rest), got in sorted(halves.items()):
        if len(got) == 1:
            have, = got
            miss = "v" if have == "w" else "w"
            out.append(Finding("CK515", f"SwiGLU half {base}_{miss}{rest} missing (only _{have} saved): Megatron FSDP "
                               "saves linear_fc1 as _w and _v; a partial load leaves the missing half at its "
                               "initial value", f"{base}_{miss}{rest}", label))
        elif got["w"] != got["v"] and len(got["w"]) == len(got["v"]):
            out.append(Finding("CK515", f"SwiGLU halves of {base}{rest} differ in shape: _w {got['w']} vs _v "
                               f"{got['v']}", f"{base}_v{rest}", label))
    return out


def rng_findings(keys: Sequence[str], args: Mapping[str, Any] | None, label: str) -> list[Finding]:
    """CK516: the `"(pp, tp)"` rng grid has a missing or malformed cell, or a cell lacks a field Megatron loads."""
    rng = [k for k in keys if k.startswith(RNG_PREFIX)]
    if not rng:
        return []
    out: list[Finding] = []
    cells: dict[tuple[int, int], set[str]] = defaultdict(set)
    bad: set[str] = set()
    for k in rng:
        m = _RNG_CELL.match(k)
        if m:
            cells[(int(m[1]), int(m[2]))].add(m[4])
        else:
            a = _RNG_ANY.match(k)
            bad.add(a[1] if a else k[len(RNG_PREFIX):])
    for b in sorted(bad)[:8]:
        out.append(Finding("CK516", f"rng_state entry {b!r} is not a \"(pp, tp)\" cell: Megatron's fsdp_dtensor "
                           "load looks its state up by f\"({pp_rank}, {tp_rank})\"", f"rng_state.{b}", label))
    if not cells:
        return out
    pp = arg_int(args, "pipeline_model_parallel_size") or max(p for p, _ in cells) + 1
    tp = arg_int(args, "tensor_model_parallel_size") or max(t for _, t in cells) + 1
    # the first missing cells only: args may name a grid far larger than the cells on disk (sizes up to 2**20)
    missing = list(islice(((p, t) for p in range(pp) for t in range(tp) if (p, t) not in cells), 64))
    if missing:
        count = pp * tp - sum(1 for p, t in cells if p < pp and t < tp)
        shown = ", ".join(f"({p}, {t})" for p, t in missing[:8])
        out.append(Finding("CK516", f"rng_state has no cell for (pp, tp) {shown}{' ...' if count > 8 else ''} "
                           f"of the {pp}x{tp} grid ({count} missing): Megatron warns and restores another rank's "
                           f"RNG there", f"rng_state.({missing[0][0]}, {missing[0][1]})", label,
                           {"missing": [list(c) for c in missing], "missing_count": count}))
    for (p, t), fields in sorted(cells.items()):
        lack = [f for f in RNG_FIELDS if f not in fields]
        if lack:
            out.append(Finding("CK516", f"rng_state cell ({p}, {t}) lacks {', '.join(lack)}: Megatron's load of it "
                               "fails (KeyError → exit) or, with a partial load, keeps the fresh RNG",
                               f"rng_state.({p}, {t})", label))
    return out


def _unsplit(param: str) -> str:
    m = _SWIGLU.match(param)
    return m["base"] if m else param


def group_meta_findings(keys: Sequence[str], label: str) -> list[Finding]:
    """CK517: a param with optimizer state but no `param_to_group_meta`, or a param whose group fields are partial."""
    meta: dict[str, set[str]] = defaultdict(set)
    for k in keys:
        if k.startswith(META_PREFIX):
            m = _STATE_LEAF.match(k[len(META_PREFIX):])
            if m:
                meta[m["param"]].add(m["leaf"])
    if not meta:
        return []
    state = set()
    for k in keys:
        if k.startswith(STATE_PREFIX):
            m = _STATE_LEAF.match(k[len(STATE_PREFIX):])
            if m:
                state.add(_unsplit(m["param"]))
    out: list[Finding] = []
    lost = sorted(state - set(meta))
    if lost:
        out.append(Finding("CK517", f"{len(lost)} param(s) have optimizer state but no param_to_group_meta, e.g. "
                           f"{lost[0]}: Megatron's optimizer load raises (param not found in param_to_group_meta)",
                           META_PREFIX + lost[0], label, {"params": lost[:20]}))
    fields = set().union(*meta.values())
    partial = sorted(p for p, f in meta.items() if f != fields)
    if partial:
        lack = sorted(fields - meta[partial[0]])
        out.append(Finding("CK517", f"{len(partial)} param(s) have partial param_to_group_meta, e.g. {partial[0]} "
                           f"lacks {', '.join(lack) or '-'}: the rebuilt param group differs from its neighbours' "
                           "and Megatron's load raises", META_PREFIX + partial[0], label, {"params": partial[:20]}))
    return out
