"""`resume`: predict what a Megatron resume with another topology restores, drops, or fails on.

`predict_resume(ckpt, target)` runs the decision table `RULES` over facts derived once from the checkpoint
(`_facts`). Each rule models one branch of Megatron's load path and names it in `source`. Sources read:
[LM] Megatron-LM `megatron/training/checkpointing.py` @0032978f (`load_checkpoint`, `check_checkpoint_args`),
[tok] `megatron/training/tokenizer/tokenizer.py` @00ee9667 (`build_tokenizer`, `_vocab_size_with_padding`),
[mc] megatron-core 0.16.1 as installed (file:line).

Per component the first firing rule decides; every other firing `fails` rule is appended to the reason, so one
run shows every problem. Components are predicted independently: Megatron's load is all-or-nothing, so any
`fails` means nothing is restored (verdict `fails`), but the other outcomes say what a fixed run would do.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ckptinspect.errors import UsageError
from ckptinspect.findings import Severity
from ckptinspect.model import Checkpoint, Format


class Outcome(enum.Enum):
    """What a resume does with one component (CONTRACT.md `resume` outcomes)."""

    LOADED = "loaded"
    RESHARDED = "resharded"
    SKIPPED = "skipped"
    DROPPED = "dropped"
    FAILS = "fails"
    ABSENT = "absent"


class Verdict(enum.Enum):
    OK = "ok"
    LOSSY = "lossy"
    FAILS = "fails"


class Component(enum.Enum):
    MODEL = "model"
    OPTIMIZER = "optimizer"
    RNG = "rng"
    RERUN_STATE = "rerun_state"
    SCHEDULER = "scheduler"
    ITERATION = "iteration"


SOURCES: Mapping[str, str] = {
    "[LM]": "Megatron-LM megatron/training/checkpointing.py @0032978f",
    "[tok]": "Megatron-LM megatron/training/tokenizer/tokenizer.py @00ee9667",
    "[mc]": "megatron-core 0.16.1 (megatron/core/...)",
}
# DistributedOptimizer.checkpoint_fully_reshardable_formats, [mc] distrib_optimizer.py:105-109
FULLY_RESHARDABLE = frozenset({"fully_reshardable", "fully_sharded_model_space", "fsdp_dtensor"})
DISTOPT_TYPES = FULLY_RESHARDABLE | {"dp_reshardable", "dp_zero_gather_scatter"}
# build_tokenizer asserts `args.vocab_file is not None` for these [tok], so check_checkpoint_args' vocab branch runs.
VOCAB_FILE_TOKENIZERS = frozenset({"GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase"})
_UNEVEN_PP_ARGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                   "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                   "pipeline_model_parallel_layout")


@dataclass(frozen=True, slots=True)
class ResumeTarget:
    """The run that resumes. None = as saved (dp: derived from the saved world size when it divides).

    vocab_size: the tokenizer's vocabulary size, for checkpoints whose args lack `vocab_size`.
    """

    tp: int
    pp: int
    dp: int | None = None
    ep: int | None = None
    cp: int | None = None
    make_vocab_size_divisible_by: int | None = None
    vocab_size: int | None = None
    finetune: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False


@dataclass(frozen=True, slots=True)
class Layout:
    """Resolved parallel sizes of the saving or the resuming run (None = unknown)."""

    tp: int
    pp: int
    dp: int | None
    ep: int
    cp: int
    world_size: int | None

    def to_dict(self) -> dict[str, int | None]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "cp": self.cp,
                "world_size": self.world_size}


@dataclass(frozen=True, slots=True)
class VocabCandidate:
    """`--make-vocab-size-divisible-by value` keeps the saved padded size for vocabularies in (low, high]."""

    value: int
    low: int
    high: int
    certain: bool  # True when every vocabulary the checkpoint could have been padded from is in range

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "vocab_range": [self.low, self.high], "certain": self.certain}


@dataclass(frozen=True, slots=True)
class VocabPrediction:
    """The padded vocabulary Megatron recomputes for the target TP ([tok] `_vocab_size_with_padding`).

    predicted: the new padded size; None when it depends on an unknown vocabulary size (`note` says how).
    """

    saved: int
    predicted: int | None
    vocab_size: int | None
    vocab_source: str
    divisible_by: int
    tp: int
    hidden: int | None
    keys: tuple[str, ...]
    candidates: tuple[VocabCandidate, ...]
    note: str | None = None  # how the size depends on an unknown vocabulary

    @property
    def suggestion(self) -> int | None:
        certain = [c.value for c in self.candidates if c.certain]
        return max(certain) if certain else None

    def shape(self, rows: int) -> tuple[int, ...]:
        return (rows,) if self.hidden is None else (rows, self.hidden)

    def to_dict(self) -> dict[str, Any]:
        return {"saved_padded": self.saved, "predicted_padded": self.predicted, "vocab_size": self.vocab_size,
                "vocab_size_source": self.vocab_source, "make_vocab_size_divisible_by": self.divisible_by,
                "tp": self.tp, "keys": list(self.keys), "saved_shape": list(self.shape(self.saved)),
                "predicted_shape": None if self.predicted is None else list(self.shape(self.predicted)),
                "suggestion": self.suggestion, "candidates": [c.to_dict() for c in self.candidates],
                "note": self.note}


@dataclass(frozen=True, slots=True)
class ComponentPrediction:
    outcome: Outcome
    reason: str
    rule: str

    def to_dict(self) -> dict[str, str]:
        return {"outcome": self.outcome.value, "reason": self.reason, "rule": self.rule}


@dataclass(frozen=True, slots=True)
class RuleResult:
    """One row of the rule table as applied: `fired` = its condition held, `decided` = it set the outcome."""

    id: str
    component: Component
    when: str
    outcome: Outcome
    source: str
    fired: bool
    decided: bool
    detail: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "component": self.component.value, "when": self.when, "outcome": self.outcome.value,
                "source": self.source, "fired": self.fired, "decided": self.decided, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ResumePrediction:
    """The result of `resume`. `problems`: why the target run cannot even start (divisibility)."""

    checkpoint: str
    format: str
    verdict: Verdict
    source: Mapping[str, Any]
    target: Mapping[str, Any]
    components: Mapping[Component, ComponentPrediction]
    vocab: VocabPrediction | None
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    rules: tuple[RuleResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "format": self.format, "verdict": self.verdict.value,
                "source": dict(self.source), "target": dict(self.target),
                "components": {c.value: p.to_dict() for c, p in self.components.items()},
                "vocab": self.vocab.to_dict() if self.vocab else None, "problems": list(self.problems),
                "notes": list(self.notes), "rules": [r.to_dict() for r in self.rules], "sources": dict(SOURCES)}


def verdict_of(outcomes: Mapping[Component, ComponentPrediction]) -> Verdict:
    """`fails` if any component fails, else `lossy` if any is dropped, else `ok` (CONTRACT.md)."""
    values = {p.outcome for p in outcomes.values()}
    if Outcome.FAILS in values:
        return Verdict.FAILS
    return Verdict.LOSSY if Outcome.DROPPED in values else Verdict.OK


# ---------------------------------------------------------------------------------------------- derived facts


@dataclass(frozen=True, slots=True)
class _Facts:
    ckpt: Checkpoint
    t: ResumeTarget
    args: Mapping[str, Any]
    common: Mapping[str, Any]
    src: Layout
    dst: Layout
    legacy: bool
    release: bool
    broken: tuple[str, ...]
    problems: tuple[str, ...]
    vocab: VocabPrediction | None
    arg_mismatch: tuple[str, ...]  # what check_checkpoint_args asserts on (torch_dist: flags only)
    vocab_file_run: bool  # the run has a vocab_file, so check_checkpoint_args compares the vocab args
    sharding: str | None
    flattened: bool
    has_optimizer: bool
    has_rng: bool
    has_scheduler: bool
    has_iteration: bool
    rerun: str  # absent | idle | pending
    dp_source: str
    notes: tuple[str, ...] = field(default=())

    @property
    def split_changed(self) -> bool:
        return (self.src.tp, self.src.pp) != (self.dst.tp, self.dst.pp)

    @property
    def ep_changed(self) -> bool:
        return self.src.ep != self.dst.ep

    @property
    def dp_changed(self) -> bool:
        return self.dst.dp is None or self.src.dp is None or self.dst.dp != self.src.dp

    def tp_pp(self) -> str:
        ep = f", EP {self.src.ep} → {self.dst.ep}" if self.ep_changed else ""
        return f"(TP, PP) ({self.src.tp}, {self.src.pp}) → ({self.dst.tp}, {self.dst.pp}){ep}"

    def skip_flag(self, optim: bool) -> str | None:
        if self.t.finetune:
            return "--finetune"
        wanted = self.t.no_load_optim if optim else self.t.no_load_rng
        return ("--no-load-optim" if optim else "--no-load-rng") if wanted else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _layouts(ckpt: Checkpoint, t: ResumeTarget, args: Mapping[str, Any]) -> tuple[Layout, Layout, str]:
    topo = ckpt.topology
    cp = _int(args.get("context_parallel_size")) or 1
    # Megatron's load_checkpoint defaults a missing TP/PP in the checkpoint args to 1.
    src = Layout(topo.tp or 1, topo.pp or 1, topo.dp, topo.ep or 1, cp, topo.world_size)
    dcp = t.cp or cp
    dp, how = t.dp, "given"
    if dp is None:
        dp, how = None, "unknown (the saved world size is not divisible by TP × PP × CP; pass --dp)"
        if src.world_size and src.world_size % (t.tp * t.pp * dcp) == 0:
            dp, how = src.world_size // (t.tp * t.pp * dcp), f"derived: saved world size {src.world_size}"
        elif src.world_size is None and src.dp and (src.tp, src.pp, src.cp) == (t.tp, t.pp, dcp):
            dp, how = src.dp, "as saved (the saved world size is unknown)"
    dst = Layout(t.tp, t.pp, dp, t.ep or src.ep, dcp, dp * t.tp * t.pp * dcp if dp else None)
    return src, dst, how


def _problems(a: Mapping[str, Any], src: Layout, dst: Layout) -> list[str]:
    """Divisibility the target topology needs, each naming the Megatron check that raises."""
    out: list[str] = []
    layers, heads, ffn = _int(a.get("num_layers")), _int(a.get("num_attention_heads")), _int(a.get("ffn_hidden_size"))
    tp, pp, ep = dst.tp, dst.pp, dst.ep
    if layers and not any(a.get(k) for k in _UNEVEN_PP_ARGS):
        n = layers + sum(bool(a.get(f"account_for_{x}_in_pipeline_split")) for x in ("embedding", "loss"))
        if n % pp:
            out.append(f"num_layers {n} is not divisible by PP {pp} ([mc] transformer_block.py:155 "
                       "get_num_layers_to_build: 'num_layers should be divisible by pipeline_model_parallel_size')")
    if heads and heads % tp:
        out.append(f"num_attention_heads {heads} is not a multiple of TP {tp} ([mc] transformer_config.py:924)")
    groups = _int(a.get("num_query_groups")) if a.get("group_query_attention") else heads
    if groups and groups % tp and tp % groups:
        out.append(f"num_query_groups {groups} is neither a multiple nor a divisor of TP {tp} "
                   "([mc] transformer_config.py:939-946)")
    if ffn and ffn % tp:
        out.append(f"ffn_hidden_size {ffn} is not divisible by TP {tp} ([mc] tensor_parallel/layers.py:842 "
                   "ColumnParallelLinear divide(output_size, TP))")
    experts = _int(a.get("num_experts"))
    if experts and experts % ep:
        out.append(f"num_experts {experts} is not divisible by EP {ep} ([mc] moe/moe_layer.py:101)")
    if not experts and ep > 1:
        out.append(f"EP {ep} without MoE (args have no num_experts): expert parallelism needs experts "
                   "(Megatron-LM arguments.py validate_args)")
    if experts and dst.world_size:
        etp = _int(a.get("expert_tensor_parallel_size"))
        etp = tp if etp is None or etp == src.tp else etp
        if dst.world_size % (etp * ep * pp):
            out.append(f"world size {dst.world_size} is not divisible by ETP×EP×PP {etp * ep * pp} "
                       "([mc] parallel_state.py:791-796)")
    gbs, mbs = _int(a.get("global_batch_size")), _int(a.get("micro_batch_size"))
    if gbs and mbs and dst.dp and not a.get("rampup_batch_size") and gbs % (mbs * dst.dp):
        out.append(f"the saved global_batch_size {gbs} is not divisible by micro_batch_size {mbs} × DP {dst.dp} "
                   "([mc] num_microbatches_calculator.py:340); pass another --global-batch-size")
    return out


def _vocab(ckpt: Checkpoint, a: Mapping[str, Any], src: Layout, t: ResumeTarget) -> VocabPrediction | None:
    keys = sorted({x.key for x in ckpt.tensors if not x.key.startswith(("optimizer.", "distrib_optim."))
                   and x.key.endswith(("word_embeddings.weight", "output_layer.weight"))})
    shapes = [x.shape for x in ckpt.tensors if x.key in keys and x.shape]
    saved = _int(a.get("padded_vocab_size"))
    if saved is None and shapes:  # legacy tensors are the local TP shard of the vocabulary
        saved = shapes[0][0] * (src.tp if ckpt.format is Format.TORCH else 1)
    if saved is None:
        return None
    hidden = shapes[0][1] if shapes and len(shapes[0]) == 2 else _int(a.get("hidden_size"))
    m_saved = _int(a.get("make_vocab_size_divisible_by"))
    m = t.make_vocab_size_divisible_by or m_saved or 128  # 128 = Megatron's default
    step_saved = m_saved * src.tp if m_saved else saved  # unknown padding: any vocabulary in (0, saved]
    low_saved = max(saved - step_saved, 0)
    v, how = t.vocab_size, "given (--vocab-size)"
    if v is None and _int(a.get("vocab_size")) and _pad(a["vocab_size"], step_saved) == saved:
        v, how = a["vocab_size"], "from the checkpoint args"
    elif v is None:
        how = f"size unknown: the tokenizer's, somewhere in ({low_saved}, {saved}]"
    cands = []
    for value in range(max(saved // t.tp, 1), 0, -1):
        q = value * t.tp
        if saved % q == 0 and (v is None or _pad(v, q) == saved):
            cands.append(VocabCandidate(value, saved - q, saved, v is not None or q >= step_saved))
    q = m * t.tp
    if v is not None:
        return VocabPrediction(saved, _pad(v, q), v, how, m, t.tp, hidden, tuple(keys), tuple(cands))
    lo, hi = _pad(low_saved + 1, q), _pad(saved, q)
    predicted: int | None = hi
    note = None if lo == hi else f"between {lo} and {hi} rows depending on the tokenizer's vocabulary"
    if saved % q == 0 and q < step_saved:
        predicted = None
        below = str(lo) if lo == saved - q else f"{lo} to {saved - q}"
        note = f"{saved} rows only for a vocabulary above {saved - q}, else {below}"
    return VocabPrediction(saved, predicted, None, how, m, t.tp, hidden, tuple(keys), tuple(cands), note)


def _pad(v: int, multiple: int) -> int:
    return int(math.ceil(v / multiple) * multiple)


def _rerun(common: Mapping[str, Any]) -> str:
    r = common.get("rerun_state_machine")
    if not isinstance(r, Mapping):
        return "absent"
    state = r.get("state")
    text = str(getattr(state, "summary", state)).strip("'\"")
    # RerunState.NOT_RUNNING_YET == 0 ([mc] rerun_state_machine.py:105): validate_state_dict returns False.
    return "idle" if text in ("0", "NOT_RUNNING_YET", "RerunState.NOT_RUNNING_YET") else "pending"


def _facts(ckpt: Checkpoint, t: ResumeTarget) -> _Facts:
    a: Mapping[str, Any] = ckpt.args or {}
    common: Mapping[str, Any] = ckpt.common or {}
    legacy = ckpt.format is Format.TORCH
    src, dst, dp_how = _layouts(ckpt, t, a)
    notes = [f"target DP {dp_how}"] if t.dp is None else []
    if not ckpt.args:
        notes.append("checkpoint has no args: divisibility and check_checkpoint_args not evaluated")
    broken = tuple(f"{f.code} {f.message}" for f in ckpt.findings if f.severity is Severity.ERROR)
    vocab = _vocab(ckpt, a, src, t)
    mismatch: list[str] = []
    m_saved = _int(a.get("make_vocab_size_divisible_by"))
    vocab_file = bool(a.get("vocab_file")) or a.get("tokenizer_type") in VOCAB_FILE_TOKENIZERS
    if vocab_file and t.make_vocab_size_divisible_by and m_saved and t.make_vocab_size_divisible_by != m_saved:
        mismatch.append(f"make_vocab_size_divisible_by value from checkpoint ({m_saved}) is not equal to the input "
                        f"argument value ({t.make_vocab_size_divisible_by}): check_checkpoint_args compares it "
                        f"because the run has a vocab_file ({a.get('tokenizer_type')})")
    opt_keys = any(x.key.startswith(("optimizer.", "distrib_optim.")) for x in ckpt.tensors) or any(
        o.family.startswith("optimizer.") for o in ckpt.objects)
    has_opt = not a.get("no_save_optim") and ("optimizer" in common or opt_keys or ckpt.optimizer_sharding is not None)
    has_rng = (any(o.family.endswith("rng_state") for o in ckpt.objects) if not legacy
               else "rng_state" in common or "random_rng_state" in common)
    return _Facts(
        ckpt, t, a, common, src, dst, legacy, PurePath(ckpt.path).name == "release", broken,
        tuple(_problems(a, src, dst)), vocab, tuple(mismatch), vocab_file, ckpt.optimizer_sharding,
        bool(ckpt.extra.get("mcore_data")) or ckpt.optimizer_sharding == "fully_sharded_model_space",
        has_opt, has_rng, "opt_param_scheduler" in common or "lr_scheduler" in common,
        ckpt.iteration is not None or "iteration" in common or "total_iters" in common, _rerun(common),
        dp_how, tuple(notes))


# ------------------------------------------------------------------------------------------------- the rules


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the decision table: when `test` returns a reason, the component gets `outcome`."""

    id: str
    component: Component
    when: str
    outcome: Outcome
    source: str
    test: Callable[[_Facts], str | None]


