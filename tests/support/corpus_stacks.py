"""Acceptance cases for the training stacks (Megatron-Bridge, NeMo 2, NVRx local, torchtitan, Megatron FSDP,
non-persistent).

Each copies a stack sample (`sample_ckpts/{bridge,nemo2,nvrx_local,torchtitan,megatron_fsdp}`, see
sample_ckpts/README.md) and applies ONE mutation that mimics what a crash, a lost file or an attacker leaves,
following the stack's write order (`ckptinspect/formats/stacks.py`, `formats/nvrx_local.py`,
`formats/megatron_fsdp.py`). `tests/acceptance/test_acceptance.py` runs them with the rest.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from corpus_kit import (Case, Ctx, Hostile, append_item, copy_source, drop_object, edit_metadata, rename_object,
                        torch_bytes, truncate)

BRIDGE, NEMO, NVRX, TITAN, TD = ("bridge",), ("nemo2",), ("nvrx_local",), ("torchtitan",), ("torch_dist",)
FSDP, FSDP_ITER = ("megatron_fsdp",), "iter_0000001"
FSDP_FC1_V = "model.module.decoder.layers.1.mlp.linear_fc1.weight_v"
FSDP_UNEVEN = "model.module.decoder.layers.0.mlp.linear_fc1.weight_w"  # chunks of 4 and 60 rows (rank 0 / rank 1)
FSDP_META = "optimizer.param_to_group_meta.module.module.module.decoder.layers.0.self_attention.linear_qkv.weight."
NEMO_CKPT = "default--reduced_train_loss=0.00-epoch=0-consumed_samples=4.0-step=1"
S = frozenset
Mutation = Callable[[Path, Ctx], object]


def _at(source: str, sub: str, mutate: Mutation | None = None, target: str | None = None) -> Callable[[Ctx], Path]:
    """Copy `source`, mutate `source/sub`, audit `source/target` (default: `sub`)."""

    def build(ctx: Ctx) -> Path:
        root = copy_source(ctx, source)
        if mutate is not None:
            mutate(root / sub, ctx)
        return root / (sub if target is None else target)

    return build


def _rm(name: str) -> Mutation:
    def mutate(d: Path, ctx: Ctx) -> None:
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return mutate


def _write(name: str, data: bytes) -> Mutation:
    return lambda d, ctx: (d / name).write_bytes(data)


def _hostile_train_state(d: Path, ctx: Ctx) -> None:
    (d / "train_state.pt").write_bytes(torch_bytes({"step": 2, "payload": Hostile(ctx.marker)}))


def _unsafe_yaml(d: Path, ctx: Ctx) -> None:
    # What an unsafe loader (yaml.load / yaml.unsafe_load) would run; the safe loader must refuse it.
    (d / "run_config.yaml").write_text(f'model: !!python/object/apply:os.system ["touch {ctx.marker}"]\n')


def _hf_tokenizer(d: Path, ctx: Ctx) -> None:
    text = (d / "run_config.yaml").read_text()
    (d / "run_config.yaml").write_text(text.replace("tokenizer_type: NullTokenizer",
                                                    "tokenizer_type: HuggingFaceTokenizer"))


def _payload_only(d: Path, ctx: Ctx) -> None:
    """Bridge killed after dist_checkpointing.save returned: metadata.json is there, nothing of Bridge's own."""
    (d / "train_state.pt").unlink()
    (d / "run_config.yaml").unlink()


def _bridge_before_tracker(save: Path, ctx: Ctx) -> None:
    """Killed after latest_train_state.pt was copied, before the tracker and run_config.yaml were written."""
    (save / "latest_checkpointed_iteration.txt").write_text("1")
    (save / "iter_0000002" / "run_config.yaml").unlink()


def _bridge_iter_deleted(save: Path, ctx: Ctx) -> None:
    """iter_0000002 deleted by hand after the save; latest_train_state.pt still names step 2."""
    shutil.rmtree(save / "iter_0000002")
    (save / "latest_checkpointed_iteration.txt").write_text("1")


def _unfinished(d: Path, ctx: Ctx) -> None:
    (d.parent / f"{d.name}-unfinished").touch()  # ModelCheckpoint.set_checkpoint_unfinished_marker


def _nemo_weights(mutate: Mutation) -> Mutation:
    """`mutate` applied to a NeMo 2 checkpoint's payload dir `<ckpt>/weights/` (where Megatron's save wrote it)."""
    return lambda d, ctx: mutate(d / "weights", ctx)


