"""The decision table `RULES` and how it is applied (`apply_rules`).

Owns `Rule` (one row: component, condition, outcome, source), the literal `RULES` tuple in evaluation order, and
`apply_rules`: per component the first firing rule decides, and every other firing `fails` rule is appended to the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ckptinspect.commands.resume.conditions import (
    i_finetune, i_load, i_missing, i_release, loaded, m_args, m_legacy_split, m_load, m_reshard,
    m_topology, m_unreadable, m_vocab, m_zarr, m_vocab_unknown, o_absent, o_dp, o_ep_fixed, o_expert_split,
    o_flattened, o_legacy_missing, o_legacy_split, o_missing, o_reshard, o_skip, o_split_fixed, o_vpp_fixed,
    r_absent, r_dp_init, r_ep_grid, r_legacy_split, r_load, r_missing, r_skip, r_split, is_release, s_absent,
    s_load, s_missing, s_skip, x_absent, x_changed, x_finetune, x_idle,
)
from ckptinspect.commands.resume.data_position import BRIDGE_LOAD, d_absent, d_dropped, d_load, d_missing
from ckptinspect.commands.resume.facts import ResumeFacts
from ckptinspect.commands.resume.model import Component, ComponentPrediction, Outcome, RuleResult


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the decision table: when `test` returns a reason, the component gets `outcome`."""

    id: str
    component: Component
    when: str
    outcome: Outcome
    source: str
    test: Callable[[ResumeFacts], str | None]


_LM = "[LM] load_checkpoint"
M, O, R, X, S, I, D = (Component.MODEL, Component.OPTIMIZER, Component.RNG, Component.RERUN_STATE,
                       Component.SCHEDULER, Component.ITERATION, Component.DATALOADER)
F, RS, LD, SK, DR, AB = (Outcome.FAILS, Outcome.RESHARDED, Outcome.LOADED, Outcome.SKIPPED, Outcome.DROPPED,
                         Outcome.ABSENT)

