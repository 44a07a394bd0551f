"""One call for the `estimate` command: validate what the user asked, pick the source of the model, build the target
(the checkpoint's own topology unless overridden), run the arithmetic.

Input that cannot describe a Megatron job (TP·CP·DP not divisible by ETP·EP, more pipeline pieces than layers, a
checkpoint that is not torch_dist) is a `UsageError` with a message saying which option to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ckptinspect.errors import UsageError
from ckptinspect.commands.estimate.describe import GptDescription, model_from_description
from ckptinspect.commands.estimate.result import Estimate, estimate_model, estimate_params
from ckptinspect.commands.estimate.spec import (
    Bandwidths,
    ObjectCosts,
    Optimizer,
    OptimSharding,
    SaveFormat,
    SaveOptions,
    Target,
)


# Every rank is costed one by one; a million ranks is beyond any job run today and still answers in seconds.
MAX_WORLD = 1 << 20
MAX_PARAMS = 1e16


@dataclass(frozen=True, slots=True)
class TargetArgs:
    """Topology options; None = the checkpoint's own value (`--from`) or 1."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    etp: int | None = None
    cp: int | None = None
    vpp: int | None = None
    gpus_per_node: int = 8


@dataclass(frozen=True, slots=True)
class SaveArgs:
    """Save options; None = the checkpoint's own value (`--from`) or Megatron's default."""

    format: SaveFormat = SaveFormat.TORCH_DIST
    fully_parallel: bool | None = None
    async_save: bool = False
    distributed_optimizer: bool | None = None
    optimizer: Optimizer | None = None
    optim_sharding: OptimSharding | None = None
    files_per_rank: int | None = None


@dataclass(frozen=True, slots=True)
class EstimateRequest:
    """Exactly one of `params`, `description`, `from_path`."""

    params: float | None = None
    dtype: str = "bfloat16"
    description: GptDescription | None = None
    from_path: Path | None = None
    target: TargetArgs = field(default_factory=TargetArgs)
    save: SaveArgs = field(default_factory=SaveArgs)
    bandwidths: Bandwidths = field(default_factory=Bandwidths)


def _target(a: TargetArgs, base: Target | None) -> Target:
    b = base or Target()
    def pick(v: int | None, default: int) -> int:
        return default if v is None else v

    t = Target(tp=pick(a.tp, b.tp), pp=pick(a.pp, b.pp), dp=pick(a.dp, b.dp), ep=pick(a.ep, b.ep),
               cp=pick(a.cp, b.cp), vpp=pick(a.vpp, b.vpp), etp=a.etp if a.etp is not None else b.etp,
               gpus_per_node=a.gpus_per_node)
    for name, v in (("tp", t.tp), ("pp", t.pp), ("dp", t.dp), ("ep", t.ep), ("cp", t.cp), ("vpp", t.vpp),
                    ("etp", t.etp_), ("gpus-per-node", t.gpus_per_node)):
        if v < 1:
            raise UsageError(f"--{name} must be at least 1, got {v}")
    if a.etp is not None and a.etp < 1:
        raise UsageError(f"--etp must be at least 1, got {a.etp}")
    if t.world > MAX_WORLD:
        raise UsageError(f"TP*PP*DP*CP = {t.world:,} ranks is more than estimate handles ({MAX_WORLD:,})")
    if (t.tp * t.cp * t.dp) % (t.etp_ * t.ep):
        raise UsageError(f"TP*CP*DP = {t.tp * t.cp * t.dp} is not divisible by ETP*EP = {t.etp_ * t.ep} "
                         "(Megatron's expert groups need it): change --ep / --etp / --dp")
    return t


