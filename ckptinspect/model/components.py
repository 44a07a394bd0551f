"""Which part of a training state an item key belongs to: model / optimizer / rng / other (Megatron, Megatron FSDP,
torchtitan and plain DCP naming). The audit's summary and `estimate --from` both split bytes by it."""

from __future__ import annotations

import re

COMPONENTS = ("model", "optimizer", "rng", "other")
_SEGMENT = re.compile(r"[./]")
_RNG_WORDS = frozenset({"rng", "rngs"})


def _is_rng(key: str) -> bool:
    """An RNG state item: Megatron's `rng_state/shard_*` and Megatron FSDP's `rng_state` dict; a DCP state dict's
    `rng` Stateful as users and trainers write it (`rng.torch` / `rng.cuda` generator state tensors from
    `torch.get_rng_state()` / `Generator.get_state()`, `rng.python` = `random.getstate()` and `rng.numpy` =
    `np.random.get_state()` byte items); `cuda_rng_state`, `np_rng_state`, `random_rng_state` (Megatron legacy
    names). A path segment (split at ``.`` / ``/``) one of whose ``_``-words is ``rng`` / ``rngs``."""
    if "rng_state" in key:
        return True
    return any(not _RNG_WORDS.isdisjoint(seg.lower().split("_")) for seg in _SEGMENT.split(key[:256]))


def component_of(key: str) -> str:
    """model / optimizer / rng / other for an item key (Megatron and torchtitan naming)."""
    if key.startswith(("optimizer.", "optimizer/", "distrib_optim.", "optim.")) or ".optimizer." in key[:40]:
        return "optimizer"
    if _is_rng(key):
        return "rng"
    if key.startswith(("common_state/", "rerun_state_machine_state", "train_state", "args", "iteration",
                       "dataloader", "lr_scheduler", "opt_param_scheduler")):
        return "other"
    return "model"