def _m_unreadable(f: _Facts) -> str | None:
    return "the checkpoint does not read cleanly, so Megatron's load fails too: " + "; ".join(f.broken[:3]) \
        if f.broken else None


def _m_topology(f: _Facts) -> str | None:
    return "the target run cannot start: " + "; ".join(f.problems) if f.problems else None


def _m_legacy_split(f: _Facts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed):
        return None
    version = f.common.get("checkpoint_version")
    if f.t.finetune or not f.split_changed:
        why = ("each rank opens get_checkpoint_name(mp_rank_TT[_PPP][_EEE]) for its new coordinates: those files are "
               "missing or hold another split's shapes ('could not load the checkpoint', sys.exit)")
    elif isinstance(version, (int, float)) and version < 3.0:
        why = "check_checkpoint_args asserts tensor_model_parallel_size against the old model_parallel_size"
    else:
        why = (f"check_checkpoint_args asserts tensor_model_parallel_size and pipeline_model_parallel_size "
               f"(checkpoint_version {version or '3.0'} ≥ 3.0, not a dist checkpoint)")
    return (f"legacy torch format, {f.tp_pp()}: {why}; the legacy format cannot "
            "reshard: convert it offline (tools/checkpoint/convert.py, or to torch_dist)")


def _suggestion(f: _Facts) -> str:
    v = f.vocab
    assert v is not None  # only called by the vocab rules, which checked it
    best, m_saved = v.suggestion, _int(f.args.get("make_vocab_size_divisible_by"))
    if best is None:
        if v.candidates:
            c = v.candidates[0]
            return (f"--make-vocab-size-divisible-by {c.value} keeps {v.saved} rows only for a vocabulary in "
                    f"({c.low}, {c.high}] (pass the tokenizer's vocabulary size to decide)")
        return (f"no --make-vocab-size-divisible-by keeps {v.saved} rows at TP {v.tp} ({v.saved} is not divisible "
                f"by {v.tp}): re-pad the embedding offline")
    others = [str(c.value) for c in v.candidates if c.certain and c.value != best][:3]
    text = f"--make-vocab-size-divisible-by {best} keeps {v.shape(v.saved)}" + (
        f" (so do {', '.join(others)})" if others else "")
    if v.vocab_size is None:
        text += " for any vocabulary the saved size can have been padded from"
    if f.vocab_file_run and m_saved and best != m_saved:
        text += (f"; but the run has a vocab_file ({f.args.get('tokenizer_type')}), so check_checkpoint_args then "
                 f"asserts make_vocab_size_divisible_by == {m_saved}: add --finetune (or --use-checkpoint-args on a "
                 "Megatron-LM whose build_tokenizer keeps a padded_vocab_size set from the checkpoint)")
    return text


