"""`diff`: compare two checkpoints — training args, checkpoint facts, tensor keys/shapes/dtypes/chunk layouts,
sharded-object families, and (with `values=True`) tensor contents.

What is *blocking* (CONTRACT.md "diff"): a difference that breaks a resume or a like-for-like comparison — the args
Megatron's `check_checkpoint_args` asserts on (megatron/training/checkpointing.py), the architecture args
`load_args_from_checkpoint` copies from a checkpoint, and any tensor key/shape/dtype change. Progress counters,
runtime paths, parallel sizes (torch_dist reshards), chunk layouts and object grids are reported, never blocking.

Tensors are matched by key only between formats that name them the same way: the global formats (torch_dist,
torch_dcp, fsdp_dtensor) among themselves, and legacy `torch` with legacy `torch` (per shard dir). Between a legacy
and a global checkpoint the keys and shapes mean different things (per-rank local tensors vs global tensors); the
result says so in `notes` instead of listing every key on both sides.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.formats.resolve import resolve_checkpoint
from ckptinspect.errors import ReadError
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import Checkpoint, Format, ObjectItem, Tensor
from ckptinspect.values import ChunkSource, ValueComparison, compare_tensor_values, supported

Progress = Callable[[int, int, str], None]
"""`progress(advance, total, description)`: `advance` bytes of A's chunks done out of `total`."""


class Category(enum.Enum):
    ARCHITECTURE = "architecture"
    PARALLELISM = "parallelism"
    OPTIMIZER = "optimizer"
    SCHEDULE = "schedule"
    DATA = "data"
    PROGRESS = "progress"
    RUNTIME = "runtime"
    OTHER = "other"


class What(enum.Enum):
    """What changed about a tensor (or an object family: only `layout`)."""

    SHAPE = "shape"
    DTYPE = "dtype"
    LAYOUT = "layout"
    VALUES = "values"


# --- args ---------------------------------------------------------------------------------------------------------

# `check_checkpoint_args`: always num_layers, hidden_size, num_attention_heads, add_position_embedding (default
# True), gdp_num_householder (default 3); with a vocab file max_position_embeddings, make_vocab_size_divisible_by,
# padded_vocab_size, tokenizer_type; data_parallel_random_init when set.
CHECKED = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "add_position_embedding", "gdp_num_householder",
    "max_position_embeddings", "make_vocab_size_divisible_by", "padded_vocab_size", "tokenizer_type",
    "data_parallel_random_init",
})
# Compared without a default: a checkpoint lacking them makes Megatron raise.
CHECKED_NO_DEFAULT = frozenset({"num_layers", "hidden_size", "num_attention_heads"})
CHECK_DEFAULTS: Mapping[str, Any] = {"add_position_embedding": True, "gdp_num_householder": 3}
# `load_args_from_checkpoint` model args that define the network (which tensors exist, their shapes and meaning).
ARCHITECTURE_BLOCKING = frozenset({
    "ffn_hidden_size", "num_query_groups", "group_query_attention", "kv_channels", "position_embedding_type",
    "use_rotary_position_embeddings", "rotary_base", "rotary_percent", "rotary_interleaved", "add_bias_linear",
    "add_qkv_bias", "squared_relu", "swiglu", "untie_embeddings_and_output_weights", "apply_layernorm_1p",
    "normalization", "apply_query_key_layer_scaling", "mtp_num_layers", "mtp_hybrid_override_pattern", "spec",
    "num_experts", "moe_layer_freq", "moe_ffn_hidden_size", "moe_grouped_gemm", "moe_shared_expert_intermediate_size",
    "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads", "hybrid_layer_pattern",
    "hybrid_override_pattern", "heterogeneous_layers_config_path", "heterogeneous_layers_config_encoded_json",
    "moe_latent_size", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
    "v_head_dim", "qk_layernorm", "disable_bias_linear",
})
BLOCKING_ARGS = CHECKED | ARCHITECTURE_BLOCKING

