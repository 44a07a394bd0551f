"""Acceptance cases: storage (CK2xx): truncated, deleted, stale or overlapping data files and items; damaged payloads
(`--deep`); an item stored outside the checkpoint dir.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

from corpus_kit import (
    Case,
    Ctx,
    DCP,
    ITER2,
    S,
    TD,
    _rm,
    dcp,
    edit_metadata,
    items_in,
    read_metadata,
    td2,
    td_dir,
    truncate,
)


def _stale_distcp(ckpt: Path, ctx: Ctx) -> None:
    shutil.copyfile(ckpt / "__0_0.distcp", ckpt / "__9_0.distcp")


ORACLE = Path(__file__).resolve().parents[1] / "data" / "megatron_unit_oracle" / "peer_mcore.txz"
UNEVEN = "test_serialization.py_TestSerialization_test_uneven_1d_sharding_src_split7-dest_split7/0"


def _uneven_empty_shards(ctx: Ctx) -> Path:
    """A save Megatron-Core 0.16.1's own test_uneven_1d_sharding wrote on 8 ranks (tests/data/megatron_unit_oracle):
    ranks 6 and 7 hold empty shards at one offset; DCP names rank 7's, rank 6's data file is named by nothing."""
    import tarfile

    with tarfile.open(ORACLE) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"peer_mcore/{UNEVEN}/") and m.isfile()]
        for m in members:
            dst = ctx.work / "uneven" / Path(m.name).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            dst.write_bytes(src.read())
    return ctx.work / "uneven"


def _overlapping_items(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        (_, first), (k, second) = items_in(md, "__0_0.distcp", tensors=True)[:2]
        md.storage_data[k] = dataclasses.replace(second, offset=first.offset + first.length // 2)


def _garbage_item(ckpt: Path, ctx: Ctx) -> None:
    _, info = items_in(read_metadata(ckpt), "__1_0.distcp", tensors=True)[0]
    with open(ckpt / info.relative_path, "r+b") as f:
        f.seek(info.offset)
        f.write(random.Random(205).randbytes(info.length))


def _wrong_dtype(ckpt: Path, ctx: Ctx) -> None:
    import torch

    with edit_metadata(ckpt) as md:
        md.state_dict_metadata["model.output.weight"].properties.dtype = torch.float16


def _item_outside_dir(ckpt: Path, ctx: Ctx) -> None:
    """DCP's reader opens `relative_path` joined to the checkpoint dir as it stands: `../` leaves it. Move the
    data file of one stored item next to the checkpoint and point the item there."""
    import dataclasses
    import shutil

    outside = ckpt.parent / "outside_data"
    outside.mkdir(exist_ok=True)
    with edit_metadata(ckpt) as md:
        key = sorted(md.storage_data, key=lambda k: k.fqn)[0]
        info = md.storage_data[key]
        shutil.copy(ckpt / info.relative_path, outside / info.relative_path)
        md.storage_data[key] = dataclasses.replace(info, relative_path=f"../outside_data/{info.relative_path}")



STORAGE_CASES: tuple[Case, ...] = (
    Case("truncated_distcp", td2(lambda c, x: truncate(c / "__0_1.distcp")), "corrupt", S({"CK202"}), sources=TD),
    Case("truncated_distcp_in_save_dir", td_dir(lambda s, x: truncate(s / ITER2 / "__1_1.distcp")), "corrupt",
         S({"CK202"}), sources=TD, subprocess=True),
    Case("deleted_distcp", td2(_rm("__0_1.distcp")), "corrupt", S({"CK201"}), sources=TD),
    Case("stale_distcp", td2(_stale_distcp), "complete", S({"CK204"}), sources=TD),
    Case("writers_own_unreferenced_distcp", _uneven_empty_shards, "complete", S({"CK210"}), S({"CK204"})),
    Case("overlapping_items", dcp(_overlapping_items), "corrupt", S({"CK203"}), S({"CK202"}), sources=DCP),
    Case("garbage_item_deep", dcp(_garbage_item), "corrupt", S({"CK205"}), flags=("--deep",), sources=DCP),
    Case("garbage_item_shallow", dcp(_garbage_item), "complete", absent=S({"CK205"}), sources=DCP),
    Case("wrong_dtype_deep", dcp(_wrong_dtype), "corrupt", S({"CK205"}), flags=("--deep",), sources=DCP),
    Case("storage_item_outside_dir", td2(_item_outside_dir), "unsafe", S({"CK207"}), sources=TD, subprocess=True),
)