def _vocab_fail(f: _Facts, rows: str) -> str:
    v = f.vocab
    assert v is not None
    keys = ", ".join(v.keys) or "the word embedding and output layer"
    vocab = str(v.vocab_size) if v.vocab_size is not None else "vocab"
    raises = ("load_state_dict raises a size mismatch" if f.legacy else
              "dist_checkpointing.load raises 'Global shape mismatch' ([mc] strategies/torch.py:503-518 "
              "MCoreLoadPlanner._validate_global_shapes)")
    return (f"{keys}: saved {v.shape(v.saved)}, but TP {v.tp} pads the vocabulary to {rows} "
            f"(_vocab_size_with_padding: ceil({vocab} / ({v.divisible_by} × {v.tp})) × {v.divisible_by * v.tp}, "
            f"vocabulary {v.vocab_source}); {raises}. {_suggestion(f)}")


def _m_vocab(f: _Facts) -> str | None:
    v = f.vocab
    if v is None or v.predicted is None or v.predicted == v.saved:
        return None
    rows = str(v.shape(v.predicted)) + (f" ({v.note})" if v.note else "")
    return _vocab_fail(f, rows)


def _m_vocab_unknown(f: _Facts) -> str | None:
    v = f.vocab
    if v is None or v.predicted is not None:
        return None
    return "cannot tell without the tokenizer's vocabulary size: " + _vocab_fail(f, str(v.note))


