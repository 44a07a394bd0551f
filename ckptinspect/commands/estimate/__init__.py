"""`estimate`: what a checkpoint save will cost before the job runs — size by component, bytes written per rank,
files, stall seconds and async host memory — for torch_dist (fully parallel or not) and legacy saves.

Stages: a model (`ModelSpec`, from a description, a checkpoint, or only a parameter count) → the items each
(tp, pp, ep) shard saves (`items`) → the rank that writes each (`volumes`) → costs (`result`).

- `spec.py`: the inputs (model, target, save options, cost assumptions); `describe.py`: a GPT description → the
  parameters Megatron-Core saves; `from_ckpt.py`: a real checkpoint's model, topology and options as inputs;
  `quick.py`: `--params N`, the design notes' by-hand arithmetic; `request.py`: one validated call of the command.
- `items.py`: the items each shard saves, with their copies and main replica; `buckets.py`: the DistributedOptimizer's
  grad-buffer layout; `ranks.py`: rank arithmetic and the layer → stage map; `volumes.py`: who writes what.
- `result.py`: sizes, bytes per rank, files, stalls, host memory; `concentration.py`: CK801, which `audit` adds.
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