_CATEGORIES: Mapping[Category, frozenset[str]] = {
    Category.ARCHITECTURE: BLOCKING_ARGS - {"data_parallel_random_init"} | frozenset({
        "attention_dropout", "hidden_dropout", "moe_router_topk", "moe_token_dispatcher_type",
        "moe_router_pre_softmax", "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_score_function",
        "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor", "init_method_std", "norm_epsilon",
        "layernorm_epsilon", "rotary_scaling_factor", "mscale", "mscale_all_dim", "activation_func",
        "gated_linear_unit",
    }),
    Category.PARALLELISM: frozenset({
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size",
        "world_size", "sequence_parallel", "model_parallel_size", "decoder_first_pipeline_num_layers",
        "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout", "num_distributed_optimizer_instances",
        "data_parallel_sharding_strategy", "use_torch_fsdp2", "use_megatron_fsdp", "overlap_grad_reduce",
        "overlap_param_gather", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "data_parallel_random_init", "ddp_bucket_size", "num_layers_per_virtual_pipeline_stage",
    }),
    Category.OPTIMIZER: frozenset({
        "optimizer", "lr", "min_lr", "adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum", "weight_decay",
        "start_weight_decay", "end_weight_decay", "weight_decay_incr_style", "clip_grad", "loss_scale",
        "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis", "fp16", "bf16", "fp8", "params_dtype",
        "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "use_distributed_optimizer",
        "use_precision_aware_optimizer", "dist_ckpt_optim_fully_reshardable", "accumulate_allreduce_grads_in_fp32",
        "grad_reduce_in_bf16", "decoupled_lr", "decoupled_min_lr",
    }),
    Category.SCHEDULE: frozenset({
        "train_iters", "train_samples", "lr_decay_style", "lr_decay_iters", "lr_decay_samples", "lr_warmup_iters",
        "lr_warmup_samples", "lr_warmup_fraction", "lr_warmup_init", "lr_wsd_decay_style", "lr_wsd_decay_iters",
        "lr_wsd_decay_samples", "global_batch_size", "micro_batch_size", "rampup_batch_size", "eval_iters",
        "eval_interval", "exit_interval", "exit_duration_in_mins", "phase_transition_iterations",
        "override_opt_param_scheduler", "use_checkpoint_opt_param_scheduler",
    }),
    Category.DATA: frozenset({
        "data_path", "train_data_path", "valid_data_path", "test_data_path", "split", "data_cache_path", "seq_length",
        "encoder_seq_length", "decoder_seq_length", "seed", "vocab_file", "merge_file", "mock_data", "num_workers",
        "dataloader_type", "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "data_args_path",
        "per_split_data_args_path", "blend", "blend_per_split", "vocab_size", "tokenizer_model", "tiktoken_pattern",
    }),
    Category.PROGRESS: frozenset({"iteration", "curr_iteration", "num_floating_point_operations_so_far"}),
    Category.RUNTIME: frozenset({
        "save", "load", "pretrained_checkpoint", "save_interval", "ckpt_format", "async_save",
        "ckpt_fully_parallel_save", "ckpt_fully_parallel_load", "ckpt_assume_constant_structure", "use_dist_ckpt",
        "auto_detect_ckpt_format", "finetune", "no_load_optim", "no_load_rng", "no_save_optim", "no_save_rng",
        "use_checkpoint_args", "use_mp_args_from_checkpoint_args", "tensorboard_dir", "wandb_project",
        "wandb_exp_name", "wandb_save_dir", "log_interval", "rank", "local_rank", "distributed_backend",
        "distributed_timeout_minutes", "dataloader_save", "non_persistent_save_interval", "non_persistent_ckpt_type",
        "exit_signal_handler", "timing_log_level", "ckpt_step", "verify_integrity",
    }),
}
_PROGRESS_PREFIXES = ("consumed_", "skipped_")
_RUNTIME_PREFIXES = ("log_", "wandb_", "tensorboard_", "profile", "timing_", "ckpt_", "non_persistent_")


def categorize(name: str) -> Category:
    """The category of a training arg (unknown args: `other`)."""
    for cat, names in _CATEGORIES.items():
        if name in names:
            return cat
    if name.startswith(_PROGRESS_PREFIXES):
        return Category.PROGRESS
    if name.startswith(_RUNTIME_PREFIXES):
        return Category.RUNTIME
    if name.startswith(("moe_", "mamba_", "rotary_", "mtp_")):
        return Category.ARCHITECTURE
    return Category.OTHER


_MISSING = object()