def _m_args(f: _Facts) -> str | None:
    if f.t.finetune or not f.arg_mismatch:
        return None
    return "check_checkpoint_args raises AssertionError: " + "; ".join(f.arg_mismatch)


def _m_reshard(f: _Facts) -> str | None:
    if f.legacy or not (f.split_changed or f.ep_changed):
        return None
    return (f"{f.tp_pp()}: load_checkpoint regenerates the sharded state dict for the "
            "new split and DCP reads each new shard from the stored chunks (global shapes unchanged)")


def _m_load(f: _Facts) -> str | None:
    return f"same (TP, PP) split {f.src.tp}×{f.src.pp}: every rank reads the slices it had" + (
        " (DP replicas read the same slices)" if f.dp_changed else "")


def _o_absent(f: _Facts) -> str | None:
    if f.has_optimizer or not (f.skip_flag(True) or f.release):
        return None
    return "the checkpoint holds no optimizer state (saved with --no-save-optim)"


def _o_skip(f: _Facts) -> str | None:
    flag = f.skip_flag(True)
    return f"{flag}: load_checkpoint neither requests (gen_sd_optim = None) nor loads the optimizer" if flag else None


def _release(f: _Facts) -> str | None:
    return "release checkpoint: load_checkpoint gates it on `not release` and never restores it" if f.release else None


