"""The decision table `RULES` and how it is applied (`_apply`).

Owns `Rule` (one row: component, condition, outcome, source), the literal `RULES` tuple in evaluation order, and
`_apply`: per component the first firing rule decides, and every other firing `fails` rule is appended to the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ckptinspect.commands.resume.conditions import (
    _i_finetune, _i_load, _i_missing, _i_release, _loaded, _m_args, _m_legacy_split, _m_load, _m_reshard,
    _m_topology, _m_unreadable, _m_vocab, _m_zarr, _m_vocab_unknown, _o_absent, _o_dp, _o_ep_fixed, _o_expert_split,
    _o_flattened, _o_legacy_missing, _o_legacy_split, _o_missing, _o_reshard, _o_skip, _o_split_fixed, _o_vpp_fixed,
    _r_absent, _r_dp_init, _r_ep_grid, _r_legacy_split, _r_load, _r_missing, _r_skip, _r_split, _release, _s_absent,
    _s_load, _s_missing, _s_skip, _x_absent, _x_changed, _x_finetune, _x_idle,
)
from ckptinspect.commands.resume.facts import _Facts
from ckptinspect.commands.resume.model import Component, ComponentPrediction, Outcome, RuleResult


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the decision table: when `test` returns a reason, the component gets `outcome`."""

    id: str
    component: Component
    when: str
    outcome: Outcome
    source: str
    test: Callable[[_Facts], str | None]


_LM = "[LM] load_checkpoint"
M, O, R, X, S, I = (Component.MODEL, Component.OPTIMIZER, Component.RNG, Component.RERUN_STATE, Component.SCHEDULER,
                    Component.ITERATION)
F, RS, LD, SK, DR, AB = (Outcome.FAILS, Outcome.RESHARDED, Outcome.LOADED, Outcome.SKIPPED, Outcome.DROPPED,
                         Outcome.ABSENT)

RULES: tuple[Rule, ...] = (
    Rule("model.unreadable", M, "the reader found errors", F, "[LM] _load_base_checkpoint", _m_unreadable),
    Rule("model.zarr", M, "zarr backend (megatron-core <=0.15)", F,
         "[mc] dist_checkpointing/strategies/base.py (no zarr strategy since 0.16, PR #2944)", _m_zarr),
    Rule("model.topology", M, "target sizes violate a divisibility", F, "[mc] see each problem", _m_topology),
    Rule("model.legacy-split", M, "legacy format and TP, PP, EP or VPP changes", F,
         "[LM] check_checkpoint_args; get_checkpoint_name", _m_legacy_split),
    Rule("model.vocab", M, "the recomputed padded vocabulary differs", F,
         "[tok] _vocab_size_with_padding; [mc] MCoreLoadPlanner._validate_global_shapes", _m_vocab),
    Rule("model.vocab-unknown", M, "the padded vocabulary depends on the unknown tokenizer size", F,
         "[tok] _vocab_size_with_padding", _m_vocab_unknown),
    Rule("model.args-check", M, "check_checkpoint_args compares a changed arg (not --finetune)", F,
         "[LM] check_checkpoint_args", _m_args),
    Rule("model.reshard", M, "torch_dist and TP, PP, EP, ETP or VPP changes", RS, f"{_LM}: generate_state_dict",
         _m_reshard),
    Rule("model.load", M, "otherwise", LD, _LM, _m_load),
    Rule("optimizer.absent", O, "no optimizer state, and nothing requests it", AB, _LM, _o_absent),
    Rule("optimizer.skip", O, "--finetune or --no-load-optim", SK, _LM, _o_skip),
    Rule("optimizer.release", O, "release checkpoint", DR, _LM, _release),
    Rule("optimizer.missing", O, "no optimizer state, but the load asks for it", F, _LM, _o_missing),
    Rule("optimizer.flattened", O, "flattened fully_sharded_model_space / mcore_data state", F,
         "[mc] mapping.py:133-134", _o_flattened),
    Rule("optimizer.legacy-split", O, "legacy format and TP, PP, EP or VPP changes", F, _LM, _o_legacy_split),
    Rule("optimizer.legacy-missing", O, "legacy DistributedOptimizer without distrib_optim.pt", F,
         "[mc] distrib_optimizer.py:2253 load_parameter_state", _o_legacy_missing),
    Rule("optimizer.split-fixed", O, "TP/PP changes and the sharding is not fully reshardable", F, _LM,
         _o_split_fixed),
    Rule("optimizer.expert-split", O, "EP changes to or from 1 (the number of chained optimizers changes)", F,
         "[mc] optimizer/__init__.py get_megatron_optimizer", _o_expert_split),
    Rule("optimizer.ep-fixed", O, "EP or expert-TP changes and the sharding is DP-bound", F,
         "[mc] distrib_optimizer.py", _o_ep_fixed),
    Rule("optimizer.vpp-fixed", O, "VPP changes and the sharding is DP-bound", F,
         "[mc] distrib_optimizer.py; strategies/torch.py", _o_vpp_fixed),
    Rule("optimizer.reshard", O, "TP, PP, EP, ETP or VPP changes (fully reshardable or regular optimizer)", RS,
         "[mc] distrib_optimizer.py:105-109", _o_reshard),
    Rule("optimizer.dp", O, "DP×CP changes (DistributedOptimizer)", RS, "[mc] distrib_optimizer.py", _o_dp),
    Rule("optimizer.load", O, "otherwise", LD, _LM, _loaded),
    Rule("rng.absent", R, "no rng state, and nothing requests it", AB, _LM, _r_absent),
    Rule("rng.skip", R, "--finetune or --no-load-rng", SK, _LM, _r_skip),
    Rule("rng.release", R, "release checkpoint", DR, _LM, _release),
    Rule("rng.missing", R, "no rng state, but the load asks for it", F, _LM, _r_missing),
    Rule("rng.legacy-split", R, "legacy format and TP, PP or EP changes", F, _LM, _r_legacy_split),
    Rule("rng.split", R, "TP or PP changes", DR, f"{_LM}: 'RNG state will be ignored'", _r_split),
    Rule("rng.ep-grid", R, "(TP, PP) unchanged, but the EP > 1 rng grid (PP, TP, DP×CP) does not match", F,
         f"{_LM}; get_rng_state", _r_ep_grid),
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
