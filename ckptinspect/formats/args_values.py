"""Training args values: the one boundary where a value read from a checkpoint's `args` is checked (type + range).

Megatron-LM saves `args` (an `argparse.Namespace`) in `common.pt`, the `common_state` item or every legacy
`model_optim_rng.pt`; Megatron-Bridge / NeMo configs become the same dict (`formats/run_config.py`). Nothing but
argparse guarantees the values: a hand-edited, converted or damaged args can hold `"x"`, `inf`, `-1`, `True` or
`10**30` where a size is expected. Every reader asks this module (`arg_int`, `arg_flag`, `arg_text`), so a value
outside its spec is read as absent everywhere alike — the reader falls back to the on-disk layout or Megatron's
default and says so — and `args_findings` reports it once per checkpoint (CK703, naming the arg).

`ARG_SPECS` lists the args ckptinspect reads; an arg it does not read is not judged (it is shown, never used).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.findings import Finding
from ckptinspect.model import StrEnum

# Upper bounds: far above any real run, low enough that loops over a grid (shard dirs, rng cells) stay bounded.
MAX_PARALLEL = 1 << 20  # TP, PP, EP, ETP, CP, VPP, DP and world size: a million ranks
MAX_DIM = 1 << 40  # layer counts, hidden sizes, vocabulary, batch and sequence sizes
MAX_COUNT = 1 << 62  # counters (iteration, consumed samples)


class ArgKind(StrEnum):
    """What an arg must hold. None (argparse's "not given") is valid for every kind and reads as absent."""

    SIZE = "size"  # a positive int up to `hi`
    COUNT = "count"  # a non-negative int up to `hi`
    FLAG = "flag"  # a bool (argparse store_true / store_false)
    TEXT = "text"  # a str


@dataclass(frozen=True, slots=True)
class ArgSpec:
    kind: ArgKind
    hi: int = 0  # inclusive upper bound of SIZE / COUNT

    def expected(self) -> str:
        if self.kind is ArgKind.SIZE:
            return f"a positive integer up to {self.hi}"
        if self.kind is ArgKind.COUNT:
            return f"a non-negative integer up to {self.hi}"
        return "true or false" if self.kind is ArgKind.FLAG else "a string"


def _specs(kind: ArgKind, hi: int, *names: str) -> dict[str, ArgSpec]:
    return {n: ArgSpec(kind, hi) for n in names}


ARG_SPECS: Mapping[str, ArgSpec] = {
    **_specs(ArgKind.SIZE, MAX_PARALLEL, "tensor_model_parallel_size", "model_parallel_size",
             "pipeline_model_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
             "context_parallel_size", "data_parallel_size", "world_size", "virtual_pipeline_model_parallel_size",
             "num_experts", "num_moe_experts"),
    **_specs(ArgKind.SIZE, MAX_DIM, "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
             "num_query_groups", "kv_channels", "padded_vocab_size", "vocab_size", "make_vocab_size_divisible_by",
             "seq_length", "max_position_embeddings", "global_batch_size", "micro_batch_size",
             "moe_ffn_hidden_size", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
             "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
    **_specs(ArgKind.COUNT, MAX_COUNT, "iteration", "consumed_train_samples", "consumed_valid_samples",
             "train_iters"),
    **_specs(ArgKind.FLAG, 0, "use_distributed_optimizer", "ckpt_fully_parallel_save", "async_save",
             "no_save_optim", "no_save_rng", "group_query_attention", "untie_embeddings_and_output_weights",
             "data_parallel_random_init", "account_for_embedding_in_pipeline_split",
             "account_for_loss_in_pipeline_split"),
    **_specs(ArgKind.TEXT, 0, "optimizer", "tokenizer_type", "vocab_file", "ckpt_format"),
}


def _valid(spec: ArgSpec, v: Any) -> bool:
    if v is None:
        return True
    if spec.kind is ArgKind.FLAG:
        return isinstance(v, bool)
    if spec.kind is ArgKind.TEXT:
        return isinstance(v, str)
    if not isinstance(v, int) or isinstance(v, bool):
        return False  # "x", 2.0, inf, nan, True: argparse's type=int never makes them
    lo = 1 if spec.kind is ArgKind.SIZE else 0
    return lo <= v <= spec.hi


def _spec(name: str) -> ArgSpec:
    # an int arg a reader asks for that the table does not list yet: judged as a dimension
    return ARG_SPECS.get(name, ArgSpec(ArgKind.SIZE, MAX_DIM))


def arg_value(args: Mapping[str, Any] | None, name: str) -> Any:
    """`args[name]` when it holds a value of its spec, else None (absent, None, or invalid — `args_findings`
    reports the invalid ones)."""
    if not args:
        return None
    v = args.get(name)
    return v if v is not None and _valid(_spec(name), v) else None


def arg_int(args: Mapping[str, Any] | None, *names: str) -> int | None:
    """The first of `names` whose value is a valid int of its spec (positive for sizes), else None."""
    for n in names:
        v = arg_value(args, n)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def arg_stored_int(args: Mapping[str, Any] | None, name: str) -> int | None:
    """The int stored under `name` whatever its range (not a bool, not a float): only to compare it with what the
    disk shows (CK702: a 0 disagrees with a grid of 2), never to size anything by. Other types are None."""
    v = args.get(name) if args else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def arg_flag(args: Mapping[str, Any] | None, name: str, default: bool = False) -> bool:
    """A bool arg; `default` when absent or not a bool (a `"False"` string is not read as true)."""
    v = arg_value(args, name)
    return v if isinstance(v, bool) else default


def arg_text(args: Mapping[str, Any] | None, name: str, default: str | None = None) -> str | None:
    v = arg_value(args, name)
    return v if isinstance(v, str) else default


def invalid_args(args: Mapping[str, Any] | None) -> Iterator[tuple[str, Any, ArgSpec]]:
    """(name, value, spec) of every listed arg whose value fails its spec, in table order."""
    if not args:
        return
    for name, spec in ARG_SPECS.items():
        if name in args and not _valid(spec, args[name]):
            yield name, args[name], spec


def _shown(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def args_findings(args: Mapping[str, Any] | None, label: str, source: str = "args") -> tuple[Finding, ...]:
    """CK703 for every listed arg whose value fails its spec: the arg is read as absent (the layout or Megatron's
    default is used instead, and `topology_sources` says which)."""
    out = []
    for name, v, spec in invalid_args(args):
        out.append(Finding("CK703", f"args.{name} = {_shown(v)} is not {spec.expected()} ({type(v).__name__}): "
                           "read as absent (the on-disk layout or Megatron's default is used instead)",
                           f"args.{name}", label,
                           {"arg": name, "value": _shown(v), "type": type(v).__name__, "expected": spec.expected(),
                            "source": source}))
    return tuple(out)