def _save(a: SaveArgs, base: SaveOptions | None) -> SaveOptions:
    b = base or SaveOptions()
    s = SaveOptions(
        format=a.format,
        fully_parallel=b.fully_parallel if a.fully_parallel is None else a.fully_parallel,
        async_save=a.async_save,
        distributed_optimizer=b.distributed_optimizer if a.distributed_optimizer is None else a.distributed_optimizer,
        optimizer=a.optimizer or b.optimizer, optim_sharding=a.optim_sharding or b.optim_sharding,
        files_per_rank=b.files_per_rank if a.files_per_rank is None else a.files_per_rank,
        save_optim=b.save_optim,
    )
    if s.files_per_rank < 1:
        raise UsageError("--files-per-rank must be at least 1")
    return s


def run(req: EstimateRequest) -> Estimate:
    """The estimate `req` asks for."""
    sources = [x is not None for x in (req.params, req.description, req.from_path)]
    if sum(sources) != 1:
        raise UsageError("give exactly one model source: --params N, a description (--layers --hidden --heads "
                         "--vocab ...), or --from CKPT")
    if req.params is not None:
        if not 0 < req.params <= MAX_PARAMS:
            raise UsageError(f"--params must be positive and at most {MAX_PARAMS:.0e}, got {req.params}")
        return estimate_params(int(req.params), req.dtype, _target(req.target, None), _save(req.save, None),
                               req.bandwidths)
    if req.description is not None:
        d = replace(req.description, dtype=req.dtype)
        t = _target(req.target, None)
        _check_description(d, t)
        return estimate_model(model_from_description(d, t.tp), t, _save(req.save, None), req.bandwidths,
                              _description_costs(d, t))
    return _from_checkpoint(req, req.from_path) if req.from_path is not None else _never()


def _never() -> Estimate:
    raise UsageError("no model source")


def _description_costs(d: GptDescription, t: Target) -> ObjectCosts:
    """Object counts of a described model: a TE/local `_extra_state` per linear module (qkv, proj, fc1, fc2 in a
    dense layer; qkv, proj and per expert fc1, fc2 in a MoE layer), the rng grid per DP rank with EP > 1."""
    moe = d.experts > 0
    return ObjectCosts(extra_state_modules=2 if moe and d.moe_layer_freq <= 1 else 4,
                       expert_extra_state_modules=2 if moe else 0, rng_per_dp=t.ep > 1,
                       expert_optim_objects=ObjectCosts().optim_objects if moe else 0)


def _check_description(d: GptDescription, t: Target) -> None:
    for name, v in (("layers", d.layers), ("hidden", d.hidden), ("heads", d.heads), ("vocab", d.vocab)):
        if v < 1:
            raise UsageError(f"--{name} must be at least 1, got {v}")
    if d.layers < t.pp * t.vpp:
        raise UsageError(f"--layers {d.layers} is fewer than PP*VPP = {t.pp * t.vpp} pipeline pieces")
    if d.experts and d.experts % t.ep:
        raise UsageError(f"--experts {d.experts} is not divisible by --ep {t.ep}")
    if t.ep > 1 and not d.experts:
        raise UsageError("--ep > 1 needs --experts")


def _from_checkpoint(req: EstimateRequest, path: Path) -> Estimate:
    from ckptinspect.commands.estimate.from_ckpt import costs_from, model_from, options_from, target_from
    from ckptinspect.formats import read_checkpoint
    from ckptinspect.formats.resolve import resolve_checkpoint
    from ckptinspect.model import Format

    ckpt_path, label = resolve_checkpoint(path, str(path))  # UsageError: no such file, or permission denied
    ckpt = read_checkpoint(ckpt_path, label)
    if ckpt.format is not Format.TORCH_DIST:
        got = ckpt.format.value if ckpt.format else "unrecognized"
        raise UsageError(f"{label}: estimate --from reads Megatron torch_dist checkpoints (this one is {got}); "
                         "describe the model with --layers --hidden ... instead")
    model = model_from(ckpt)
    if not model.params:
        raise UsageError(f"{label}: no model tensors found; describe the model with --layers --hidden ... instead")
    own = target_from(ckpt, req.target.gpus_per_node)
    t = _target(req.target, own)
    costs = costs_from(ckpt, own, model.num_layers)
    return estimate_model(model, t, _save(req.save, options_from(ckpt)), req.bandwidths, costs)
