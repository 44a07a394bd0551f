"""`diff`: compare two checkpoints — training args, checkpoint facts, tensor keys/shapes/dtypes/chunk layouts,
sharded-object families, and (with `values=True`) tensor contents.

What is *blocking* (docs/contract.md "diff"): a difference that breaks a resume or a like-for-like comparison — the args
Megatron's `check_checkpoint_args` asserts on (megatron/training/checkpointing.py), the architecture args
`load_args_from_checkpoint` copies from a checkpoint, and any tensor key/shape/dtype change. Progress counters,
runtime paths, parallel sizes (torch_dist reshards), chunk layouts and object grids are reported, never blocking.

Tensors are matched by key only between formats that name them the same way: the global formats (torch_dist,
torch_dcp, fsdp_dtensor) among themselves, and legacy `torch` with legacy `torch` (per shard dir). Between a legacy
and a global checkpoint the keys and shapes mean different things (per-rank local tensors vs global tensors); the
result says so in `notes` instead of listing every key on both sides.

The args tables, `categorize`, `diff_args` and `diff_meta` live in `args.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.formats.resolve import resolve_checkpoint
from ckptinspect.errors import UNREAD_CODE, ReadError
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import Checkpoint, Format, ObjectItem, Tensor
from ckptinspect.commands.diff.values import ValueComparison, compare_tensor_values, supported
from ckptinspect.commands.diff.tolerance import Tolerance, same_values
from ckptinspect.services.chunk_bytes import ChunkSource
from ckptinspect.commands.diff.args import ArgDiff, categorize, diff_args, diff_meta
from ckptinspect.commands.diff import optim
from ckptinspect.commands.diff.optim import OptimSummary
from ckptinspect.commands.diff.reformulated import compare_logical, reformulated
from ckptinspect.commands.diff.convert import ConversionReport, compare_conversion, is_conversion
from ckptinspect.io import location
from ckptinspect.progress import ProgressHook  # progress(advance, total, description): bytes of A's chunks


class What(enum.Enum):
    """What changed about a tensor (or an object family: only `layout`)."""

    SHAPE = "shape"
    DTYPE = "dtype"
    LAYOUT = "layout"
    VALUES = "values"


# --- tensors and objects ------------------------------------------------------------------------------------------

_GLOBAL = (Format.TORCH_DIST, Format.TORCH_DCP, Format.FSDP_DTENSOR, Format.NVRX_LOCAL)
# Megatron-Core ≥0.19 stores the common state as the byte item `common_state/shard_0_1`: not a model object.
COMMON_STATE_FAMILIES = frozenset({"common_state"})


@dataclass(frozen=True, slots=True)
class Change:
    """One tensor (or object family) difference. For `values`: the first mismatch's values in `a` / `b`."""

    key: str
    what: What
    a: Any
    b: Any
    blocking: bool
    max_abs_diff: float | None = None
    mismatched_elements: int | None = None
    compared_elements: int | None = None
    first_mismatch: tuple[int, ...] | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "what": self.what.value, "a": self.a, "b": self.b,
                             "blocking": self.blocking}
        if self.what is What.VALUES:
            d.update(max_abs_diff=_num(self.max_abs_diff), mismatched_elements=self.mismatched_elements,
                     compared_elements=self.compared_elements,
                     first_mismatch=list(self.first_mismatch) if self.first_mismatch is not None else None)
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True, slots=True)
class KeyDiff:
    """Keys only on one side and changes of the common ones. `comparable` False: the keys could not be matched.

    renamed: (key in A, key in B) pairs that name the same tensor under two spellings (optim.pair_aliases); they
    count as common and their changes are keyed by A's name. optimizer: optimizer keys of a DistributedOptimizer
    format the other side lacks, summarised per side and format (optim.summarise) instead of listed in only_in_*."""

    comparable: bool
    common: int = 0
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    changed: tuple[Change, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    optimizer: tuple[OptimSummary, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.only_in_a or self.only_in_b or self.changed or self.renamed or self.optimizer)

    def to_dict(self) -> dict[str, Any]:
        return {"comparable": self.comparable, "common": self.common, "only_in_a": list(self.only_in_a),
                "only_in_b": list(self.only_in_b), "changed": [c.to_dict() for c in self.changed],
                "renamed": [{"a": ka, "b": kb} for ka, kb in self.renamed],
                "optimizer_formats": [s.to_dict() for s in self.optimizer]}


def _names(ckpt: Checkpoint) -> dict[str, Tensor]:
    """Tensors by comparable name: the key (global formats) or ``<shard dir>/<key>`` (legacy)."""
    return {(f"{t.shard}/{t.key}" if t.shard else t.key): t for t in ckpt.tensors}


def _layout(t: Tensor) -> dict[str, Any]:
    grid = [len({c.offsets[i] for c in t.chunks if len(c.offsets) > i}) for i in range(len(t.shape))]
    return {"chunks": len(t.chunks), "grid": grid}


def _same_chunks(x: Tensor, y: Tensor) -> bool:
    """Same chunk geometry, from the chunk tables' columns (no object per chunk; objects only for a tensor whose
    chunks have different numbers of axes)."""
    gx, gy = x.chunks.geometry(), y.chunks.geometry()
    if gx is not None and gy is not None:
        return gx == gy
    return sorted((c.offsets, c.sizes) for c in x.chunks) == sorted((c.offsets, c.sizes) for c in y.chunks)


def diff_tensors(ta: Mapping[str, Tensor], tb: Mapping[str, Tensor]) -> KeyDiff:
    changed: list[Change] = []
    renamed = optim.pair_aliases(set(ta) - set(tb), set(tb) - set(ta))
    pairs = [(k, k) for k in sorted(set(ta) & set(tb))] + list(renamed)
    for k, kb in pairs:
        x, y = ta[k], tb[kb]
        sa, sb = x.orig_shape or x.shape, y.orig_shape or y.shape
        alias = None if k == kb else f"B: {kb}"
        if sa != sb:
            changed.append(Change(k, What.SHAPE, list(sa), list(sb), True, note=alias))
        if x.dtype != y.dtype:
            changed.append(Change(k, What.DTYPE, x.dtype, y.dtype, True, note=alias))
        if sa != sb:
            continue
        if x.shape != y.shape:
            note = "stored shapes differ (N-D reformulated tensor), logical shape is the same"
            changed.append(Change(k, What.LAYOUT, list(x.shape), list(y.shape), False,
                                  note=note if alias is None else f"{note}; {alias}"))
        elif _same_chunks(x, y) is False:
            changed.append(Change(k, What.LAYOUT, _layout(x), _layout(y), False, note=alias))
    paired_a, paired_b = {ka for ka, _ in renamed}, {kb for _, kb in renamed}
    return KeyDiff(True, len(pairs), tuple(sorted(set(ta) - set(tb) - paired_a)),
                   tuple(sorted(set(tb) - set(ta) - paired_b)), tuple(changed), renamed)


def _families(objects: Iterable[ObjectItem]) -> dict[str, list[ObjectItem]]:
    out: dict[str, list[ObjectItem]] = {}
    for o in objects:
        if o.family not in COMMON_STATE_FAMILIES:
            out.setdefault(o.family, []).append(o)
    return out


def diff_objects(a: Iterable[ObjectItem], b: Iterable[ObjectItem]) -> KeyDiff:
    """Sharded-object families: present on one side only, or another grid (e.g. rng_state (2, 2) → (1, 2))."""
    fa, fb = _families(a), _families(b)
    changed: list[Change] = []
    common = sorted(set(fa) & set(fb))
    for fam in common:
        ga = sorted({o.grid for o in fa[fam] if o.grid is not None})
        gb = sorted({o.grid for o in fb[fam] if o.grid is not None})
        if ga != gb:
            changed.append(Change(fam, What.LAYOUT, _grid_value(ga), _grid_value(gb), False, note="object grid"))
        elif len(fa[fam]) != len(fb[fam]):
            changed.append(Change(fam, What.LAYOUT, {"cells": len(fa[fam])}, {"cells": len(fb[fam])}, False,
                                  note="object cells"))
    return KeyDiff(True, len(common), tuple(sorted(set(fa) - set(fb))), tuple(sorted(set(fb) - set(fa))),
                   tuple(changed))


def _grid_value(grids: list[tuple[int, ...]]) -> Any:
    return list(grids[0]) if len(grids) == 1 else [list(g) for g in grids]


# --- the result ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValuesReport:
    """What `values=True` compared. identical: keys whose compared values are all equal."""

    compared: tuple[str, ...]
    identical: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    elements_compared: int
    by_fingerprint: tuple[str, ...] = ()  # identical keys proven so by equal value fingerprints (no element compared)
    atol: float = 0.0
    rtol: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"compared": len(self.compared), "identical": len(self.identical),
                "changed": len(self.compared) - len(self.identical), "identical_keys": list(self.identical),
                "skipped": [{"key": k, "reason": r} for k, r in self.skipped],
                "elements_compared": self.elements_compared, "identical_by_fingerprint": len(self.by_fingerprint),
                "atol": self.atol, "rtol": self.rtol}


