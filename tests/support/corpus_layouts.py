"""Acceptance cases on the parallel-layout samples (MoE/EP, VPP, CP, SwiGLU + bf16, legacy EP/VPP).

Each healthy sample must audit `complete` with no warning or error; each corruption drops one piece that belongs to
one place of the layout — a chunk of one expert, of one VPP stage's layer, of one DP×CP rank's optimizer range, a
legacy EP shard dir — and must be named with its code and its coordinates (`tests/acceptance/test_acceptance.py` checks the
codes; `tests/unit/formats/test_layout_samples.py` checks where each finding points and that healthy samples have no warning).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from conftest import SAMPLES
from corpus_kit import SOURCES, Case, Ctx, _mutated, copy_source, edit_metadata

LAYOUT_SAMPLES = ("moe_ep2", "moe_tp2_ep2", "vpp", "vpp_fully", "cp2", "swiglu_bf16", "legacy_ep2",
                  "legacy_pp2_ep2", "legacy_vpp")
for _name in LAYOUT_SAMPLES:
    SOURCES[_name] = (SAMPLES / _name, ("latest_checkpointed_iteration.txt",))

IT = "iter_0000001"
EXPERT_FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"  # (2 layers, 4 experts, 64, 16)
QKV = "decoder.layers.self_attention.linear_qkv.weight"  # (4 layers, 48, 16) in the PP2 × VPP2 sample
CP_BUCKET = "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_0.exp_avg"


def _it(name: str, mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    """A mutation of sample `name`'s iter_0000001, audited as a checkpoint."""
    return _mutated(lambda ctx: copy_source(ctx, name) / IT, mutate)


def _drop_chunk_at(key: str, offsets: tuple[int, ...]) -> Callable[[Path, Ctx], None]:
    def mutate(ckpt: Path, ctx: Ctx) -> None:
        with edit_metadata(ckpt) as md:
            chunks = md.state_dict_metadata[key].chunks
            (i,) = (i for i, c in enumerate(chunks) if tuple(c.offsets) == offsets)
            chunks.pop(i)

    return mutate


def _rm_dir(name: str) -> Callable[[Path, Ctx], None]:
    def mutate(it: Path, ctx: Ctx) -> None:
        shutil.rmtree(it / name)

    return mutate


def _plain(name: str) -> Callable[[Ctx], Path]:
    return lambda ctx: copy_source(ctx, name)


S = frozenset

LAYOUT_CASES: tuple[Case, ...] = (
    *(Case(f"ok_layout_{n}", _plain(n), "complete", sources=(n,)) for n in LAYOUT_SAMPLES),
    # expert 3 of layer 1 (EP rank 1's second local expert) lost its linear_fc1 chunk
    Case("layout_dropped_expert_chunk", _it("moe_ep2", _drop_chunk_at(EXPERT_FC1, (1, 3, 0, 0))), "corrupt",
         S({"CK301"}), sources=("moe_ep2",)),
    # layer 2 = PP rank 0, virtual stage 1 of the PP2 × VPP2 sample
    Case("layout_dropped_vpp_stage_chunk", _it("vpp", _drop_chunk_at(QKV, (2, 0, 0))), "corrupt", S({"CK301"}),
         sources=("vpp",)),
    # one param range inside a DP×CP rank's share of the CP2 × DP2 sample's optimizer bucket
    Case("layout_dropped_dpcp_bucket_chunk", _it("cp2", _drop_chunk_at(CP_BUCKET, (2064,))), "corrupt",
         S({"CK301"}), sources=("cp2",)),
    # the legacy EP2 save without EP rank 1's shard dir
    Case("layout_missing_legacy_ep_shard", _mutated(lambda ctx: copy_source(ctx, "legacy_ep2") / IT,
                                                    _rm_dir("mp_rank_00_001"), lambda p: p.parent),
         "corrupt", S({"CK110"}), sources=("legacy_ep2",)),
)
