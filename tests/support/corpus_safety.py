"""Acceptance cases: hostile pickles (CK6xx): never executed (the marker file must not appear), status unsafe.

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

from corpus_kit import (
    CallsTimeit,
    Case,
    Ctx,
    DCP,
    Harmless,
    Hostile,
    LEG,
    M19,
    RNG_CELL,
    S,
    TD,
    _legacy_pt,
    _nest,
    append_item,
    dcp,
    edit_metadata,
    edit_torch_file,
    legacy,
    m19,
    td2,
    torch_bytes,
)


def _unjudged_common_pt(ckpt: Path, ctx: Ctx) -> None:
    """common.pt's data.pkl claims 4 GiB uncompressed in both zip headers: the scanner does not inflate it past its
    bound, so that pickle was never judged: fail closed (CK605), not `corrupt`."""
    blob = bytearray((ckpt / "common.pt").read_bytes())
    name = next(n for n in (b"common/data.pkl", b"archive/data.pkl") if n in blob)
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        k = blob.find(sig)
        while k >= 0 and name not in bytes(blob[k : k + 46 + len(name) + 30]):
            k = blob.find(sig, k + 4)
        blob[k + at : k + at + 4] = (0xFFFF_FFF0).to_bytes(4, "little")
    (ckpt / "common.pt").write_bytes(bytes(blob))


def _unknown_transform(ckpt: Path, ctx: Ctx) -> None:
    """One stored item claims a stream transform no reader here decodes (`stream.lz4/1`): not scanned, so not
    complete (CK208), whatever its bytes are."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    with edit_metadata(ckpt) as md:
        idx = sorted(md.storage_data, key=lambda i: (i.fqn, str(i.offset)))[0]
        info = md.storage_data[idx]
        md.storage_data[idx] = _StorageInfo(info.relative_path, info.offset, info.length, ["stream.lz4/1"])


def _torchscript_common_pt(ckpt: Path, ctx: Ctx) -> None:
    """common.pt gains a `constants.pkl` record: torch.load hands such a zip to torch.jit.load (CK606)."""
    from hostile_samples import write_zip, zip_entries

    entries = zip_entries((ckpt / "common.pt").read_bytes())
    prefix = next(n for n, _ in entries if n.endswith("/data.pkl"))[: -len("data.pkl")]
    (ckpt / "common.pt").write_bytes(write_zip(entries + [(prefix + "constants.pkl", pickle.dumps((), protocol=2))]))


def _hostile_metadata_bare(ckpt: Path, ctx: Ctx) -> None:
    (ckpt / ".metadata").write_bytes(pickle.dumps(Hostile(ctx.marker), protocol=2))


def _hostile_in_planner_data(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        md.planner_data["payload"] = Hostile(ctx.marker)


def _hostile_common_pt(ckpt: Path, ctx: Ctx) -> None:
    edit_torch_file(ckpt / "common.pt", lambda common: common.__setitem__("payload", Hostile(ctx.marker)))


def _timeit_common_pt(ckpt: Path, ctx: Ctx) -> None:
    edit_torch_file(ckpt / "common.pt", lambda common: common.__setitem__("payload", CallsTimeit(ctx.marker)))


def _timeit_in_planner_data(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        if md.planner_data is None:  # Megatron's saves carry none; plain DCP's is a dict
            md.planner_data = {}
        md.planner_data["payload"] = CallsTimeit(ctx.marker)


def _hostile_legacy_pt(it: Path, ctx: Ctx) -> None:
    edit_torch_file(it / "mp_rank_01_000" / "model_optim_rng.pt",
                    lambda sd: sd.__setitem__("payload", Hostile(ctx.marker)))


def _hostile_item(key: str) -> Callable[[Path, Ctx], None]:
    """Megatron byte items are `torch.save([obj])` archives (strategies/torch.py): store a hostile one as `key`."""

    def mutate(ckpt: Path, ctx: Ctx) -> None:
        with edit_metadata(ckpt) as md:
            append_item(ckpt, md, key, torch_bytes([Hostile(ctx.marker)]))

    return mutate



SAFETY_CASES: tuple[Case, ...] = (
    Case("hostile_metadata", td2(_hostile_metadata_bare), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_metadata_planner_data", dcp(_hostile_in_planner_data), "unsafe", S({"CK601"}), sources=DCP,
         subprocess=True),
    Case("hostile_common_pt", td2(_hostile_common_pt), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_common_pt_timeit", td2(_timeit_common_pt), "unsafe", S({"CK604"}), sources=TD, subprocess=True),
    # .metadata is read once, by sniff, and handed to the reader: the call must survive the hand-over
    Case("hostile_metadata_timeit_dcp", dcp(_timeit_in_planner_data), "unsafe", S({"CK604"}), sources=DCP,
         subprocess=True),
    Case("hostile_metadata_timeit_torch_dist", td2(_timeit_in_planner_data), "unsafe", S({"CK604"}), sources=TD,
         subprocess=True),
    Case("hostile_legacy_model_pt", legacy(_hostile_legacy_pt), "unsafe", S({"CK601"}), sources=LEG,
         subprocess=True),
    Case("hostile_common_state_item", m19(_hostile_item("common_state/shard_0_1")), "unsafe", S({"CK601", "CK401"}),
         flags=("--hash",), sources=M19, subprocess=True),
    Case("hostile_rng_item", td2(_hostile_item(RNG_CELL)), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_rng_item_deep", td2(_hostile_item(RNG_CELL)), "unsafe", S({"CK601"}), flags=("--deep",),
         sources=TD, subprocess=True),
    # an unknown class only referenced (the class object itself) is opaque, a warning; an INSTANCE of it is built
    # by NEWOBJ, a call of a global that is not an inert constructor: torch.load would run it, so unsafe (CK604)
    Case("unknown_global_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", lambda sd: sd.__setitem__(
        "extra", Harmless))), "complete", S({"CK602"}), S({"CK601", "CK604"}), sources=LEG),
    Case("unknown_class_called_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", lambda sd: sd.__setitem__(
        "extra", Harmless()))), "unsafe", S({"CK604"}), S({"CK601"}), sources=LEG),
    Case("deeply_nested_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", _nest(600))), "corrupt", S({"CK603"}), sources=LEG,
         subprocess=True),
    Case("unjudged_member_common_pt", td2(_unjudged_common_pt), "unsafe", S({"CK605"}), sources=TD, subprocess=True),
    Case("torchscript_common_pt", td2(_torchscript_common_pt), "unsafe", S({"CK606"}), sources=TD, subprocess=True),
    Case("unknown_transform_dcp", dcp(_unknown_transform), "incomplete", S({"CK208"}), sources=DCP),
)