def _o_missing(f: _Facts) -> str | None:
    return None if f.has_optimizer else (
        "the checkpoint holds no optimizer state (saved with --no-save-optim), yet load_checkpoint calls "
        "optimizer.load_state_dict(state_dict['optimizer']) → KeyError, 'Unable to load optimizer from checkpoint "
        "… Specify --no-load-optim or --finetune'")


def _o_flattened(f: _Facts) -> str | None:
    if f.legacy or not f.flattened:
        return None
    return (f"{f.sharding} optimizer state is stored flattened (N-D reformulated, mcore_data; Megatron-Core ≤0.15): "
            "current Megatron-Core still builds it with ShardedTensor.flattened_range "
            "(sharded_param_state_fs_model_space, [mc] distrib_optimizer.py:1748), which "
            "validate_metadata_integrity rejects: 'ShardedTensor.flattened_range is not supported' ([mc] "
            "mapping.py:133-134). Re-save it with megatron-core ≤0.15 as fully_reshardable, or --no-load-optim")


def _o_legacy_split(f: _Facts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed):
        return None
    return (f"legacy optimizer state belongs to the saved (TP, PP) shards (model_optim_rng.pt, distrib_optim.pt "
            f"buffers of that split): {f.tp_pp()} has no loader for it")


def _o_legacy_missing(f: _Facts) -> str | None:
    if not f.legacy or not f.args.get("use_distributed_optimizer"):
        return None
    shards: Mapping[str, Any] = f.ckpt.extra.get("shard_files") or {}
    missing = sorted(s for s, files in shards.items() if "distrib_optim.pt" not in files)
    return (f"args say use_distributed_optimizer but {', '.join(missing[:3])} lack distrib_optim.pt: "
            "load_parameter_state torch.loads it → FileNotFoundError") if missing else None


def _o_split_fixed(f: _Facts) -> str | None:
    if f.legacy or not f.split_changed or f.sharding not in DISTOPT_TYPES - FULLY_RESHARDABLE:
        return None
    return (f"RuntimeError '(TP, PP) mismatch after resume ({f.dst.tp}, {f.dst.pp}) vs ({f.src.tp}, {f.src.pp}) from "
            f"checkpoint: not supported for DistributedOptimizer with sharding type {f.sharding}' (load_checkpoint; "
            "only checkpoint_fully_reshardable_formats may change TP/PP). Save with "
            "--dist-ckpt-optim-fully-reshardable (the message's --ckpt-fully-parallel-save is outdated), "
            "or --no-load-optim")


def _o_ep_fixed(f: _Facts) -> str | None:
    if f.legacy or not f.ep_changed or f.sharding not in DISTOPT_TYPES - FULLY_RESHARDABLE:
        return None
    return (f"EP {f.src.ep} → {f.dst.ep} with {f.sharding}: the expert buffers' bucket tensors have the per-rank "
            "global shape (gbuf_world_numel_unpadded,), which changes with the experts per rank → 'Global shape "
            "mismatch' (not checked by load_checkpoint's (TP, PP) guard; inferred from "
            "sharded_param_state_dp_reshardable, [mc] distrib_optimizer.py:1603-1687)")


