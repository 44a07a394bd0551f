"""Args: training args present (CK701) and consistent with the on-disk layout (CK702).

Witnesses: the `rng_state` grid is (PP, TP); `all_local_plans` has one plan per save-time rank; the
`rerun_state_machine_state` grid is the world; legacy shard dirs span TP × PP (× EP); the expert `linear_fc2`
chunks show the expert-TP size.
"""

from __future__ import annotations

from collections.abc import Iterator

from ckptinspect.checks import CheckContext
from ckptinspect.findings import Finding
from ckptinspect.formats.args_values import arg_stored_int
from ckptinspect.formats.topology import EXPERT_TP_SOURCE
from ckptinspect.model import Checkpoint, Format

_MEGATRON = (Format.TORCH_DIST, Format.TORCH)


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.format not in _MEGATRON:
        return
    if not ckpt.tensors and not ckpt.objects:
        return  # nothing was readable; the format findings say why
    if ckpt.args is None:
        yield Finding("CK701", "no training args found in the checkpoint (common state has no 'args')", "args",
                      ckpt.path)
        return
    layout = ckpt.layout
    args = ckpt.args
    pairs = [
        ("tensor_model_parallel_size", "rng_tp", "rng_state grid"),
        ("pipeline_model_parallel_size", "rng_pp", "rng_state grid"),
        ("world_size", "plans_world", "all_local_plans"),
        ("world_size", "rerun_world", "rerun_state_machine_state grid"),
        ("tensor_model_parallel_size", "shard_tp", "mp_rank_* dirs"),
        ("pipeline_model_parallel_size", "shard_pp", "mp_rank_* dirs"),
        ("expert_tensor_parallel_size", "expert_tp", EXPERT_TP_SOURCE),
    ]
    for arg, witness, what in pairs:
        a = arg_stored_int(args, arg)  # a 0 disagrees with the disk too (and is CK703); "x" compares with nothing
        w = layout.get(witness)
        if witness.startswith("shard_") and w is not None and a is not None and w < a:
            continue  # fewer shard dirs than the args need is CK110 (missing shard), not a disagreement
        if a is not None and w is not None and a != w:
            yield Finding("CK702", f"args.{arg}={a} but the {what} says {w}", arg, ckpt.path,
                          {"arg": arg, "args_value": a, "on_disk": w, "witness": what})