@dataclass(frozen=True, slots=True)
class Side:
    """One compared checkpoint, as the result names it."""

    path: str
    format: Format | None
    generation: str | None
    iteration: int | None
    has_args: bool
    unread: bool = False  # part of it could not be read here (CK209): nothing can be said to be identical

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format.value if self.format else None, "generation": self.generation,
                "iteration": self.iteration, "has_args": self.has_args}


@dataclass(frozen=True, slots=True)
class DiffResult:
    """The result of `diff A B`. `to_dict()` gives the contract's JSON body (without the envelope)."""

    a: Side
    b: Side
    args: tuple[ArgDiff, ...]
    meta: tuple[ArgDiff, ...]
    tensors: KeyDiff
    objects: KeyDiff
    values: ValuesReport | None
    notes: tuple[str, ...]
    conversion: ConversionReport | None = None  # a Megatron checkpoint vs its Hugging Face export (convert.py)

    @property
    def blocking(self) -> bool:
        """A blocking arg, a tensor key only on one side, a shape/dtype change, a side that is no checkpoint, or one
        that could not be read whole here (CK209: the comparison itself broke)."""
        t = self.tensors
        return (any(d.blocking for d in self.args) or any(c.blocking for c in t.changed)
                or bool(t.only_in_a or t.only_in_b) or self.a.format is None or self.b.format is None
                or self.a.unread or self.b.unread or (self.conversion is not None and not self.conversion.equal))

    @property
    def identical(self) -> bool:
        if self.conversion is not None:  # the same model, proven parameter by parameter (args differ by nature)
            return self.conversion.equal and not self.a.unread and not self.b.unread
        return (not self.args and not self.meta and self.tensors.comparable and self.tensors.empty
                and self.objects.empty and self.a.has_args == self.b.has_args and not self.blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical, "blocking": self.blocking, "a": self.a.to_dict(), "b": self.b.to_dict(),
            "args": [d.to_dict() for d in self.args], "checkpoint": [d.to_dict() for d in self.meta],
            "tensors": self.tensors.to_dict(), "objects": self.objects.to_dict(),
            "values": self.values.to_dict() if self.values is not None else None, "notes": list(self.notes),
            "conversion": self.conversion.to_dict() if self.conversion is not None else None,
        }


