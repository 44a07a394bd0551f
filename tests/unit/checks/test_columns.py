"""The checks read the chunk table's columns (`checks/columns.py`, coverage / storage / summary) and give what the
exact per-tensor code gives: the coverage screen misses no tensor with a finding on any DCP sample, acceptance
checkpoint, or random 1-D / N-D chunking with gaps, overlaps, out-of-bounds and missing storage; the summary's
column sums are the per-chunk sums. Also: sniff and reader read `.metadata` once; `--deep` opens each file once."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.summary import summarize
from ckptinspect.checks import CheckContext
from ckptinspect.checks import coverage, storage
from ckptinspect.formats import files as _files, read_checkpoint
from ckptinspect.formats.dcp import stream as dcp_stream
from ckptinspect.model import Checkpoint, Chunk, Format, StoredItem
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from conftest import SAMPLES
from corpus import CASES, Ctx, missing_source

DCP_DIRS = sorted(p.parent for p in SAMPLES.glob("**/.metadata"))


def exhaustive_coverage(ckpt: Checkpoint) -> list[Any]:
    """Coverage findings with every tensor through the exact code (no screen)."""
    table = ckpt.table.replicas_once() if ckpt.rank_metadata else ckpt.table
    out = [f for t in table.tensors for f in coverage.tensor_findings(ckpt, t)]
    return out + [f for f in coverage.run(ckpt, CheckContext()) if f.subject in {o.key for o in ckpt.objects}]


def per_chunk_bytes(ckpt: Checkpoint) -> dict[str, int]:
    """Stored bytes per file, summed over the chunk objects and the byte items."""
    acc: dict[str, int] = defaultdict(int)
    for t in ckpt.tensors:
        for c in t.chunks:
            if c.storage is not None:
                acc[c.storage.file] += c.storage.length
    for o in ckpt.objects:
        if o.storage is not None:
            acc[o.storage.file] += o.storage.length
    return dict(acc)


def check_same(ckpt: Checkpoint) -> None:
    assert list(coverage.run(ckpt, CheckContext())) == exhaustive_coverage(ckpt)
    s = summarize(ckpt)
    assert {k: sum(v.values()) for k, v in s.by_file.items()} == per_chunk_bytes(ckpt)
    assert s.chunks == sum(len(t.chunks) for t in ckpt.tensors)


@pytest.mark.parametrize("path", DCP_DIRS, ids=[str(p.relative_to(SAMPLES)) for p in DCP_DIRS])
def test_samples_screen_misses_nothing(path: Path) -> None:
    check_same(read_checkpoint(path, str(path)))


@pytest.mark.slow
def test_acceptance_checkpoints_screen_misses_nothing(tmp_path: Path) -> None:
    n = 0
    for i, case in enumerate(CASES):
        if any(missing_source(s) for s in case.sources) or not set(case.sources) & {"torch_dist", "dcp"}:
            continue
        root = case.build(Ctx(tmp_path / f"c{i}", tmp_path / f"m{i}")) if (tmp_path / f"c{i}").mkdir() is None \
            else None
        assert root is not None
        for md in ([root / ".metadata"] if (root / ".metadata").exists() else list(root.glob("*/.metadata"))):
            check_same(read_checkpoint(md.parent, str(md.parent)))
            n += 1
    assert n >= 20


def _random_tensor(rng: random.Random, i: int) -> TensorEntry:
    item = StoredItem(f"__{i % 3}_0.distcp", i * 100, 10)
    if rng.random() < 0.7:  # 1-D: a tiling, then damage
        dim = rng.randint(0, 60)
        cuts = sorted(rng.sample(range(1, dim), min(dim - 1, rng.randint(0, 5)))) if dim > 1 else []
        bounds = [0, *cuts, dim]
        chunks = [Chunk((a,), (b - a,), item) for a, b in zip(bounds, bounds[1:])]
        for _ in range(rng.randint(0, 2)):
            kind = rng.choice(["drop", "dup", "shift", "oob", "nostore", "zero", "neg"])
            if kind == "drop" and chunks:
                chunks.pop(rng.randrange(len(chunks)))
            elif kind == "dup" and chunks:
                chunks.append(rng.choice(chunks))
            elif kind == "shift" and chunks:
                c = chunks.pop(rng.randrange(len(chunks)))
                chunks.append(Chunk((c.offsets[0] + rng.randint(-3, 3),), c.sizes, item))
            elif kind == "oob":
                chunks.append(Chunk((dim - 1,), (5,), item))
            elif kind == "nostore" and chunks:
                c = chunks.pop()
                chunks.append(Chunk(c.offsets, c.sizes, None))
            elif kind == "zero":
                chunks.append(Chunk((rng.randint(0, max(dim, 1)),), (0,), item))
            elif kind == "neg":
                chunks.append(Chunk((-2,), (3,), item))
        rng.shuffle(chunks)
        return TensorEntry(f"opt.bucket_{i}", (dim,), "float32", chunks)
    rows, cols = rng.randint(1, 4), rng.randint(1, 4)
    chunks = [Chunk((r * 2, c * 3), (2, 3), item) for r in range(rows) for c in range(cols)]
    if chunks and rng.random() < 0.5:
        chunks.pop(rng.randrange(len(chunks)))
    return TensorEntry(f"w_{i}", (rows * 2, cols * 3), "bfloat16", chunks)


@pytest.mark.parametrize("seed", range(20))
def test_random_chunkings_screen_misses_nothing(seed: int) -> None:
    rng = random.Random(seed)
    ckpt = Checkpoint("x", Format.TORCH_DCP, table=ChunkTable.of(_random_tensor(rng, i) for i in range(40)))
    found = list(coverage.run(ckpt, CheckContext()))
    assert found == exhaustive_coverage(ckpt)
    assert seed or found  # the damage is found at all (seed 0 damages some tensor)


@pytest.mark.skipif(missing_source("torch_dist") is not None, reason="sample absent")
def test_metadata_read_once_by_sniff_and_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptinspect.commands.audit.audit import audit
    from corpus import copy_source

    ckpt = copy_source(Ctx(tmp_path, tmp_path / "m"), "dcp") / "step-10"
    calls = []
    real = dcp_stream._read

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(dcp_stream, "_read", counted)
    audit(ckpt)
    assert len(calls) == 1


@pytest.mark.skipif(missing_source("torch_dist") is not None, reason="sample absent")
def test_deep_opens_each_data_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus import copy_source

    ckpt_dir = copy_source(Ctx(tmp_path, tmp_path / "m"), "torch_dist") / "iter_0000002"
    ckpt = read_checkpoint(ckpt_dir, str(ckpt_dir))
    opened: list[str] = []
    real = _files.open_regular

    def counting(path: Any) -> Any:
        opened.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(_files, "open_regular", counting)
    found = list(storage.run(ckpt, CheckContext(deep=True)))
    assert not [f for f in found if f.code == "CK205"]
    data = [n for n in opened if n.endswith(".distcp")]
    assert data and len(data) == len(set(data))
