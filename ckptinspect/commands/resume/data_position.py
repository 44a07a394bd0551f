"""Conditions of the `dataloader` rules: what a resume at a DP does with the per-DP-rank dataloader state saved with the checkpoint (`Checkpoint.dataloader`).

Megatron-Bridge v0.6.0 `training/checkpointing.py` `maybe_load_dataloader_state` (L1753-1818): every rank opens
`{energon}/iter_{N:07d}/train_dataloader_dprank{its dp rank:03d}.pt` and nothing else; a missing file raises
RuntimeError (L1808-1815: "The data-parallel size likely changed"), so a smaller DP silently leaves the higher ranks'
files unread (Megatron-Bridge PR #5637: rank 1's data state dropped going from DP 2 to DP 1). Energon's state is one
worker state per rank: nothing reshards it. torchtitan's DCP saves are not predicted by `resume`.
"""

from __future__ import annotations

from ckptinspect.commands.resume.facts import ResumeFacts
from ckptinspect.model import DataloaderState, Stack

BRIDGE_LOAD = "[Bridge] checkpointing.py maybe_load_dataloader_state"


def _state(f: ResumeFacts) -> DataloaderState | None:
    state = f.ckpt.dataloader
    return state if state is not None and state.stack == Stack.MEGATRON_BRIDGE.value else None


def d_absent(f: ResumeFacts) -> str | None:
    if _state(f) is None:
        return "no per-DP-rank dataloader state saved with the checkpoint: the data order is the run's own"
    return None if f.dst.dp is not None else "target DP unknown: which ranks' dataloader state is read is not known"


def d_missing(f: ResumeFacts) -> str | None:
    state, dp = _state(f), f.dst.dp
    missing = [r for r in range(dp or 0) if state is not None and r not in state.ranks]
    if state is None or not missing:
        return None
    return (f"Megatron-Bridge raises RuntimeError on DP rank(s) {_ranks(missing)} at load: no "
            f"train_dataloader_dprank file for them (saved for DP rank(s) {_ranks(state.ranks)} in {state.location}); "
            f"the data order restarts from the beginning only if the Energon state is removed (L1808-1815)")


def d_dropped(f: ResumeFacts) -> str | None:
    state, dp = _state(f), f.dst.dp
    dropped = [r for r in state.ranks if r >= dp] if state is not None and dp is not None else []
    if not dropped:
        return None
    return (f"DP rank(s) {_ranks(list(range(dp or 0)))} resume their own saved positions; the state of DP rank(s) "
            f"{_ranks(dropped)} is dropped without a message (each rank reads only its own file and nothing reshards "
            f"Energon state): the samples those ranks were to read next are not resumed (L1805-1817; "
            f"Megatron-Bridge PR #5637)")


def d_load(f: ResumeFacts) -> str | None:
    state = _state(f)
    where = f" from {state.location}" if state is not None else ""
    return f"each DP rank restores its own saved position{where} (train_dataloader_dprank{{dp:03d}}.pt, L1805-1817)"


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (", ..." if len(ranks) > 8 else "")
