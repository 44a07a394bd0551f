"""Acceptance cases: coverage and sharded objects (CK3xx): `.metadata` surgery with torch's own DCP classes.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

from pathlib import Path

from corpus_kit import (
    Case,
    Ctx,
    EMBEDDING,
    RNG_CELL,
    S,
    TD,
    drop_object,
    edit_metadata,
    move_chunk,
    rename_object,
    td2,
)


def _drop_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        md.state_dict_metadata[EMBEDDING].chunks.pop(1)


def _overlap_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        move_chunk(md, EMBEDDING, 1, (32, 0))  # rows 32..96: overlaps chunk 0, leaves 96..128 uncovered


def _out_of_bounds_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        move_chunk(md, EMBEDDING, 1, (96, 0))  # rows 96..160 of a 128-row tensor


def _unstored_chunk(ckpt: Path, ctx: Ctx) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    with edit_metadata(ckpt) as md:
        chunk = md.state_dict_metadata[EMBEDDING].chunks[0]
        del md.storage_data[MetadataIndex(EMBEDDING, chunk.offsets)]


def _drop_rng_cell(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        drop_object(md, RNG_CELL)


def _inconsistent_rng_grid(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        rename_object(md, RNG_CELL, "rng_state/shard_0.0_4.4")



COVERAGE_CASES: tuple[Case, ...] = (
    Case("dropped_chunk", td2(_drop_chunk), "corrupt", S({"CK301"}), sources=TD),
    Case("shifted_chunk_overlap", td2(_overlap_chunk), "corrupt", S({"CK302"}), S({"CK304"}), sources=TD),
    Case("shifted_chunk_out_of_bounds", td2(_out_of_bounds_chunk), "corrupt", S({"CK303"}), S({"CK304"}),
         sources=TD),
    Case("chunk_without_storage", td2(_unstored_chunk), "corrupt", S({"CK304"}), sources=TD),
    Case("missing_rng_cell", td2(_drop_rng_cell), "corrupt", S({"CK305"}), sources=TD),
    Case("inconsistent_rng_grid", td2(_inconsistent_rng_grid), "corrupt", S({"CK306"}), sources=TD),
)