RULES: tuple[Rule, ...] = (
    Rule("model.unreadable", M, "the reader found errors", F, "[LM] _load_base_checkpoint", m_unreadable),
    Rule("model.zarr", M, "zarr backend (megatron-core <=0.15)", F,
         "[mc] dist_checkpointing/strategies/base.py (no zarr strategy since 0.16, PR #2944)", m_zarr),
    Rule("model.topology", M, "target sizes violate a divisibility", F, "[mc] see each problem", m_topology),
    Rule("model.legacy-split", M, "legacy format and TP, PP, EP or VPP changes", F,
         "[LM] check_checkpoint_args; get_checkpoint_name", m_legacy_split),
    Rule("model.vocab", M, "the recomputed padded vocabulary differs", F,
         "[tok] _vocab_size_with_padding; [mc] MCoreLoadPlanner._validate_global_shapes", m_vocab),
    Rule("model.vocab-unknown", M, "the padded vocabulary depends on the unknown tokenizer size", F,
         "[tok] _vocab_size_with_padding", m_vocab_unknown),
    Rule("model.args-check", M, "check_checkpoint_args compares a changed arg (not --finetune)", F,
         "[LM] check_checkpoint_args", m_args),
    Rule("model.reshard", M, "torch_dist and TP, PP, EP, ETP or VPP changes", RS, f"{_LM}: generate_state_dict",
         m_reshard),
    Rule("model.load", M, "otherwise", LD, _LM, m_load),
    Rule("optimizer.absent", O, "no optimizer state, and nothing requests it", AB, _LM, o_absent),
    Rule("optimizer.skip", O, "--finetune or --no-load-optim", SK, _LM, o_skip),
    Rule("optimizer.release", O, "release checkpoint", DR, _LM, is_release),
    Rule("optimizer.missing", O, "no optimizer state, but the load asks for it", F, _LM, o_missing),
    Rule("optimizer.flattened", O, "flattened fully_sharded_model_space / mcore_data state", F,
         "[mc] mapping.py:133-134", o_flattened),
    Rule("optimizer.legacy-split", O, "legacy format and TP, PP, EP or VPP changes", F, _LM, o_legacy_split),
    Rule("optimizer.legacy-missing", O, "legacy DistributedOptimizer without distrib_optim.pt", F,
         "[mc] distrib_optimizer.py:2253 load_parameter_state", o_legacy_missing),
    Rule("optimizer.split-fixed", O, "TP/PP changes and the sharding is not fully reshardable", F, _LM,
         o_split_fixed),
    Rule("optimizer.expert-split", O, "EP changes to or from 1 (the number of chained optimizers changes)", F,
         "[mc] optimizer/__init__.py get_megatron_optimizer", o_expert_split),
    Rule("optimizer.ep-fixed", O, "EP or expert-TP changes and the sharding is DP-bound", F,
         "[mc] distrib_optimizer.py", o_ep_fixed),
    Rule("optimizer.vpp-fixed", O, "VPP changes and the sharding is DP-bound", F,
         "[mc] distrib_optimizer.py; strategies/torch.py", o_vpp_fixed),
    Rule("optimizer.reshard", O, "TP, PP, EP, ETP or VPP changes (fully reshardable or regular optimizer)", RS,
         "[mc] distrib_optimizer.py:105-109", o_reshard),
    Rule("optimizer.dp", O, "DP×CP changes (DistributedOptimizer)", RS, "[mc] distrib_optimizer.py", o_dp),
    Rule("optimizer.load", O, "otherwise", LD, _LM, loaded),
    Rule("rng.absent", R, "no rng state, and nothing requests it", AB, _LM, r_absent),
    Rule("rng.skip", R, "--finetune or --no-load-rng", SK, _LM, r_skip),
    Rule("rng.release", R, "release checkpoint", DR, _LM, is_release),
    Rule("rng.missing", R, "no rng state, but the load asks for it", F, _LM, r_missing),
    Rule("rng.legacy-split", R, "legacy format and TP, PP or EP changes", F, _LM, r_legacy_split),
    Rule("rng.split", R, "TP or PP changes", DR, f"{_LM}: 'RNG state will be ignored'", r_split),
    Rule("rng.ep-grid", R, "(TP, PP) unchanged, but the EP > 1 rng grid (PP, TP, DP×CP) does not match", F,
         f"{_LM}; get_rng_state", r_ep_grid),
    Rule("rng.dp-random-init", R, "--data-parallel-random-init and DP grows", F, _LM, r_dp_init),
    Rule("rng.load", R, "otherwise", LD, _LM, r_load),
    Rule("rerun_state.absent", X, "no rerun_state_machine saved", AB, "[mc] rerun_state_machine.py:791-803",
         x_absent),
    Rule("rerun_state.idle", X, "saved state NOT_RUNNING_YET", AB, "[mc] rerun_state_machine.py:845-859",
         x_idle),
    Rule("rerun_state.finetune", X, "--finetune", SK, _LM, x_finetune),
    Rule("rerun_state.release", X, "release checkpoint", DR, _LM, is_release),
    Rule("rerun_state.changed", X, "world size, TP, PP or DP changes", DR,
         f"{_LM}: 'Job sharding has changed'", x_changed),
    Rule("rerun_state.load", X, "otherwise", LD, _LM, loaded),
    Rule("scheduler.absent", S, "no scheduler state, and nothing requests it", AB, _LM, s_absent),
    Rule("scheduler.skip", S, "--finetune or --no-load-optim", SK, _LM, s_skip),
    Rule("scheduler.release", S, "release checkpoint", DR, _LM, is_release),
    Rule("scheduler.missing", S, "no scheduler state, but the load asks for it", F, _LM, s_missing),
    Rule("scheduler.load", S, "otherwise", LD, _LM, s_load),
    Rule("iteration.finetune", I, "--finetune", SK, _LM, i_finetune),
    Rule("iteration.release", I, "release checkpoint", AB, _LM, i_release),
    Rule("iteration.missing", I, "no iteration saved", F, _LM, i_missing),
    Rule("iteration.load", I, "otherwise", LD, _LM, i_load),
    Rule("dataloader.absent", D, "no per-DP-rank dataloader state saved (or the target DP is unknown)", AB,
         BRIDGE_LOAD, d_absent),
    Rule("dataloader.missing", D, "a target DP rank has no saved state", F, BRIDGE_LOAD, d_missing),
    Rule("dataloader.dropped", D, "saved state of DP ranks at or beyond the target DP", DR, BRIDGE_LOAD, d_dropped),
    Rule("dataloader.load", D, "otherwise", LD, BRIDGE_LOAD, d_load),
)


def apply_rules(f: ResumeFacts) -> tuple[dict[Component, ComponentPrediction], list[RuleResult]]:
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