def _o_reshard(f: _Facts) -> str | None:
    if not (f.split_changed or f.ep_changed):
        return None
    if f.sharding in FULLY_RESHARDABLE:
        return (f"{f.sharding} is in checkpoint_fully_reshardable_formats: model-space state (one tensor per param "
                f"and state key), re-split for {f.tp_pp()}")
    return (f"regular optimizer state ({f.sharding or 'no DistributedOptimizer'}) is sharded like the model params "
            f"([mc] dist_checkpointing/optimizer.py), so it reshards with them for {f.tp_pp()}")


def _o_dp(f: _Facts) -> str | None:
    if not f.dp_changed:
        return None
    dp = f"DP {f.src.dp} → {f.dst.dp}"
    if f.sharding == "dp_reshardable":
        return (f"{dp}: dp_reshardable bucket tensors have the DP-independent global shape "
                "(gbuf_world_numel_unpadded,); every new DP rank reads its own range ([mc] distrib_optimizer.py "
                "sharded_param_state_dp_reshardable)")
    if f.sharding == "dp_zero_gather_scatter" or (f.legacy and f.args.get("use_distributed_optimizer")):
        where = "distrib_optim.pt" if f.legacy else "the param_state object"
        return (f"{dp}: DP rank 0 loads the whole unpadded buffer from {where} and scatters it, padded for the new "
                "DP size (load_parameter_state → load_parameter_state_from_dp_zero, [mc] distrib_optimizer.py:"
                "1965-2068; it asserts only numel_unpadded, which does not depend on DP)")
    if f.sharding in FULLY_RESHARDABLE:
        return f"{dp}: {f.sharding} model-space state; every rank flattens and trims its own DP range"
    return None


def _loaded(f: _Facts) -> str | None:
    return "same split: restored as saved"


def _r_absent(f: _Facts) -> str | None:
    # torch_dist requests rng_state only with an unchanged (TP, PP) and no ckpt_args.no_save_rng; legacy always reads.
    quiet = not f.legacy and (f.split_changed or f.args.get("no_save_rng"))
    if f.has_rng or not (f.skip_flag(False) or f.release or quiet):
        return None
    return "the checkpoint holds no rng state (saved with --no-save-rng)"


def _r_skip(f: _Facts) -> str | None:
    flag = f.skip_flag(False)
    return f"{flag}: load_checkpoint neither requests (gen_sd_rng_state = None) nor restores the rng state" \
        if flag else None


def _r_missing(f: _Facts) -> str | None:
    if f.has_rng:
        return None
    if f.legacy:
        return ("model_optim_rng.pt has no rng_state: the fallback reads state_dict['random_rng_state'] → KeyError, "
                "'Unable to load rng state … Specify --no-load-rng or --finetune' (sys.exit)")
    return ("no rng_state/shard_* objects, yet the args do not say --no-save-rng: load_checkpoint requests them "
            "for an unchanged (TP, PP) and the load fails on the missing keys; pass --no-load-rng")


def _r_legacy_split(f: _Facts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed):
        return None
    return f"legacy rng states live in the shard files of the saved split; {f.tp_pp()} cannot load them"


def _r_split(f: _Facts) -> str | None:
    if not f.split_changed:
        return None
    return (f"'(TP, PP) mismatch after resume ({f.dst.tp}, {f.dst.pp} vs {f.src.tp}, {f.src.pp} from checkpoint): "
            "RNG state will be ignored' — load_checkpoint requests rng_state only when ckpt_tp_pp == run_tp_pp "
            "(a ShardedObject on the (PP, TP) grid cannot be resharded); dropout streams restart from the seed")


def _r_dp_init(f: _Facts) -> str | None:
    if not f.args.get("data_parallel_random_init") or f.dst.dp is None:
        return None
    saved = f.common.get("rng_state")
    entries = len(saved) if f.legacy and isinstance(saved, list) else f.src.dp
    if entries is None or f.dst.dp <= entries:
        return None
    return (f"--data-parallel-random-init saved {entries} rng states (one per DP rank); load_checkpoint indexes "
            f"rng_state[dp_rank] up to DP rank {f.dst.dp - 1} → IndexError (only KeyError is caught)")


def _r_load(f: _Facts) -> str | None:
    return "same (TP, PP): every rank restores its " + (
        "shard file's rng_state[0]" if f.legacy else "rng_state/shard_{pp}.{tp} cell") + (
        " (the DP replicas share it)" if f.dp_changed else "")


def _x_absent(f: _Facts) -> str | None:
    if f.rerun != "absent":
        return None
    return ("not saved for the legacy format (RerunStateMachine.state_dict returns None for non-torch_dist)"
            if f.legacy else "no rerun_state_machine in the common state (rerun mode disabled, or never saved)")


def _x_finetune(f: _Facts) -> str | None:
    return "--finetune: load_checkpoint does not request the rerun state" if f.t.finetune else None


def _x_idle(f: _Facts) -> str | None:
    if f.rerun != "idle":
        return None
    return ("the saved rerun state machine was idle (RerunState.NOT_RUNNING_YET): validate_state_dict returns "
            "False, so Megatron never restores it, whatever the topology — nothing to restore")


def _x_changed(f: _Facts) -> str | None:
    a = f.args
    if not (_int(a.get("world_size")) and _int(a.get("data_parallel_size"))):
        why = "the checkpoint args lack world_size / data_parallel_size, and getattr(..., 0) never matches the run's"
    elif f.split_changed or f.dp_changed or f.dst.world_size != f.src.world_size:
        why = (f"world size {f.src.world_size} → {f.dst.world_size}, {f.tp_pp()}, DP {f.src.dp} → {f.dst.dp}")
    else:
        return None
    return f"'Job sharding has changed: Rerun state will be ignored' (load_checkpoint): {why}"


