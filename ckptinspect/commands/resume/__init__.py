"""`resume`: predict what a Megatron resume with another topology restores, drops, or fails on.

`predict_resume(ckpt, target)` runs the decision table `RULES` over facts derived once from the checkpoint
(`derive_facts`). Each rule models one branch of Megatron's load path and names it in `source`. Sources read:
[LM] Megatron-LM `megatron/training/checkpointing.py` @0032978f (`load_checkpoint`, `check_checkpoint_args`),
[tok] `megatron/training/tokenizer/tokenizer.py` @00ee9667 (`build_tokenizer`, `_vocab_size_with_padding`),
[mc] megatron-core 0.16.1 as installed (file:line),
[Bridge] Megatron-Bridge v0.6.0 `src/megatron/bridge/training/checkpointing.py` (`maybe_load_dataloader_state`).

Per component the first firing rule decides; every other firing `fails` rule is appended to the reason, so one
run shows every problem. Components are predicted independently: Megatron's load is all-or-nothing, so any
`fails` means nothing is restored (verdict `fails`), but the other outcomes say what a fixed run would do.

This package re-exports the public API; the modules, in import order:
`model` (enums, frozen result values, `verdict_of`) → `vocab` (padded vocabulary prediction) → `facts` (`ResumeFacts`,
layouts, divisibility problems) → `conditions` (one test per rule) → `data_position` (the `dataloader` rules' tests:
per-DP-rank dataloader state, Megatron-Bridge's Energon files) → `rules` (`Rule`, `RULES`, `apply_rules`) →
`predict` (`predict_resume`).
"""

from __future__ import annotations

from ckptinspect.commands.resume.conditions import DISTOPT_TYPES, FULLY_RESHARDABLE
from ckptinspect.commands.resume.facts import VOCAB_FILE_TOKENIZERS
from ckptinspect.commands.resume.model import (
    SOURCES, Component, ComponentPrediction, Layout, Outcome, ResumePrediction, ResumeTarget, RuleResult, Verdict,
    VocabCandidate, VocabPrediction, verdict_of,
)
from ckptinspect.commands.resume.predict import predict_resume
from ckptinspect.commands.resume.rules import RULES, Rule

__all__ = [
    "DISTOPT_TYPES", "FULLY_RESHARDABLE", "RULES", "SOURCES", "VOCAB_FILE_TOKENIZERS", "Component",
    "ComponentPrediction", "Layout", "Outcome", "ResumePrediction", "ResumeTarget", "Rule", "RuleResult", "Verdict",
    "VocabCandidate", "VocabPrediction", "predict_resume", "verdict_of",
]
