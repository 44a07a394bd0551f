"""Acceptance cases: format and half-written saves (CK1xx): a crash during the save, damaged metadata files, a broken
zarr array, and paths that are no checkpoint at all.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from corpus_kit import Case, Ctx, S, TD, _mutated, _rm, _write, copy_source, td2


def _metadata_tmp(ckpt: Path, ctx: Ctx) -> None:
    (ckpt / "metadata.json").unlink()
    (ckpt / ".metadata").rename(ckpt / ".metadata.tmp")


def _broken_zarray(it: Path, ctx: Ctx) -> None:
    (it / "output_layer.weight" / ".zarray").write_text("{not json")


def _empty_dir(ctx: Ctx) -> Path:
    (ctx.work / "empty").mkdir()
    return ctx.work / "empty"


def _garbage_file(name: str) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        path = ctx.work / name
        path.write_bytes(random.Random(name).randbytes(4096))
        return path

    return build



FORMATS_CASES: tuple[Case, ...] = (
    Case("no_metadata_json", td2(_rm("metadata.json")), "incomplete", S({"CK101"}), sources=TD),
    Case("metadata_tmp", td2(_metadata_tmp), "incomplete", S({"CK103"}), sources=TD),
    Case("data_files_only", td2(_rm(".metadata", "metadata.json")), "incomplete", S({"CK102"}), sources=TD),
    Case("garbage_metadata_json", td2(_write("metadata.json", b"{not json")), "corrupt", S({"CK104"}), sources=TD),
    Case("unknown_backend", td2(_write("metadata.json", b'{"sharded_backend": "hdf5"}')), "corrupt", S({"CK104"}),
         sources=TD),
    Case("garbage_metadata", td2(_write(".metadata", random.Random(106).randbytes(2048))), "corrupt", S({"CK106"}),
         sources=TD),
    Case("missing_common_pt", td2(_rm("common.pt")), "corrupt", S({"CK105"}), sources=TD),
    Case("zarr_broken_zarray", _mutated(lambda ctx: copy_source(ctx, "mcore_0_15_3_zarr") / "iter_0000001",
                                        _broken_zarray, lambda p: p.parent), "corrupt", S({"CK113"}),
         sources=("mcore_0_15_3_zarr",)),
    Case("empty_dir", _empty_dir, "unrecognized", S({"CK100"}), subprocess=True),
    Case("garbage_file", _garbage_file("garbage.bin"), "unrecognized", S({"CK100"})),
    Case("garbage_pt_file", _garbage_file("model.pt"), "corrupt", S({"CK206"})),
)
