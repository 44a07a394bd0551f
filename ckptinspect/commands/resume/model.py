"""The values of `resume`: outcome and verdict enums, the target and the prediction as frozen dataclasses.

Owns `Outcome`, `Verdict`, `Component`, the `SOURCES` legend, `ResumeTarget`, `Layout`, `VocabCandidate`,
`VocabPrediction`, `ComponentPrediction`, `RuleResult`, `ResumePrediction` (with their `to_dict` JSON shapes),
and `verdict_of`. Args values are read through `formats/args_values.py` (type + range checked).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.model import frozen


class Outcome(enum.Enum):
    """What a resume does with one component (docs/contract.md `resume` outcomes)."""

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
    DATALOADER = "dataloader"


SOURCES: Mapping[str, str] = {
    "[LM]": "Megatron-LM megatron/training/checkpointing.py @0032978f",
    "[tok]": "Megatron-LM megatron/training/tokenizer/tokenizer.py @00ee9667",
    "[mc]": "megatron-core 0.16.1 (megatron/core/...)",
    "[Bridge]": "Megatron-Bridge v0.6.0 src/megatron/bridge/training/checkpointing.py",
}


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
    etp: int | None = None
    vpp: int | None = None  # virtual pipeline stages per PP rank; 1 = no interleaving


@dataclass(frozen=True, slots=True)
class Layout:
    """Resolved parallel sizes of the saving or the resuming run (None = unknown)."""

    tp: int
    pp: int
    dp: int | None
    ep: int
    cp: int
    world_size: int | None
    etp: int | None = None  # None without experts
    vpp: int = 1

    @property
    def dp_cp(self) -> int | None:
        """The DistributedOptimizer's sharding group size (DP × CP)."""
        return None if self.dp is None else self.dp * self.cp

    def to_dict(self) -> dict[str, int | None]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "cp": self.cp,
                "world_size": self.world_size, "etp": self.etp, "vpp": self.vpp}


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

    def __post_init__(self) -> None:
        for name in ("source", "target", "components"):
            object.__setattr__(self, name, frozen(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "format": self.format, "verdict": self.verdict.value,
                "source": dict(self.source), "target": dict(self.target),
                "components": {c.value: p.to_dict() for c, p in self.components.items()},
                "vocab": self.vocab.to_dict() if self.vocab else None, "problems": list(self.problems),
                "notes": list(self.notes), "rules": [r.to_dict() for r in self.rules], "sources": dict(SOURCES)}


def verdict_of(outcomes: Mapping[Component, ComponentPrediction]) -> Verdict:
    """`fails` if any component fails, else `lossy` if any is dropped, else `ok` (docs/contract.md)."""
    values = {p.outcome for p in outcomes.values()}
    if Outcome.FAILS in values:
        return Verdict.FAILS
    return Verdict.LOSSY if Outcome.DROPPED in values else Verdict.OK