@dataclass(frozen=True, slots=True)
class ArgDiff:
    """One differing arg (or checkpoint fact). `missing` names the side that lacks it ("a"/"b"), None when both
    have it. `reason` says why it is (not) blocking when that is not obvious from the category."""

    name: str
    a: Any
    b: Any
    category: Category
    blocking: bool
    missing: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "category": self.category.value,
                "blocking": self.blocking, "missing": self.missing, "reason": self.reason}


def diff_args(a: Mapping[str, Any], b: Mapping[str, Any], both_legacy: bool = False) -> tuple[ArgDiff, ...]:
    """Every arg whose value differs between `a` and `b` (missing on one side counts), classified."""
    phase = bool(a.get("phase_transition_iterations") or b.get("phase_transition_iterations"))
    out: list[ArgDiff] = []
    for name in sorted(set(a) | set(b)):
        va, vb = _plain(a.get(name, _MISSING)), _plain(b.get(name, _MISSING))
        if va == vb:
            continue
        missing = "a" if va is _MISSING else "b" if vb is _MISSING else None
        blocking, reason = _blocking(name, va, vb, missing, both_legacy, phase)
        out.append(ArgDiff(name, None if va is _MISSING else va, None if vb is _MISSING else vb, categorize(name),
                           blocking, missing, reason))
    return tuple(sorted(out, key=lambda d: (not d.blocking, list(Category).index(d.category), d.name)))


def _blocking(name: str, va: Any, vb: Any, missing: str | None, both_legacy: bool,
              phase: bool) -> tuple[bool, str | None]:
    if name in ("tensor_model_parallel_size", "pipeline_model_parallel_size") and both_legacy:
        return True, "legacy checkpoints cannot be resharded (check_checkpoint_args compares it)"
    if name == "global_batch_size" and phase:
        return True, "check_checkpoint_args compares it with phase_transition_iterations"
    if name not in BLOCKING_ARGS:
        return False, None
    if missing is not None:
        present = vb if missing == "a" else va
        if name in CHECK_DEFAULTS:
            same = CHECK_DEFAULTS[name] == present
            return (not same, f"missing in {missing.upper()}: Megatron's default ({CHECK_DEFAULTS[name]!r}) "
                    + ("matches" if same else "differs"))
        if name in CHECKED_NO_DEFAULT:
            return True, f"missing in {missing.upper()}: check_checkpoint_args would raise"
        return False, f"missing in {missing.upper()}: Megatron keeps the run's value"
    src = "check_checkpoint_args compares it" if name in CHECKED else "architecture (load_args_from_checkpoint)"
    return True, src


def _plain(v: Any) -> Any:
    """Arg values as JSON-able plain data (tuples as lists, unknown objects as their str)."""
    if v is _MISSING or v is None or isinstance(v, (bool, int, float, str)):
        return str(v) if isinstance(v, str) and type(v) is not str else v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def diff_meta(a: Checkpoint, b: Checkpoint) -> tuple[ArgDiff, ...]:
    """Checkpoint-level facts that differ: format, generation, iteration, topology, optimizer sharding, common state."""
    rows: list[ArgDiff] = []

    def add(name: str, va: Any, vb: Any, cat: Category) -> None:
        va, vb = _plain(va), _plain(vb)
        if va != vb:
            rows.append(ArgDiff(name, va, vb, cat, False))

    add("format", a.format.value if a.format else None, b.format.value if b.format else None, Category.OTHER)
    add("generation", a.generation, b.generation, Category.OTHER)
    add("iteration", a.iteration, b.iteration, Category.PROGRESS)
    for k, va in a.topology.to_dict().items():
        add(f"topology.{k}", va, b.topology.to_dict()[k], Category.PARALLELISM)
    add("optimizer_sharding", a.optimizer_sharding, b.optimizer_sharding, Category.OPTIMIZER)
    ca, cb = a.common or {}, b.common or {}
    add("checkpoint_version", ca.get("checkpoint_version"), cb.get("checkpoint_version"), Category.OTHER)
    add("num_floating_point_operations_so_far", ca.get("num_floating_point_operations_so_far"),
        cb.get("num_floating_point_operations_so_far"), Category.PROGRESS)
    ma, mb = ca.get("content_metadata"), cb.get("content_metadata")
    ma, mb = (ma if isinstance(ma, dict) else {}), (mb if isinstance(mb, dict) else {})
    for k in sorted(set(ma) | set(mb), key=str):
        add(f"content_metadata.{k}", ma.get(k), mb.get(k), Category.OPTIMIZER)
    return tuple(rows)