def _s_absent(f: _Facts) -> str | None:
    if f.has_scheduler or not (f.skip_flag(True) or f.release):
        return None
    return "the checkpoint holds no opt_param_scheduler (saved with --no-save-optim)"


def _s_skip(f: _Facts) -> str | None:
    flag = f.skip_flag(True)
    return (f"{flag}: the scheduler is restored in the same `not release and not args.finetune and not "
            "args.no_load_optim` block of load_checkpoint as the optimizer") if flag else None


def _s_missing(f: _Facts) -> str | None:
    return None if f.has_scheduler else (
        "no opt_param_scheduler in the checkpoint: load_checkpoint reads state_dict['opt_param_scheduler'] → "
        "KeyError ('Unable to load optimizer … Specify --no-load-optim or --finetune')")


def _s_load(f: _Facts) -> str | None:
    return "opt_param_scheduler.load_state_dict: sample-based counters, independent of the topology"


def _i_finetune(f: _Facts) -> str | None:
    return ("--finetune: iteration = 0, and consumed_train_samples is not restored (check_checkpoint_args block "
            "skipped)") if f.t.finetune else None


def _i_release(f: _Facts) -> str | None:
    return "release checkpoint: load_checkpoint starts at iteration 0" if f.release else None


def _i_missing(f: _Facts) -> str | None:
    return None if f.has_iteration else (
        "no 'iteration' (nor 'total_iters'): 'A metadata file exists but unable to load iteration … exiting'")


def _i_load(f: _Facts) -> str | None:
    it = f.ckpt.iteration if f.ckpt.iteration is not None else f.common.get("iteration", f.common.get("total_iters"))
    return f"iteration {it}; consumed_train_samples {f.args.get('consumed_train_samples', 0)} from the checkpoint args"


_LM = "[LM] load_checkpoint"
M, O, R, X, S, I = (Component.MODEL, Component.OPTIMIZER, Component.RNG, Component.RERUN_STATE, Component.SCHEDULER,
                    Component.ITERATION)
F, RS, LD, SK, DR, AB = (Outcome.FAILS, Outcome.RESHARDED, Outcome.LOADED, Outcome.SKIPPED, Outcome.DROPPED,
                         Outcome.ABSENT)

RULES: tuple[Rule, ...] = (
    Rule("model.unreadable", M, "the reader found errors", F, "[LM] _load_base_checkpoint", _m_unreadable),
    Rule("model.topology", M, "target sizes violate a divisibility", F, "[mc] see each problem", _m_topology),
    Rule("model.legacy-split", M, "legacy format and TP, PP or EP changes", F,
         "[LM] check_checkpoint_args; get_checkpoint_name", _m_legacy_split),
    Rule("model.vocab", M, "the recomputed padded vocabulary differs", F,
         "[tok] _vocab_size_with_padding; [mc] MCoreLoadPlanner._validate_global_shapes", _m_vocab),
    Rule("model.vocab-unknown", M, "the padded vocabulary depends on the unknown tokenizer size", F,
         "[tok] _vocab_size_with_padding", _m_vocab_unknown),
    Rule("model.args-check", M, "check_checkpoint_args compares a changed arg (not --finetune)", F,
         "[LM] check_checkpoint_args", _m_args),
    Rule("model.reshard", M, "torch_dist and TP, PP or EP changes", RS, f"{_LM}: generate_state_dict", _m_reshard),
    Rule("model.load", M, "otherwise", LD, _LM, _m_load),
    Rule("optimizer.absent", O, "no optimizer state, and nothing requests it", AB, _LM, _o_absent),
    Rule("optimizer.skip", O, "--finetune or --no-load-optim", SK, _LM, _o_skip),
    Rule("optimizer.release", O, "release checkpoint", DR, _LM, _release),
    Rule("optimizer.missing", O, "no optimizer state, but the load asks for it", F, _LM, _o_missing),
    Rule("optimizer.flattened", O, "flattened fully_sharded_model_space / mcore_data state", F,
         "[mc] mapping.py:133-134", _o_flattened),
    Rule("optimizer.legacy-split", O, "legacy format and TP, PP or EP changes", F, _LM, _o_legacy_split),
    Rule("optimizer.legacy-missing", O, "legacy DistributedOptimizer without distrib_optim.pt", F,
         "[mc] distrib_optimizer.py:2253 load_parameter_state", _o_legacy_missing),
    Rule("optimizer.split-fixed", O, "TP/PP changes and the sharding is not fully reshardable", F, _LM,
         _o_split_fixed),
    Rule("optimizer.ep-fixed", O, "EP changes and the sharding is DP-bound", F, "[mc] distrib_optimizer.py",
         _o_ep_fixed),
    Rule("optimizer.reshard", O, "TP, PP or EP changes (fully reshardable or regular optimizer)", RS,
         "[mc] distrib_optimizer.py:105-109", _o_reshard),
    Rule("optimizer.dp", O, "DP changes (DistributedOptimizer)", RS, "[mc] distrib_optimizer.py", _o_dp),
    Rule("optimizer.load", O, "otherwise", LD, _LM, _loaded),
    Rule("rng.absent", R, "no rng state, and nothing requests it", AB, _LM, _r_absent),
    Rule("rng.skip", R, "--finetune or --no-load-rng", SK, _LM, _r_skip),
    Rule("rng.release", R, "release checkpoint", DR, _LM, _release),
    Rule("rng.missing", R, "no rng state, but the load asks for it", F, _LM, _r_missing),
    Rule("rng.legacy-split", R, "legacy format and TP, PP or EP changes", F, _LM, _r_legacy_split),
    Rule("rng.split", R, "TP or PP changes", DR, f"{_LM}: 'RNG state will be ignored'", _r_split),
    Rule("rng.dp-random-init", R, "--data-parallel-random-init and DP grows", F, _LM, _r_dp_init),
    Rule("rng.load", R, "otherwise", LD, _LM, _r_load),
    Rule("rerun_state.absent", X, "no rerun_state_machine saved", AB, "[mc] rerun_state_machine.py:791-803",
         _x_absent),
    Rule("rerun_state.idle", X, "saved state NOT_RUNNING_YET", AB, "[mc] rerun_state_machine.py:845-859",
         _x_idle),
    Rule("rerun_state.finetune", X, "--finetune", SK, _LM, _x_finetune),
    Rule("rerun_state.release", X, "release checkpoint", DR, _LM, _release),
    Rule("rerun_state.changed", X, "world size, TP, PP or DP changes", DR,
         f"{_LM}: 'Job sharding has changed'", _x_changed),
    Rule("rerun_state.load", X, "otherwise", LD, _LM, _loaded),
    Rule("scheduler.absent", S, "no scheduler state, and nothing requests it", AB, _LM, _s_absent),
    Rule("scheduler.skip", S, "--finetune or --no-load-optim", SK, _LM, _s_skip),
    Rule("scheduler.release", S, "release checkpoint", DR, _LM, _release),
    Rule("scheduler.missing", S, "no scheduler state, but the load asks for it", F, _LM, _s_missing),
    Rule("scheduler.load", S, "otherwise", LD, _LM, _s_load),
    Rule("iteration.finetune", I, "--finetune", SK, _LM, _i_finetune),
    Rule("iteration.release", I, "release checkpoint", AB, _LM, _i_release),
    Rule("iteration.missing", I, "no iteration saved", F, _LM, _i_missing),
    Rule("iteration.load", I, "otherwise", LD, _LM, _i_load),
)


