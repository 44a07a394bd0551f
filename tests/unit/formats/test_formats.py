"""Readers and sniffing on the real samples and the 0.19.2 fixture; small parsers on their edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptinspect.formats import READERS, read_checkpoint
from ckptinspect.formats.dcp.metadata import parse_shard_key
from ckptinspect.formats.legacy import expected_shard_dirs, parse_shard_dir, shard_coords
from ckptinspect.formats.savedir import read_tracker
from ckptinspect.model import Format

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"
FIXTURE = SAMPLES / "mcore_0_19_2" / "iter_0000400"


def test_every_format_has_a_reader() -> None:
    assert {f for f, _ in READERS} == set(Format)


def test_torch_dist_016_common_pt() -> None:
    c = read_checkpoint(SAMPLES / "torch_dist" / "iter_0000002", "x")
    assert c.format is Format.TORCH_DIST and c.generation == "megatron-core 0.16-0.18 (common.pt)"
    assert c.iteration == 2 and c.args is not None and c.args["num_layers"] == 2
    assert c.common is not None and c.common["checkpoint_version"] == 3.0
    assert len(c.rank_items) == 8  # all_local_plans: save-time world size
    assert c.topology.world_size == 8 and c.layout["rng_tp"] == 2
    assert not [f for f in c.findings if f.severity.value == "error"]


def test_torch_dist_019_common_state_item() -> None:
    c = read_checkpoint(FIXTURE, "fx")
    assert c.generation == "megatron-core>=0.19 (common_state item)"
    assert c.iteration == 400 and c.optimizer_sharding == "dp_reshardable"
    assert c.args is not None and c.args["padded_vocab_size"] == 256
    assert any(o.key == "common_state/shard_0_1" for o in c.objects)


def test_half_written_torch_dist_is_not_plain_dcp() -> None:
    c = read_checkpoint(SAMPLES / "torch_dist" / "iter_0000003", "x", megatron_context=True)
    assert c.format is Format.TORCH_DIST
    assert [f.code for f in c.findings][:1] == ["CK101"]


def test_plain_dcp() -> None:
    c = read_checkpoint(SAMPLES / "dcp" / "step-10", "x")
    assert c.format is Format.TORCH_DCP and c.iteration == 10
    assert c.extra["planner_keys"]  # flatten_state_dict=True: a non-empty fqn map


def test_legacy_reads_every_shard_without_tensor_bytes() -> None:
    c = read_checkpoint(SAMPLES / "legacy" / "iter_0000001", "x")
    assert c.format is Format.TORCH and c.topology.tp == 2 and c.topology.pp == 2
    shards = {t.shard for t in c.tensors}
    assert shards == set(expected_shard_dirs(2, 2, 1))
    t = next(t for t in c.tensors if t.key.endswith("word_embeddings.weight"))
    assert t.chunks[0].storage is not None and t.chunks[0].storage.length == t.nbytes


def test_shard_key_parsing() -> None:
    assert parse_shard_key("rng_state/shard_0.1_2.2") == ("rng_state", (0, 1), (2, 2))
    assert parse_shard_key("a.b/_extra_state/shard_3_4") == ("a.b/_extra_state", (3,), (4,))
    assert parse_shard_key("old/shard_0.1_2") == ("old", (0, 1), (2, -1))  # Megatron appends -1 for old keys
    assert parse_shard_key("embedding.weight") is None


def test_legacy_dir_name_ambiguity_resolved_by_args() -> None:
    s = parse_shard_dir("mp_rank_01_002")
    assert s is not None
    assert shard_coords(s, pp=4, ep=1) == (1, 2, 0)
    assert shard_coords(s, pp=1, ep=4) == (1, 0, 2)
    assert expected_shard_dirs(2, 1, 2) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]


@pytest.mark.parametrize(("text", "iteration", "error"), [
    ("400", 400, False), (" 12\n", 12, False), ("release", "release", False), ("", None, True),
    ("abc", None, True), ("-3", None, True),
])
def test_tracker_parsing(tmp_path: Path, text: str, iteration: object, error: bool) -> None:
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(text)
    t = read_tracker(tmp_path)
    assert t.iteration == iteration and (t.error is not None) == error


def test_unflattened_plain_dcp_is_not_an_unfinished_torch_dist() -> None:
    """`DefaultSavePlanner(flatten_state_dict=False)` writes `planner_data` None, as Megatron's MCoreSavePlanner does:
    without a Megatron marker (common state, ShardedObject keys, `all_local_plans`, `mcore_data`) it is plain DCP
    (torch's own load reads both samples back: `tools/_dcp_writers.py`)."""
    for case in ("unflattened", "unflattened_top"):
        c = read_checkpoint(SAMPLES / "dcp_writers" / case, case)
        assert c.format is Format.TORCH_DCP, (case, c.findings)
        assert c.extra["sniff_state"] == "complete" and c.extra["planner_keys"] is None
        assert any("flatten_state_dict=False" in e for e in c.extra["evidence"])
        assert not [f for f in c.findings if f.code in ("CK101", "CK105")]