def _side(c: Checkpoint) -> Side:
    return Side(c.path, c.format, c.generation, c.iteration, c.args is not None, _unread(c))


def _unread(c: Checkpoint) -> bool:
    return any(f.code == UNREAD_CODE for f in c.findings)


def _num(x: float | None) -> float | str | None:
    return x if x is None or x == x and abs(x) != float("inf") else str(x)


def diff_checkpoints(
    a: Checkpoint, b: Checkpoint, *, values: bool = False, progress: ProgressHook | None = None,
    a_dir: Path | None = None, b_dir: Path | None = None, tolerance: Tolerance = Tolerance(),
) -> DiffResult:
    """Compare two read checkpoints. `a_dir` / `b_dir`: where their files are (default: `Checkpoint.data_dir`); only
    `values=True` reads files. `tolerance`: `--atol` / `--rtol` for values and `--ignore` key globs (keys left out on
    both sides). Never raises for a broken checkpoint: what could not be compared becomes `notes` or
    `values.skipped`."""
    notes: list[str] = []
    for side, c in (("A", a), ("B", b)):
        if _unread(c):
            n = sum(f.code == UNREAD_CODE for f in c.findings)
            notes.append(f"{side}: {n} file(s) or dir(s) could not be read here (CK209: permission denied or I/O "
                         "error): the comparison is partial, so blocking")
        if c.format is None:
            notes.append(f"{side} ({c.path}) is not a recognized checkpoint: nothing to compare on that side")
        if c.args is None and c.format is not None:
            why = " (plain DCP checkpoints carry none)" if c.format in (Format.TORCH_DCP, Format.FSDP_DTENSOR) else ""
            notes.append(f"{side} has no training args{why}: args not compared")
        elif any(f.severity.value == "error" for f in c.findings):
            codes = sorted({f.code for f in c.findings if f.severity.value == "error"})
            notes.append(f"{side} was read with errors ({', '.join(codes)}): the comparison may be partial")
    if is_conversion(a, b):
        conv = compare_conversion(a, b, atol=tolerance.atol, rtol=tolerance.rtol, ignore=tolerance.ignore)
        notes.append(f"conversion diff ({conv.direction}): every Megatron parameter mapped to the Hugging Face "
                     "export and compared value by value (always, with or without --values)")
        return DiffResult(_side(a), _side(b), (), (), KeyDiff(False), KeyDiff(False), None, tuple(notes), conv)
    both_legacy = a.format is Format.TORCH and b.format is Format.TORCH
    args = diff_args(a.args, b.args, both_legacy) if a.args is not None and b.args is not None else ()
    names_a, names_b = tolerance.kept(_names(a)), tolerance.kept(_names(b))
    if tolerance.ignore:
        left_out = (len(_names(a)) - len(names_a), len(_names(b)) - len(names_b))
        notes.append(f"--ignore {' '.join(tolerance.ignore)}: {left_out[0]} tensor key(s) of A and {left_out[1]} of "
                     "B left out")
    if both_legacy or (a.format in _GLOBAL and b.format in _GLOBAL):
        tensors = diff_tensors(names_a, names_b)
        if tensors.common == 0 and a.tensors and b.tensors:
            notes.append("no tensor key in common: different models or naming schemes")
        fmt_a, fmt_b = optim.formats(names_a, a.objects), optim.formats(names_b, b.objects)
        only_a, only_b, summary = optim.summarise(tensors.only_in_a, tensors.only_in_b, fmt_a, fmt_b)
        if summary or (fmt_a and fmt_b and fmt_a != fmt_b):
            notes.append(optim.describe({"A": fmt_a, "B": fmt_b}))
            tensors = KeyDiff(True, tensors.common, only_a, only_b, tensors.changed, tensors.renamed, summary)
    else:
        tensors = KeyDiff(False)
        if a.format is not None and b.format is not None:
            notes.append(f"tensors not comparable across formats ({a.format.value} vs {b.format.value}): legacy "
                         "files hold per-rank local tensors, the others global tensors; only args compared")
    objects = diff_objects(a.objects, b.objects) if tensors.comparable else KeyDiff(False)
    report: ValuesReport | None = None
    if values:
        if not tensors.comparable:
            notes.append("values not compared: tensors are not comparable")
            report = ValuesReport((), (), (), 0)
        else:
            aligned_b = {**names_b, **{ka: names_b[kb] for ka, kb in tensors.renamed}}  # B's tensor under A's key
            vchanges, report = _compare_values(a, b, names_a, aligned_b, tensors, a_dir, b_dir, progress, tolerance)
            tensors = KeyDiff(True, tensors.common, tensors.only_in_a, tensors.only_in_b, tensors.changed + vchanges,
                              tensors.renamed, tensors.optimizer)
    meta = diff_meta(a, b) if a.format is not None and b.format is not None else ()
    return DiffResult(_side(a), _side(b), args, meta, tensors, objects, report, tuple(notes))


