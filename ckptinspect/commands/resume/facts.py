"""Facts derived once from a checkpoint and a target, which every rule of the decision table reads.

Owns `ResumeFacts`, the saved and resumed `Layout`s (`_layouts`), the divisibility problems of the target topology
(`_problems`), the rerun state machine's state (`_rerun`), and `derive_facts`, which assembles them (the vocabulary
prediction comes from `vocab`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ckptinspect.findings import Severity
from ckptinspect.model import Checkpoint, Format, StrEnum
from ckptinspect.commands.resume.model import Layout, ResumeTarget, VocabPrediction
from ckptinspect.formats.args_values import arg_flag, arg_int, arg_text
from ckptinspect.commands.resume.vocab import predict_vocab

# build_tokenizer asserts `args.vocab_file is not None` for these [tok], so check_checkpoint_args' vocab branch runs.
VOCAB_FILE_TOKENIZERS = frozenset({"GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase"})
_UNEVEN_PP_ARGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                   "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                   "pipeline_model_parallel_layout")


class RerunState(StrEnum):
    """What the saved `rerun_state_machine` means for a load."""

    ABSENT = "absent"  # none saved
    IDLE = "idle"  # RerunState.NOT_RUNNING_YET: validate_state_dict returns False, nothing restored
    PENDING = "pending"  # anything else


@dataclass(frozen=True, slots=True)
class ResumeFacts:
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
    rerun: RerunState
    dp_source: str
    notes: tuple[str, ...] = field(default=())

    @property
    def split_changed(self) -> bool:
        return (self.src.tp, self.src.pp) != (self.dst.tp, self.dst.pp)

    @property
    def ep_changed(self) -> bool:
        return self.src.ep != self.dst.ep

    @property
    def etp_changed(self) -> bool:
        return self.src.etp is not None and self.dst.etp is not None and self.src.etp != self.dst.etp

    @property
    def vpp_changed(self) -> bool:
        return self.src.vpp != self.dst.vpp

    @property
    def dp_changed(self) -> bool:
        return self.dst.dp is None or self.src.dp is None or self.dst.dp != self.src.dp

    @property
    def dpcp_changed(self) -> bool:
        """The DistributedOptimizer's DP × CP group size changes (or is unknown)."""
        return self.dst.dp_cp is None or self.src.dp_cp is None or self.dst.dp_cp != self.src.dp_cp

    @property
    def layout_changed(self) -> bool:
        """Anything that changes which model slices a rank holds: TP, PP, EP, ETP or VPP."""
        return self.split_changed or self.ep_changed or self.etp_changed or self.vpp_changed

    def tp_pp(self) -> str:
        ep = f", EP {self.src.ep} → {self.dst.ep}" if self.ep_changed else ""
        etp = f", ETP {self.src.etp} → {self.dst.etp}" if self.etp_changed else ""
        vpp = f", VPP {self.src.vpp} → {self.dst.vpp}" if self.vpp_changed else ""
        return f"(TP, PP) ({self.src.tp}, {self.src.pp}) → ({self.dst.tp}, {self.dst.pp}){ep}{etp}{vpp}"

    def dp_cp(self) -> str:
        s, d = self.src, self.dst
        if s.cp == d.cp == 1:
            return f"DP {s.dp} → {d.dp}"
        return f"DP×CP {s.dp}×{s.cp} → {d.dp}×{d.cp}"

    def skip_flag(self, optim: bool) -> str | None:
        if self.t.finetune:
            return "--finetune"
        wanted = self.t.no_load_optim if optim else self.t.no_load_rng
        return ("--no-load-optim" if optim else "--no-load-rng") if wanted else None


def _layouts(ckpt: Checkpoint, t: ResumeTarget, args: Mapping[str, Any]) -> tuple[Layout, Layout, str]:
    topo = ckpt.topology
    cp = arg_int(args, "context_parallel_size") or 1
    # Megatron's load_checkpoint defaults a missing TP/PP in the checkpoint args to 1.
    experts = arg_int(args, "num_experts")
    src_etp = topo.etp or ((topo.tp or 1) if experts else None)
    src = Layout(topo.tp or 1, topo.pp or 1, topo.dp, topo.ep or 1, cp, topo.world_size, src_etp, topo.vpp or 1)
    dcp = t.cp or cp
    dp, how = t.dp, "given"
    if dp is None:
        dp, how = None, "unknown (the saved world size is not divisible by TP × PP × CP; pass --dp)"
        if src.world_size and src.world_size % (t.tp * t.pp * dcp) == 0:
            dp, how = src.world_size // (t.tp * t.pp * dcp), f"derived: saved world size {src.world_size}"
        elif src.world_size is None and src.dp and (src.tp, src.pp, src.cp) == (t.tp, t.pp, dcp):
            dp, how = src.dp, "as saved (the saved world size is unknown)"
    # ETP not given: as saved, except that Megatron-LM's default ETP = TP follows a TP change
    etp = t.etp or (None if src.etp is None else t.tp if src.etp == src.tp else src.etp)
    dst = Layout(t.tp, t.pp, dp, t.ep or src.ep, dcp, dp * t.tp * t.pp * dcp if dp else None, etp,
                 t.vpp or src.vpp)
    return src, dst, how