# --- tensors and objects ------------------------------------------------------------------------------------------

_GLOBAL = (Format.TORCH_DIST, Format.TORCH_DCP, Format.FSDP_DTENSOR)
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
    """Keys only on one side and changes of the common ones. `comparable` False: the keys could not be matched."""

    comparable: bool
    common: int = 0
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    changed: tuple[Change, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.only_in_a or self.only_in_b or self.changed)

    def to_dict(self) -> dict[str, Any]:
        return {"comparable": self.comparable, "common": self.common, "only_in_a": list(self.only_in_a),
                "only_in_b": list(self.only_in_b), "changed": [c.to_dict() for c in self.changed]}


def _names(ckpt: Checkpoint) -> dict[str, Tensor]:
    """Tensors by comparable name: the key (global formats) or ``<shard dir>/<key>`` (legacy)."""
    return {(f"{t.shard}/{t.key}" if t.shard else t.key): t for t in ckpt.tensors}


def _layout(t: Tensor) -> dict[str, Any]:
    grid = [len({c.offsets[i] for c in t.chunks if len(c.offsets) > i}) for i in range(len(t.shape))]
    return {"chunks": len(t.chunks), "grid": grid}


def diff_tensors(ta: Mapping[str, Tensor], tb: Mapping[str, Tensor]) -> KeyDiff:
    changed: list[Change] = []
    common = sorted(set(ta) & set(tb))
    for k in common:
        x, y = ta[k], tb[k]
        sa, sb = x.orig_shape or x.shape, y.orig_shape or y.shape
        if sa != sb:
            changed.append(Change(k, What.SHAPE, list(sa), list(sb), True))
        if x.dtype != y.dtype:
            changed.append(Change(k, What.DTYPE, x.dtype, y.dtype, True))
        if sa != sb:
            continue
        if x.shape != y.shape:
            changed.append(Change(k, What.LAYOUT, list(x.shape), list(y.shape), False,
                                  note="stored shapes differ (N-D reformulated tensor), logical shape is the same"))
        elif sorted((c.offsets, c.sizes) for c in x.chunks) != sorted((c.offsets, c.sizes) for c in y.chunks):
            changed.append(Change(k, What.LAYOUT, _layout(x), _layout(y), False))
    return KeyDiff(True, len(common), tuple(sorted(set(ta) - set(tb))), tuple(sorted(set(tb) - set(ta))),
                   tuple(changed))


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

    def to_dict(self) -> dict[str, Any]:
        return {"compared": len(self.compared), "identical": len(self.identical),
                "changed": len(self.compared) - len(self.identical), "identical_keys": list(self.identical),
                "skipped": [{"key": k, "reason": r} for k, r in self.skipped],
                "elements_compared": self.elements_compared}


@dataclass(frozen=True, slots=True)
class Side:
    """One compared checkpoint, as the result names it."""

    path: str
    format: str | None
    generation: str | None
    iteration: int | None
    has_args: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "generation": self.generation,
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

    @property
    def blocking(self) -> bool:
        """A blocking arg, a tensor key only on one side, a shape/dtype change, or a side that is no checkpoint."""
        t = self.tensors
        return (any(d.blocking for d in self.args) or any(c.blocking for c in t.changed)
                or bool(t.only_in_a or t.only_in_b) or self.a.format is None or self.b.format is None)

    @property
    def identical(self) -> bool:
        return (not self.args and not self.meta and self.tensors.comparable and self.tensors.empty
                and self.objects.empty and self.a.has_args == self.b.has_args and not self.blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical, "blocking": self.blocking, "a": self.a.to_dict(), "b": self.b.to_dict(),
            "args": [d.to_dict() for d in self.args], "checkpoint": [d.to_dict() for d in self.meta],
            "tensors": self.tensors.to_dict(), "objects": self.objects.to_dict(),
            "values": self.values.to_dict() if self.values is not None else None, "notes": list(self.notes),
        }


def _side(c: Checkpoint) -> Side:
    return Side(c.path, c.format.value if c.format else None, c.generation, c.iteration, c.args is not None)


def _num(x: float | None) -> float | str | None:
    return x if x is None or x == x and abs(x) != float("inf") else str(x)


