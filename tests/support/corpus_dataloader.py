"""Acceptance cases for the per-DP-rank dataloader state (CK540-CK544, `formats/dataloader_state.py`).

Each copies a sample with the stack's dataloader state — `sample_ckpts/bridge` (`energon/iter_N/
train_dataloader_dprank{r:03d}.pt`, Megatron-Bridge's layout) or `sample_ckpts/torchtitan_dataloader` (torchtitan's
`dataloader.dp_rank_{r}` / `dataloader.world_size` items, written by torch DCP over 2 ranks) — and applies ONE
mutation: a rank's state lost, a leftover rank of a larger DP, a cut or hostile file, an iteration without state.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from corpus_kit import Case, Ctx, Hostile, append_item, copy_source, drop_object, edit_metadata, torch_bytes, truncate

BRIDGE, TITAN = ("bridge",), ("torchtitan_dataloader",)
ENERGON = "energon/iter_0000002"
RANK1 = f"{ENERGON}/train_dataloader_dprank001.pt"
CODES = frozenset({"CK540", "CK541", "CK542", "CK543", "CK544"})
S = frozenset


def _at(source: str, mutate: Callable[[Path, Ctx], object] | None, target: str) -> Callable[[Ctx], Path]:
    """Copy `source`, mutate its root, audit `source/target`."""

    def build(ctx: Ctx) -> Path:
        root = copy_source(ctx, source)
        if mutate is not None:
            mutate(root, ctx)
        return root / target

    return build


def _rank1_lost(root: Path, ctx: Ctx) -> None:
    (root / RANK1).unlink()


def _leftover_rank(root: Path, ctx: Ctx) -> None:
    """What a DP 4 run leaves when Bridge <=0.6.0 reuses the iteration dir without clearing it (PR #5604)."""
    shutil.copy(root / RANK1, root / ENERGON / "train_dataloader_dprank003.pt")


def _rank1_cut(root: Path, ctx: Ctx) -> None:
    truncate(root / RANK1)


def _rank1_hostile(root: Path, ctx: Ctx) -> None:
    (root / RANK1).write_bytes(torch_bytes({"dataloader_state_dict": Hostile(ctx.marker)}))


def _iteration_without_state(root: Path, ctx: Ctx) -> None:
    shutil.rmtree(root / ENERGON)


def _titan_drop_rank1(root: Path, ctx: Ctx) -> None:
    with edit_metadata(root / "step-2") as md:
        drop_object(md, "dataloader.dp_rank_1")


def _titan_world(payload: bytes) -> Callable[[Path, Ctx], None]:
    def mutate(root: Path, ctx: Ctx) -> None:
        with edit_metadata(root / "step-2") as md:
            append_item(root / "step-2", md, "dataloader.world_size", payload)

    return mutate


DATALOADER_CASES: tuple[Case, ...] = (
    # healthy: every DP rank's state present and readable
    Case("ok_bridge_energon_save_dir", _at("bridge", None, ""), "complete", S(), CODES, sources=BRIDGE),
    Case("ok_torchtitan_dataloader_save_dir", _at("torchtitan_dataloader", None, ""), "complete", S(), CODES,
         sources=TITAN),
    # Megatron-Bridge energon/
    Case("bridge_energon_rank_missing", _at("bridge", _rank1_lost, ""), "incomplete", S({"CK540"}),
         sources=BRIDGE),
    Case("bridge_energon_rank_beyond_dp", _at("bridge", _leftover_rank, "iter_0000002"), "complete", S({"CK541"}),
         S({"CK540", "CK542"}), sources=BRIDGE),
    Case("bridge_energon_rank_truncated", _at("bridge", _rank1_cut, "iter_0000002"), "corrupt", S({"CK542"}),
         S({"CK540"}), sources=BRIDGE),
    Case("hostile_bridge_energon_rank", _at("bridge", _rank1_hostile, "iter_0000002"), "unsafe", S({"CK601"}),
         sources=BRIDGE, subprocess=True),
    Case("bridge_energon_iteration_without_state", _at("bridge", _iteration_without_state, "iter_0000002"),
         "complete", S({"CK543"}), S({"CK540"}), sources=BRIDGE),
    # torchtitan dataloader.* items
    Case("torchtitan_dataloader_rank_missing", _at("torchtitan_dataloader", _titan_drop_rank1, ""), "incomplete",
         S({"CK540"}), sources=TITAN),
    Case("torchtitan_dataloader_world_size_too_big", _at("torchtitan_dataloader", _titan_world(torch_bytes(4)),
                                                          "step-2"), "incomplete", S({"CK544", "CK540"}),
         sources=TITAN),
    Case("torchtitan_dataloader_world_size_garbage", _at("torchtitan_dataloader", _titan_world(b"\x00" * 32),
                                                          "step-2"), "corrupt", S({"CK542"}), sources=TITAN),
)
