"""DCP as torch writes it (issue 25 §4), with torch's own load as the oracle.

Every case of `tools/_dcp_writers.py` (the committed `sample_ckpts/dcp_writers/` samples, and copies broken the way a
crash or a bad disk breaks them) is loaded back by torch's `dcp.load` in the world size that wrote it — one spawned
run per world size for the whole module — and audited here. A checkpoint torch loads (values equal to what was
saved) must audit `complete`; one whose load fails must not, with the finding that says why.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptinspect.commands.audit.audit import AuditOptions, audit
from ckptinspect.findings import Status
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import Format

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "sample_ckpts" / "dcp_writers"
sys.path.insert(0, str(REPO / "tools"))
import _dcp_writers  # noqa: E402


def _rm(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def _rename(a: str, b: str) -> Callable[[Path], None]:
    return lambda d: (d / a).rename(d / b)


def _truncate(name: str, size: int) -> Callable[[Path], None]:
    def go(d: Path) -> None:
        with open(d / name, "r+b") as f:
            f.truncate(size)
    return go


@dataclass(frozen=True)
class Case:
    id: str
    sample: str
    loads: bool  # torch's own load succeeds (the oracle's answer, asserted)
    status: Status
    codes: frozenset[str] = frozenset()
    mutate: Callable[[Path], None] | None = None


CASES = [
    Case("per_rank", "per_rank", True, Status.COMPLETE),
    Case("per_rank_no_dist", "per_rank_no_dist", True, Status.COMPLETE),
    Case("per_rank_rank1_metadata_missing", "per_rank", False, Status.INCOMPLETE, frozenset({"CK102"}),
         _rm("__1.metadata")),
    Case("per_rank_rank1_metadata_tmp", "per_rank", False, Status.INCOMPLETE, frozenset({"CK103"}),
         _rename("__1.metadata", "__1.metadata.tmp")),
    Case("per_rank_rank1_data_truncated", "per_rank", False, Status.CORRUPT, frozenset({"CK202"}),
         _truncate("__1_0.distcp", 100)),
    Case("per_rank_no_dist_metadata_missing", "per_rank_no_dist", False, Status.INCOMPLETE, frozenset({"CK102"}),
         _rm("__0.metadata")),
    Case("unflattened", "unflattened", True, Status.COMPLETE),
    Case("unflattened_top", "unflattened_top", True, Status.COMPLETE),
    Case("unflattened_data_truncated", "unflattened", False, Status.CORRUPT, frozenset({"CK202"}),
         _truncate("__0_0.distcp", 200)),
    Case("hf_rank0", "hf_rank0", True, Status.COMPLETE),
    Case("hf_distributed", "hf_distributed", True, Status.COMPLETE),
    Case("hf_consolidated", "hf_consolidated", True, Status.COMPLETE),
    Case("hf_rank0_file_missing", "hf_rank0", False, Status.CORRUPT, frozenset({"CK201"}),
         _rm("model-00002-of-00002.safetensors")),
    Case("hf_distributed_shard_truncated", "hf_distributed", False, Status.CORRUPT, frozenset({"CK106"}),
         _truncate("shard-00002-model-00001-of-00001.safetensors", 100)),
    Case("hf_distributed_shard_data_truncated", "hf_distributed", False, Status.CORRUPT, frozenset({"CK202"}),
         _truncate("shard-00002-model-00001-of-00001.safetensors", 300)),
    Case("hf_consolidated_file_missing", "hf_consolidated", False, Status.CORRUPT, frozenset({"CK201"}),
         _rm("model-00001-of-00001.safetensors")),
    # FileSystemWriter(serialization_format=SAFETENSORS): every tensor item of a file points at the one safetensors
    # blob after the byte items; torch 2.13's FileSystemReader torch.loads each item and fails
    Case("safetensors_distcp", "safetensors_distcp", False, Status.CORRUPT, frozenset({"CK203"})),
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str | None]]:
    """case id -> (its dir, torch's load error or None)."""
    root = tmp_path_factory.mktemp("dcp_writers")
    written = root / "written"
    _dcp_writers.write(str(written), ["safetensors_distcp"])  # no sample: torch cannot load it back
    jobs = []
    dirs = {}
    for c in CASES:
        d = root / c.id
        shutil.copytree(SAMPLES / c.sample if (SAMPLES / c.sample).is_dir() else written / c.sample, d)
        if c.mutate is not None:
            c.mutate(d)
        dirs[c.id] = d
        jobs.append((c.sample, str(d)))
    healthy = [j for c, j in zip(CASES, jobs) if c.mutate is None and c.loads]
    errors = _dcp_writers.load_together(healthy)  # one run per world size
    errors.update(_dcp_writers.load([j for j in jobs if j not in healthy]))  # one run each: a failing rank desyncs
    return {cid: (d, errors[str(d)]) for cid, d in dirs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_load_and_audit_agree(case: Case, loaded: dict[str, tuple[Path, str | None]]) -> None:
    path, error = loaded[case.id]
    assert (error is None) == case.loads, error
    report = audit(path, AuditOptions(deep=True))
    codes = {f.code for f in report.findings}
    assert report.status is case.status, [f.to_dict() for f in report.findings]
    assert case.codes <= codes, codes
    assert (report.status is Status.COMPLETE) == (error is None)


def test_per_rank_metadata_is_merged_as_torch_writes_it() -> None:
    """Both ranks' `__R.metadata` read: the Shard(0) DTensor's two halves cover it, the replicated tensors are each
    rank's own copy (replicas, not overlaps), every stored item is in the model (none unreferenced)."""
    c = read_checkpoint(SAMPLES / "per_rank", "x")
    assert c.format is Format.TORCH_DCP and c.rank_metadata == ("__0.metadata", "__1.metadata")
    by_key = {t.key: t for t in c.tensors}
    assert sorted(ch.offsets for ch in by_key["w"].chunks) == [(0, 0), (4, 0)]
    assert [ch.storage.file for ch in by_key["r"].chunks if ch.storage] == ["__0_0.distcp", "__1_0.distcp"]
    assert c.topology.world_size == 2
    referenced = {ch.storage.file for t in c.tensors for ch in t.chunks if ch.storage}
    assert referenced == {"__0_0.distcp", "__1_0.distcp"}


def test_a_rank_gap_is_a_missing_rank(tmp_path: Path) -> None:
    """Rank 1 left no file at all while rank 2 did: a 3-rank load fails on rank 1 (no metadata for it)."""
    d = tmp_path / "gap"
    shutil.copytree(SAMPLES / "per_rank", d)
    (d / "__1.metadata").rename(d / "__2.metadata")
    (d / "__1_0.distcp").rename(d / "__2_0.distcp")
    report = audit(d)
    assert report.status is Status.INCOMPLETE
    (f,) = [f for f in report.findings if f.code == "CK102"]
    assert f.subject == "__1.metadata" and "left no file at all" in f.message


def test_hf_storage_is_read_as_torch_reads_it() -> None:
    """The distributed mode's two shard files hold w's halves at their DCP_SHARDING_INFO offsets and r once; the
    chunks' stored bytes are raw safetensors data inside each file."""
    c = read_checkpoint(SAMPLES / "hf_distributed", "x")
    assert c.format is Format.TORCH_DCP and c.raw_tensor_items and "HuggingFaceStorageWriter" in (c.generation or "")
    w = next(t for t in c.tensors if t.key == "w")
    assert w.shape == (8, 4) and w.dtype == "float32" and sorted(ch.offsets for ch in w.chunks) == [(0, 0), (4, 0)]
    assert all(ch.storage and ch.storage.length == 64 for ch in w.chunks)
    assert c.topology.world_size == 2


def test_global_metadata_wins_over_per_rank_files(tmp_path: Path) -> None:
    """torch reads `.metadata` first: leftover `__R.metadata` files beside a collective save are not read."""
    d = tmp_path / "both"
    shutil.copytree(SAMPLES / "unflattened_top", d)
    shutil.copy(SAMPLES / "per_rank" / "__0.metadata", d / "__0.metadata")
    c = read_checkpoint(d, "x")
    assert c.rank_metadata == () and audit(d).status is Status.COMPLETE
