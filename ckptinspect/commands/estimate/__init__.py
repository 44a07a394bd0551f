"""`estimate`: what a checkpoint save will cost before the job runs — size by component, bytes written per rank,
files, stall seconds and async host memory — for torch_dist (fully parallel or not) and legacy saves.

Stages: a model (`ModelSpec`, from a description, a checkpoint, or only a parameter count) → the items each
(tp, pp, ep) shard saves (`items`) → the rank that writes each (`volumes`) → costs (`result`).
"""

from __future__ import annotations

from ckptinspect.commands.estimate.result import Estimate, Volume, estimate_model, estimate_params
from ckptinspect.commands.estimate.spec import (
    Bandwidths,
    ModelSpec,
    ObjectCosts,
    Optimizer,
    OptimSharding,
    ParamSpec,
    SaveFormat,
    SaveOptions,
    Stage,
    Target,
)

__all__ = [
    "Bandwidths", "Estimate", "ModelSpec", "ObjectCosts", "OptimSharding", "Optimizer", "ParamSpec", "SaveFormat",
    "SaveOptions", "Stage", "Target", "Volume", "estimate_model", "estimate_params",
]