def _hostile_rng_item(ckpt: Path, ctx: Ctx) -> None:
    """Megatron byte items are `torch.save([obj])` archives (strategies/torch.py): a hostile rng_state cell."""
    with edit_metadata(ckpt) as md:
        append_item(ckpt, md, "rng_state/shard_0.0_1.1", torch_bytes([Hostile(ctx.marker)]))


def _manifest(ckpt: Path, ctx: Ctx) -> None:
    """`manifest write` of the NeMo 2 checkpoint: `integrity.json` in `weights/`, as Megatron's own writes it."""
    from ckptinspect.api import write_manifest

    write_manifest(ckpt)


def _manifest_then_flip(ckpt: Path, ctx: Ctx) -> None:
    _manifest(ckpt, ctx)
    with open(ckpt / "weights" / "__0_0.distcp", "r+b") as f:  # inside a tensor's bytes: only a hash sees it
        f.seek(20_000)
        b = f.read(1)
        f.seek(20_000)
        f.write(bytes([b[0] ^ 0xFF]))


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _nvrx_rank1_dirty(root: Path, ctx: Ctx) -> None:
    """Rank 1 crashed mid-write: its file is still `…_local.dirty.pt` (local_manager.py `_save`), so no rank-1 file."""
    f = root / "1" / "iter_0000002_1_local.pt"
    f.rename(f.with_name("iter_0000002_1_local.dirty.pt"))


def _nvrx_replica(root: Path, ctx: Ctx) -> None:
    """Rank 1's own copy is lost but rank 0 holds its replica (replication): the iteration is still whole."""
    shutil.copy(root / "1" / "iter_0000002_1_local.pt", root / "0" / "iter_0000002_1_local.pt")
    (root / "1" / "iter_0000002_1_local.pt").unlink()


def _nvrx_hostile_rank1(root: Path, ctx: Ctx) -> None:
    (root / "1" / "iter_0000002_1_local.pt").write_bytes(torch_bytes({"common": Hostile(ctx.marker)}))