def _problems(a: Mapping[str, Any], src: Layout, dst: Layout) -> list[str]:
    """Divisibility the target topology needs, each naming the Megatron check that raises."""
    out: list[str] = []
    layers, heads, ffn = arg_int(a, "num_layers"), arg_int(a, "num_attention_heads"), arg_int(a, "ffn_hidden_size")
    tp, pp, ep = dst.tp, dst.pp, dst.ep
    if layers and not any(a.get(k) for k in _UNEVEN_PP_ARGS):
        n = layers + sum(arg_flag(a, f"account_for_{x}_in_pipeline_split") for x in ("embedding", "loss"))
        if n % pp:
            out.append(f"num_layers {n} is not divisible by PP {pp} ([mc] transformer_block.py:155 "
                       "get_num_layers_to_build: 'num_layers should be divisible by pipeline_model_parallel_size')")
    if heads and heads % tp:
        out.append(f"num_attention_heads {heads} is not a multiple of TP {tp} ([mc] transformer_config.py:924)")
    groups = arg_int(a, "num_query_groups") if arg_flag(a, "group_query_attention") else heads
    if groups and groups % tp and tp % groups:
        out.append(f"num_query_groups {groups} is neither a multiple nor a divisor of TP {tp} "
                   "([mc] transformer_config.py:939-946)")
    if ffn and ffn % tp:
        out.append(f"ffn_hidden_size {ffn} is not divisible by TP {tp} ([mc] tensor_parallel/layers.py:842 "
                   "ColumnParallelLinear divide(output_size, TP))")
    experts = arg_int(a, "num_experts")
    if experts and experts % ep:
        out.append(f"num_experts {experts} is not divisible by EP {ep} ([mc] moe/moe_layer.py:101)")
    if not experts and ep > 1:
        out.append(f"EP {ep} without MoE (args have no num_experts): expert parallelism needs experts "
                   "(Megatron-LM arguments.py validate_args)")
    if experts and dst.world_size:
        etp = dst.etp or tp
        if dst.world_size % (etp * ep * pp):
            out.append(f"world size {dst.world_size} is not divisible by ETP×EP×PP {etp * ep * pp} "
                       "([mc] parallel_state.py:791-796)")
    if dst.vpp > 1 and layers and layers % (pp * dst.vpp) and not any(a.get(k) for k in _UNEVEN_PP_ARGS):
        out.append(f"num_layers {layers} is not divisible by PP × VPP {pp * dst.vpp} (Megatron-LM arguments.py "
                   "validate_args: every virtual stage needs a whole number of layers)")
    gbs, mbs = arg_int(a, "global_batch_size"), arg_int(a, "micro_batch_size")
    if gbs and mbs and dst.dp and not a.get("rampup_batch_size") and gbs % (mbs * dst.dp):
        out.append(f"the saved global_batch_size {gbs} is not divisible by micro_batch_size {mbs} × DP {dst.dp} "
                   "([mc] num_microbatches_calculator.py:340); pass another --global-batch-size")
    return out


def _rerun(common: Mapping[str, Any]) -> RerunState:
    r = common.get("rerun_state_machine")
    if not isinstance(r, Mapping):
        return RerunState.ABSENT
    state = r.get("state")
    text = str(getattr(state, "summary", state)).strip("'\"")
    # RerunState.NOT_RUNNING_YET == 0 ([mc] rerun_state_machine.py:105): validate_state_dict returns False.
    return RerunState.IDLE if text in ("0", "NOT_RUNNING_YET", "RerunState.NOT_RUNNING_YET") else RerunState.PENDING


def derive_facts(ckpt: Checkpoint, t: ResumeTarget) -> ResumeFacts:
    a: Mapping[str, Any] = ckpt.args or {}
    common: Mapping[str, Any] = ckpt.common or {}
    legacy = ckpt.format is Format.TORCH
    src, dst, dp_how = _layouts(ckpt, t, a)
    notes = [f"target DP {dp_how}"] if t.dp is None else []
    if not ckpt.args:
        notes.append("checkpoint has no args: divisibility and check_checkpoint_args not evaluated")
    broken = tuple(f"{f.code} {f.message}" for f in ckpt.findings if f.severity is Severity.ERROR)
    vocab = predict_vocab(ckpt, a, src, t)
    mismatch: list[str] = []
    m_saved = arg_int(a, "make_vocab_size_divisible_by")
    vocab_file = bool(arg_text(a, "vocab_file")) or arg_text(a, "tokenizer_type") in VOCAB_FILE_TOKENIZERS
    if vocab_file and t.make_vocab_size_divisible_by and m_saved and t.make_vocab_size_divisible_by != m_saved:
        mismatch.append(f"make_vocab_size_divisible_by value from checkpoint ({m_saved}) is not equal to the input "
                        f"argument value ({t.make_vocab_size_divisible_by}): check_checkpoint_args compares it "
                        f"because the run has a vocab_file ({arg_text(a, 'tokenizer_type')})")
    opt_keys = any(x.key.startswith(("optimizer.", "distrib_optim.")) for x in ckpt.tensors) or any(
        o.family.startswith("optimizer.") for o in ckpt.objects)
    has_opt = not arg_flag(a, "no_save_optim") and ("optimizer" in common or opt_keys
                                                     or ckpt.optimizer_sharding is not None)
    has_rng = (any(o.family.endswith("rng_state") for o in ckpt.objects) if not legacy
               else "rng_state" in common or "random_rng_state" in common)
    return ResumeFacts(
        ckpt, t, a, common, src, dst, legacy, PurePath(ckpt.path).name == "release", broken,
        tuple(_problems(a, src, dst)), vocab, tuple(mismatch), vocab_file, ckpt.optimizer_sharding,
        bool(ckpt.reformulated) or ckpt.optimizer_sharding == "fully_sharded_model_space",
        has_opt, has_rng, "opt_param_scheduler" in common or "lr_scheduler" in common,
        ckpt.iteration is not None or "iteration" in common or "total_iters" in common, _rerun(common),
        dp_how, tuple(notes))
