"""The args half of `diff`: which training args Megatron checks on load (the tables), the category of every arg,
and the classified `ArgDiff` rows for differing args (`diff_args`) and checkpoint-level facts (`diff_meta`).

Blocking args (docs/contract.md "diff"): the ones Megatron's `check_checkpoint_args` asserts on
(megatron/training/checkpointing.py) and the architecture args `load_args_from_checkpoint` copies from a checkpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.model import Checkpoint, StrEnum


class Category(enum.Enum):
    ARCHITECTURE = "architecture"
    PARALLELISM = "parallelism"
    OPTIMIZER = "optimizer"
    SCHEDULE = "schedule"
    DATA = "data"
    PROGRESS = "progress"
    RUNTIME = "runtime"
    OTHER = "other"


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


class Which(StrEnum):
    """One side of a diff: A (the first checkpoint) or B."""

    A = "a"
    B = "b"


@dataclass(frozen=True, slots=True)
class ArgDiff:
    """One differing arg (or checkpoint fact). `missing` names the side that lacks it (A / B), None when both
    have it. `reason` says why it is (not) blocking when that is not obvious from the category."""

    name: str
    a: Any
    b: Any
    category: Category
    blocking: bool
    missing: Which | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "category": self.category.value,
                "blocking": self.blocking, "missing": self.missing.value if self.missing else None, "reason": self.reason}


def diff_args(a: Mapping[str, Any], b: Mapping[str, Any], both_legacy: bool = False) -> tuple[ArgDiff, ...]:
    """Every arg whose value differs between `a` and `b` (missing on one side counts), classified."""
    phase = bool(a.get("phase_transition_iterations") or b.get("phase_transition_iterations"))
    out: list[ArgDiff] = []
    for name in sorted(set(a) | set(b)):
        va, vb = _plain(a.get(name, _MISSING)), _plain(b.get(name, _MISSING))
        if va == vb:
            continue
        missing = Which.A if va is _MISSING else Which.B if vb is _MISSING else None
        blocking, reason = _blocking(name, va, vb, missing, both_legacy, phase)
        out.append(ArgDiff(name, None if va is _MISSING else va, None if vb is _MISSING else vb, categorize(name),
                           blocking, missing, reason))
    return tuple(sorted(out, key=lambda d: (not d.blocking, list(Category).index(d.category), d.name)))


def _blocking(name: str, va: Any, vb: Any, missing: Which | None, both_legacy: bool,
              phase: bool) -> tuple[bool, str | None]:
    if name in ("tensor_model_parallel_size", "pipeline_model_parallel_size") and both_legacy:
        return True, "legacy checkpoints cannot be resharded (check_checkpoint_args compares it)"
    if name == "global_batch_size" and phase:
        return True, "check_checkpoint_args compares it with phase_transition_iterations"
    if name not in BLOCKING_ARGS:
        return False, None
    if missing is not None:
        present = vb if missing is Which.A else va
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