def _root(c: Checkpoint, given: Path | None) -> ChunkSource:
    if given is None:
        return ChunkSource.of(c, location(c.data_dir))  # where the reader found its files
    if given.is_file():  # a single legacy `.pt` file: StoredItem.file is relative to its dir
        given = given.parent
    return ChunkSource.of(c, given)


def _compare_values(
    a: Checkpoint, b: Checkpoint, ta: Mapping[str, Tensor], tb: Mapping[str, Tensor], tensors: KeyDiff,
    a_dir: Path | None, b_dir: Path | None, progress: ProgressHook | None, tol: Tolerance = Tolerance(),
) -> tuple[tuple[Change, ...], ValuesReport]:
    src_a, src_b = _root(a, a_dir), _root(b, b_dir)
    structural = {c.key for c in tensors.changed if c.what in (What.SHAPE, What.DTYPE)}
    skipped: list[tuple[str, str]] = []
    todo: list[str] = []
    for k in sorted(set(ta) & set(tb)):
        restorable = reformulated(ta[k]) or reformulated(tb[k])  # compared in the original shape
        why = "shape or dtype differs" if k in structural else (
            "stored shapes differ" if ta[k].shape != tb[k].shape and not restorable else supported(ta[k].dtype))
        if why:
            skipped.append((k, why))
        else:
            todo.append(k)
    total = sum(ta[k].nbytes for k in todo)
    changes: list[Change] = []
    compared: list[str] = []
    identical: list[str] = []
    elements = 0
    by_fp: list[str] = []
    for k in todo:
        def advance(n: int, k: str = k) -> None:
            if progress is not None:
                progress(n, total, k)
        if a_dir is None and b_dir is None and ta[k].shape == tb[k].shape and same_values(a, ta[k], b, tb[k]):
            compared.append(k)  # equal fingerprints: every element equal, none compared one by one
            identical.append(k)
            by_fp.append(k)
            advance(ta[k].nbytes)
            continue
        try:
            if ta[k].shape != tb[k].shape:  # one side N-D reformulated: compared whole, in the original shape
                r: ValueComparison = compare_logical(ta[k], src_a, tb[k], src_b)
                advance(ta[k].nbytes)
            else:
                r = compare_tensor_values(ta[k], src_a, tb[k], src_b, advance, tol.atol, tol.rtol)
        except (ReadError, OSError, ValueError) as e:
            skipped.append((k, str(e)))
            continue
        compared.append(k)
        elements += r.compared_elements
        if r.identical:
            identical.append(k)
        else:
            changes.append(Change(k, What.VALUES, r.a_value, r.b_value, False, r.max_abs_diff,
                                  r.mismatched_elements, r.compared_elements, r.first_mismatch))
        if r.uncovered_elements:
            skipped.append((k, f"{r.uncovered_elements} of {ta[k].numel} elements not covered on both sides"))
    return tuple(changes), ValuesReport(tuple(compared), tuple(identical), tuple(skipped), elements, tuple(by_fp),
                                        tol.atol, tol.rtol)


def diff_paths(a: Path, b: Path, *, values: bool = False, progress: ProgressHook | None = None,
               a_label: str | None = None, b_label: str | None = None, tolerance: Tolerance = Tolerance()
               ) -> DiffResult:
    """`diff A B` on paths: a save dir resolves to the checkpoint a resume would pick, then both are read.

    Raises `UsageError` when a path does not exist or a save dir has nothing to pick (exit 2 at the CLI)."""
    pa, la = resolve_checkpoint(a, a_label)
    pb, lb = resolve_checkpoint(b, b_label)
    ca = read_checkpoint(pa, la)
    cb = read_checkpoint(pb, lb)
    return diff_checkpoints(ca, cb, values=values, progress=progress, tolerance=tolerance)  # files: its `data_dir`