def _titan_hostile_item(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        append_item(ckpt, md, "train_state.ntokens_seen", torch_bytes(Hostile(ctx.marker)))


def _non_persistent(save: Path, ctx: Ctx) -> None:
    """Megatron `--non-persistent-ckpt-type global`: `{save}/non_persistent/` with its own tracker, newest only."""
    npd = save / "non_persistent"
    npd.mkdir()
    shutil.copytree(save / "iter_0000002", npd / "iter_0000002")
    (npd / "latest_checkpointed_iteration.txt").write_text("2")


def _fsdp_edit(change: Callable[[object], object]) -> Mutation:
    def mutate(ckpt: Path, ctx: Ctx) -> None:
        with edit_metadata(ckpt) as md:
            change(md)

    return mutate


def _fsdp_drop_meta(md: object) -> None:
    for key in [k for k in md.state_dict_metadata if k.startswith(FSDP_META)]:  # type: ignore[attr-defined]
        drop_object(md, key)


def _fsdp_move_rng(md: object) -> None:
    for key in [k for k in md.state_dict_metadata if k.startswith("rng_state.(0, 0).")]:  # type: ignore[attr-defined]
        rename_object(md, key, key.replace("(0, 0)", "(1, 0)", 1))


def _fsdp_hostile(key: str) -> Mutation:
    def mutate(ckpt: Path, ctx: Ctx) -> None:
        with edit_metadata(ckpt) as md:
            append_item(ckpt, md, key, torch_bytes(Hostile(ctx.marker)))

    return mutate


def _fsdp_crash_in_next_save(save: Path, ctx: Ctx) -> None:
    """The next save died inside `dcp.save`: data files written, `.metadata` (written last, by the coordinator) and the
    tracker (after the barrier) not."""
    shutil.copytree(save / FSDP_ITER, save / "iter_0000002")
    (save / "iter_0000002" / ".metadata").unlink()


def _fsdp_truncate_metadata(ckpt: Path, ctx: Ctx) -> None:
    truncate(ckpt / ".metadata")


STACK_CASES: tuple[Case, ...] = (
    # healthy stack samples: no false alarm
    Case("ok_bridge_save_dir", _at("bridge", ""), "complete", S(),
         S({"CK120", "CK122", "CK504", "CK506", "CK508", "CK509", "CK510", "CK701"}), sources=BRIDGE),
    Case("ok_nemo2_checkpoints_dir", _at("nemo2", "checkpoints"), "complete", S(),
         S({"CK121", "CK507", "CK701", "CK506"}), sources=NEMO),
    Case("ok_nvrx_local_root", _at("nvrx_local", ""), "complete", S(), S({"CK512", "CK513", "CK602", "CK206"}),
         sources=NVRX),
    Case("ok_torchtitan_save_dir", _at("torchtitan", ""), "complete", S(), S({"CK506", "CK602"}), sources=TITAN),
    # Megatron-Bridge: each crash stage of its write order
    Case("bridge_crash_before_train_state", _at("bridge", "iter_0000002", _payload_only), "incomplete",
         S({"CK508"}), sources=BRIDGE),
    Case("bridge_crash_before_run_config", _at("bridge", "iter_0000002", _rm("run_config.yaml"), ""),
         "incomplete", S({"CK509", "CK504"}), sources=BRIDGE),
    Case("bridge_crash_before_tracker", _at("bridge", "", _bridge_before_tracker), "incomplete",
         S({"CK514", "CK509"}), sources=BRIDGE),
    Case("bridge_latest_train_state_names_missing_iteration", _at("bridge", "", _bridge_iter_deleted), "corrupt",
         S({"CK503", "CK514"}), sources=BRIDGE),
    Case("bridge_crash_before_tokenizer", _at("bridge", "iter_0000002", _hf_tokenizer), "complete",
         S({"CK510"}), sources=BRIDGE),
    Case("bridge_run_config_unsafe_yaml", _at("bridge", "iter_0000002", _unsafe_yaml), "corrupt", S({"CK120"}),
         sources=BRIDGE, subprocess=True),
    Case("bridge_train_state_not_a_dict", _at("bridge", "iter_0000002", _write("train_state.pt", torch_bytes([1]))),
         "corrupt", S({"CK122"}), sources=BRIDGE),
    Case("hostile_bridge_train_state", _at("bridge", "iter_0000002", _hostile_train_state), "unsafe", S({"CK601"}),
         sources=BRIDGE, subprocess=True),
    # NeMo 2
    Case("nemo2_unfinished_marker", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _unfinished), "incomplete",
         S({"CK507"}), sources=NEMO),
    Case("nemo2_unfinished_marker_save_dir", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _unfinished, "checkpoints"),
         "incomplete", S({"CK507"}), sources=NEMO),
    Case("nemo2_without_context", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _rm("context")), "complete",
         S({"CK121"}), sources=NEMO),
    # NeMo 2's data files are in `<ckpt>/weights/` (Checkpoint.data_dir): every check reads them there
    Case("ok_nemo2_checkpoints_dir_deep", _at("nemo2", "checkpoints"), "complete", S(),
         S({"CK201", "CK202", "CK205", "CK209"}), flags=("--deep",), sources=NEMO),
    Case("ok_nemo2_checkpoint_deep", _at("nemo2", f"checkpoints/{NEMO_CKPT}"), "complete", S(),
         S({"CK201", "CK202", "CK205", "CK209"}), flags=("--deep",), sources=NEMO),
    Case("nemo2_weights_distcp_missing", _at("nemo2", f"checkpoints/{NEMO_CKPT}",
                                             _nemo_weights(_rm("__1_0.distcp"))), "corrupt", S({"CK201"}),
         sources=NEMO),
    Case("nemo2_weights_distcp_truncated", _at("nemo2", f"checkpoints/{NEMO_CKPT}",
                                               _nemo_weights(lambda d, ctx: truncate(d / "__0_1.distcp"))),
         "corrupt", S({"CK202"}), sources=NEMO),
    Case("nemo2_weights_item_garbage_deep", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _nemo_weights(
        lambda d, ctx: _overwrite(d / "__1_0.distcp", 0, b"\x00" * 64))), "corrupt", S({"CK205"}),
         flags=("--deep",), sources=NEMO),
    Case("hostile_nemo2_rng_item", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _nemo_weights(_hostile_rng_item)),
         "unsafe", S({"CK601"}), sources=NEMO, subprocess=True),
    Case("nemo2_manifest_in_weights", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _manifest), "complete", S(),
         S({"CK400", "CK401", "CK402", "CK403"}), flags=("--hash",), sources=NEMO),
    Case("nemo2_manifest_byte_flip", _at("nemo2", f"checkpoints/{NEMO_CKPT}", _manifest_then_flip), "corrupt",
         S({"CK401"}), flags=("--hash",), sources=NEMO),
    # NVRx local checkpoints
    Case("nvrx_rank_missing_and_dirty", _at("nvrx_local", "", _nvrx_rank1_dirty), "incomplete",
         S({"CK512", "CK513"}), sources=NVRX),
    Case("nvrx_replica_covers_lost_rank_file", _at("nvrx_local", "", _nvrx_replica), "complete", S(),
         S({"CK512"}), sources=NVRX),
    Case("hostile_nvrx_local_rank1", _at("nvrx_local", "", _nvrx_hostile_rank1), "unsafe", S({"CK601"}),
         sources=NVRX, subprocess=True),
    # torchtitan: it loads only steps with .metadata (`_find_load_step`)
    Case("torchtitan_step_without_metadata", _at("torchtitan", "step-2", _rm(".metadata")), "incomplete",
         S({"CK102"}), sources=TITAN),
    Case("torchtitan_newest_step_without_metadata", _at("torchtitan", "step-2", _rm(".metadata"), ""),
         "complete", S({"CK506"}), sources=TITAN),
    Case("hostile_torchtitan_item", _at("torchtitan", "step-2", _titan_hostile_item), "unsafe", S({"CK601"}),
         sources=TITAN, subprocess=True),
    # Megatron non-persistent global checkpoints
    Case("non_persistent_global_dir", _at("torch_dist", "", _non_persistent), "complete", S({"CK511"}),
         sources=TD),
    # Megatron FSDP (fsdp_dtensor): plain DCP written by torch's FileSystemWriter, `.metadata` last
    Case("ok_megatron_fsdp_save_dir", _at("megatron_fsdp", ""), "complete", S(),
         S({"CK515", "CK516", "CK517", "CK301", "CK302", "CK506", "CK601", "CK602"}), sources=FSDP),
    Case("megatron_fsdp_without_metadata", _at("megatron_fsdp", FSDP_ITER, _rm(".metadata")), "incomplete",
         S({"CK102"}), sources=FSDP),
    Case("megatron_fsdp_crash_in_next_save", _at("megatron_fsdp", "", _fsdp_crash_in_next_save), "complete",
         S({"CK506"}), S({"CK504", "CK505"}), sources=FSDP),
    Case("megatron_fsdp_truncated_metadata", _at("megatron_fsdp", FSDP_ITER, _fsdp_truncate_metadata), "corrupt",
         S(), S({"CK515", "CK516", "CK517"}), sources=FSDP),
    Case("megatron_fsdp_rank1_distcp_missing", _at("megatron_fsdp", FSDP_ITER, _rm("__1_0.distcp")), "corrupt",
         S({"CK201"}), sources=FSDP),
    Case("megatron_fsdp_uneven_chunk_dropped", _at("megatron_fsdp", FSDP_ITER, _fsdp_edit(
        lambda md: md.state_dict_metadata[FSDP_UNEVEN].chunks.pop(1))), "corrupt", S({"CK301"}),  # type: ignore
         sources=FSDP),
    Case("megatron_fsdp_swiglu_half_missing", _at("megatron_fsdp", FSDP_ITER, _fsdp_edit(
        lambda md: drop_object(md, FSDP_FC1_V))), "corrupt", S({"CK515"}), sources=FSDP),
    Case("megatron_fsdp_rng_cell_off_grid", _at("megatron_fsdp", FSDP_ITER, _fsdp_edit(_fsdp_move_rng)), "complete",
         S({"CK516"}), sources=FSDP),
    Case("megatron_fsdp_param_group_meta_missing", _at("megatron_fsdp", FSDP_ITER, _fsdp_edit(_fsdp_drop_meta)),
         "corrupt", S({"CK517"}), sources=FSDP),
    Case("hostile_megatron_fsdp_args", _at("megatron_fsdp", FSDP_ITER, _fsdp_hostile("args")), "unsafe",
         S({"CK601"}), sources=FSDP, subprocess=True),
    Case("hostile_megatron_fsdp_param_group_item", _at("megatron_fsdp", FSDP_ITER, _fsdp_hostile(FSDP_META + "lr")),
         "unsafe", S({"CK601"}), sources=FSDP, subprocess=True),
)
