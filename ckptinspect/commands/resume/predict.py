"""`predict_resume`, the entry point: validate the target, derive the facts, apply the rules, build the result."""

from __future__ import annotations

from ckptinspect.errors import UsageError
from ckptinspect.formats.args_values import arg_int
from ckptinspect.model import Checkpoint, Format
from ckptinspect.commands.resume.conditions import m_unreadable
from ckptinspect.commands.resume.facts import derive_facts
from ckptinspect.commands.resume.model import (
    Component, ComponentPrediction, Outcome, ResumePrediction, ResumeTarget, RuleResult, verdict_of,
)
from ckptinspect.commands.resume.rules import apply_rules


def predict_resume(ckpt: Checkpoint, target: ResumeTarget) -> ResumePrediction:
    """Predict what resuming `ckpt` as `target` restores, drops, or fails on.

    Raises `UsageError` for non-positive sizes and for formats this does not model (torch_dcp, fsdp_dtensor).
    A broken or unrecognized checkpoint is a prediction whose model component fails.
    """
    for name in ("tp", "pp", "dp", "ep", "cp", "etp", "vpp", "make_vocab_size_divisible_by", "vocab_size"):
        value = getattr(target, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, not {value!r}")
    if ckpt.format is Format.NVRX_LOCAL:
        # The local files hold MCoreTensorAwareStateDicts for the saving ranks only; Megatron/Bridge restore them as
        # saved with the same parallelism (Bridge `_load_checkpoint_from_path`: "local checkpoints always resume
        # with the same parallelism"), else the persistent checkpoint is used.
        raise UsageError(f"{ckpt.path}: an NVRx local checkpoint resumes only with the topology that saved it "
                         f"(world size {ckpt.topology.world_size}); predict the persistent checkpoint instead")
    if ckpt.format in (Format.TORCH_DCP, Format.FSDP_DTENSOR, Format.SAFETENSORS):
        raise UsageError(f"{ckpt.path}: resume predicts Megatron torch_dist and legacy torch checkpoints, "
                         f"not {ckpt.format.value}")
    f = derive_facts(ckpt, target)
    if ckpt.format is None:
        nothing = ComponentPrediction(Outcome.ABSENT, "no readable checkpoint", "unrecognized")
        components = {c: nothing for c in Component}
        components[Component.MODEL] = ComponentPrediction(
            Outcome.FAILS, m_unreadable(f) or "not a checkpoint of any known format", "model.unreadable")
        results: list[RuleResult] = []
    else:
        components, results = apply_rules(f)
    v = f.vocab
    source = {**f.src.to_dict(), "format": ckpt.format.value if ckpt.format else None,
              "generation": ckpt.generation, "iteration": ckpt.iteration, "optimizer_sharding": ckpt.optimizer_sharding,
              "padded_vocab_size": v.saved if v else None,
              "make_vocab_size_divisible_by": arg_int(f.args, "make_vocab_size_divisible_by"),
              "vocab_size": arg_int(f.args, "vocab_size")}
    dst = {**f.dst.to_dict(), "dp_source": f.dp_source,
           "make_vocab_size_divisible_by": v.divisible_by if v else target.make_vocab_size_divisible_by,
           "vocab_size": target.vocab_size, "padded_vocab_size": v.predicted if v else None,
           "finetune": target.finetune, "no_load_optim": target.no_load_optim, "no_load_rng": target.no_load_rng}
    return ResumePrediction(ckpt.path, ckpt.format.value if ckpt.format else "unrecognized", verdict_of(components),
                            source, dst, components, v, f.problems, f.notes, tuple(results))