def _apply(f: _Facts) -> tuple[dict[Component, ComponentPrediction], list[RuleResult]]:
    components: dict[Component, ComponentPrediction] = {}
    results: list[RuleResult] = []
    for comp in Component:
        decider: tuple[Rule, str] | None = None
        also: list[str] = []
        for rule in (r for r in RULES if r.component is comp):
            detail = rule.test(f)
            decides = detail is not None and decider is None
            if decides:
                decider = (rule, detail or "")
            elif detail is not None and decider is not None and rule.outcome is decider[0].outcome is Outcome.FAILS:
                also.append(detail)
            results.append(RuleResult(rule.id, comp, rule.when, rule.outcome, rule.source, detail is not None,
                                      decides, detail))
        if decider is None:  # every component ends with an unconditional rule (tested)
            raise RuntimeError(f"no rule decided {comp.value}")
        rule, detail = decider
        components[comp] = ComponentPrediction(rule.outcome, detail + "".join(f"; also: {x}" for x in also), rule.id)
    return components, results


def predict_resume(ckpt: Checkpoint, target: ResumeTarget) -> ResumePrediction:
    """Predict what resuming `ckpt` as `target` restores, drops, or fails on.

    Raises `UsageError` for non-positive sizes and for formats this does not model (torch_dcp, fsdp_dtensor).
    A broken or unrecognized checkpoint is a prediction whose model component fails.
    """
    for name in ("tp", "pp", "dp", "ep", "cp", "make_vocab_size_divisible_by", "vocab_size"):
        value = getattr(target, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, not {value!r}")
    if ckpt.format in (Format.TORCH_DCP, Format.FSDP_DTENSOR):
        raise UsageError(f"{ckpt.path}: resume predicts Megatron torch_dist and legacy torch checkpoints, "
                         f"not {ckpt.format.value}")
    f = _facts(ckpt, target)
    if ckpt.format is None:
        nothing = ComponentPrediction(Outcome.ABSENT, "no readable checkpoint", "unrecognized")
        components = {c: nothing for c in Component}
        components[Component.MODEL] = ComponentPrediction(
            Outcome.FAILS, _m_unreadable(f) or "not a checkpoint of any known format", "model.unreadable")
        results: list[RuleResult] = []
    else:
        components, results = _apply(f)
    v = f.vocab
    source = {**f.src.to_dict(), "format": ckpt.format.value if ckpt.format else None,
              "generation": ckpt.generation, "iteration": ckpt.iteration, "optimizer_sharding": ckpt.optimizer_sharding,
              "padded_vocab_size": v.saved if v else None,
              "make_vocab_size_divisible_by": f.args.get("make_vocab_size_divisible_by"),
              "vocab_size": f.args.get("vocab_size")}
    dst = {**f.dst.to_dict(), "dp_source": f.dp_source,
           "make_vocab_size_divisible_by": v.divisible_by if v else target.make_vocab_size_divisible_by,
           "vocab_size": target.vocab_size, "padded_vocab_size": v.predicted if v else None,
           "finetune": target.finetune, "no_load_optim": target.no_load_optim, "no_load_rng": target.no_load_rng}
    return ResumePrediction(ckpt.path, ckpt.format.value if ckpt.format else "unrecognized", verdict_of(components),
                            source, dst, components, v, f.problems, f.notes, tuple(results))