def diff_checkpoints(
    a: Checkpoint, b: Checkpoint, *, values: bool = False, progress: Progress | None = None,
    a_dir: Path | None = None, b_dir: Path | None = None,
) -> DiffResult:
    """Compare two read checkpoints. `a_dir` / `b_dir`: where their files are (default: `Checkpoint.path`); only
    `values=True` reads files. Never raises for a broken checkpoint: what could not be compared becomes `notes` or
    `values.skipped`."""
    notes: list[str] = []
    for side, c in (("A", a), ("B", b)):
        if c.format is None:
            notes.append(f"{side} ({c.path}) is not a recognized checkpoint: nothing to compare on that side")
        if c.args is None and c.format is not None:
            why = " (plain DCP checkpoints carry none)" if c.format in (Format.TORCH_DCP, Format.FSDP_DTENSOR) else ""
            notes.append(f"{side} has no training args{why}: args not compared")
        elif any(f.severity.value == "error" for f in c.findings):
            codes = sorted({f.code for f in c.findings if f.severity.value == "error"})
            notes.append(f"{side} was read with errors ({', '.join(codes)}): the comparison may be partial")
    both_legacy = a.format is Format.TORCH and b.format is Format.TORCH
    args = diff_args(a.args, b.args, both_legacy) if a.args is not None and b.args is not None else ()
    if both_legacy or (a.format in _GLOBAL and b.format in _GLOBAL):
        tensors = diff_tensors(_names(a), _names(b))
        if tensors.common == 0 and a.tensors and b.tensors:
            notes.append("no tensor key in common: different models or naming schemes")
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
            vchanges, report = _compare_values(a, b, _names(a), _names(b), tensors, a_dir, b_dir, progress)
            tensors = KeyDiff(True, tensors.common, tensors.only_in_a, tensors.only_in_b, tensors.changed + vchanges)
    meta = diff_meta(a, b) if a.format is not None and b.format is not None else ()
    return DiffResult(_side(a), _side(b), args, meta, tensors, objects, report, tuple(notes))


def _root(c: Checkpoint, given: Path | None) -> ChunkSource:
    root = given if given is not None else Path(c.path)
    if root.is_file():  # a single legacy `.pt` file: StoredItem.file is relative to its dir
        root = root.parent
    return ChunkSource(root, raw=c.format is Format.TORCH)


def _compare_values(
    a: Checkpoint, b: Checkpoint, ta: Mapping[str, Tensor], tb: Mapping[str, Tensor], tensors: KeyDiff,
    a_dir: Path | None, b_dir: Path | None, progress: Progress | None,
) -> tuple[tuple[Change, ...], ValuesReport]:
    src_a, src_b = _root(a, a_dir), _root(b, b_dir)
    structural = {c.key for c in tensors.changed if c.what in (What.SHAPE, What.DTYPE)}
    skipped: list[tuple[str, str]] = []
    todo: list[str] = []
    for k in sorted(set(ta) & set(tb)):
        why = "shape or dtype differs" if k in structural else (
            "stored shapes differ" if ta[k].shape != tb[k].shape else supported(ta[k].dtype))
        if why:
            skipped.append((k, why))
        else:
            todo.append(k)
    total = sum(ta[k].nbytes for k in todo)
    changes: list[Change] = []
    compared: list[str] = []
    identical: list[str] = []
    elements = 0
    for k in todo:
        def advance(n: int, k: str = k) -> None:
            if progress is not None:
                progress(n, total, k)
        try:
            r: ValueComparison = compare_tensor_values(ta[k], src_a, tb[k], src_b, advance)
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
    return tuple(changes), ValuesReport(tuple(compared), tuple(identical), tuple(skipped), elements)


def diff_paths(a: Path, b: Path, *, values: bool = False, progress: Progress | None = None,
               a_label: str | None = None, b_label: str | None = None) -> DiffResult:
    """`diff A B` on paths: a save dir resolves to the checkpoint a resume would pick, then both are read.

    Raises `UsageError` when a path does not exist or a save dir has nothing to pick (exit 2 at the CLI)."""
    pa, la = resolve_checkpoint(a, a_label)
    pb, lb = resolve_checkpoint(b, b_label)
    ca = read_checkpoint(pa, la)
    cb = read_checkpoint(pb, lb)
    return diff_checkpoints(ca, cb, values=values, progress=progress, a_dir=pa, b_dir=pb)
