"""Checks over the chunk table (`checks/columns.py`, coverage / storage / summary) give exactly what the object path
gives: on every DCP sample and acceptance checkpoint, and on random 1-D / N-D chunkings with gaps, overlaps,
out-of-bounds and missing storage. Also: sniff and reader read `.metadata` once; `--deep` opens each file once."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.summary import summarize
from ckptinspect.checks import CheckContext
from ckptinspect.checks import coverage, storage
from ckptinspect.formats import _files, read_checkpoint
from ckptinspect.formats.dcp import stream as dcp_stream
from ckptinspect.formats.dcp.table import table_from_tensors
from ckptinspect.model import Checkpoint, Chunk, Format, StoredItem, Tensor
from conftest import SAMPLES
from corpus import CASES, Ctx, missing_source

DCP_DIRS = sorted(p.parent for p in SAMPLES.glob("**/.metadata"))


def both_ways(ckpt: Checkpoint) -> tuple[Checkpoint, Checkpoint]:
    """The checkpoint with its chunk table, and the same content as plain objects without one."""
    assert ckpt.table is not None
    plain = tuple(dataclasses.replace(t, chunks=tuple(t.chunks)) for t in ckpt.tensors)
    return ckpt, dataclasses.replace(ckpt, tensors=plain, table=None)


def findings(ckpt: Checkpoint) -> list[Any]:
    ctx = CheckContext()
    return [f.to_dict() if hasattr(f, "to_dict") else f for f in [*coverage.run(ckpt, ctx), *storage.run(ckpt, ctx)]]


@pytest.mark.parametrize("path", DCP_DIRS, ids=[str(p.relative_to(SAMPLES)) for p in DCP_DIRS])
def test_samples_same_findings_and_summary(path: Path) -> None:
    table, plain = both_ways(read_checkpoint(path, str(path)))
    assert findings(table) == findings(plain)
    assert summarize(table) == summarize(plain)


@pytest.mark.slow
def test_acceptance_checkpoints_same_findings(tmp_path: Path) -> None:
    n = 0
    for i, case in enumerate(CASES):
        if any(missing_source(s) for s in case.sources) or not set(case.sources) & {"torch_dist", "dcp"}:
            continue
        root = case.build(Ctx(tmp_path / f"c{i}", tmp_path / f"m{i}")) if (tmp_path / f"c{i}").mkdir() is None \
            else None
        assert root is not None
        for md in ([root / ".metadata"] if (root / ".metadata").exists() else list(root.glob("*/.metadata"))):
            ckpt = read_checkpoint(md.parent, str(md.parent))
            if ckpt.table is None:
                continue
            a, b = both_ways(ckpt)
            assert findings(a) == findings(b), case.name
            n += 1
    assert n >= 20


def _random_tensor(rng: random.Random, i: int) -> Tensor:
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
        return Tensor(f"opt.bucket_{i}", (dim,), "float32", tuple(chunks))
    rows, cols = rng.randint(1, 4), rng.randint(1, 4)
    chunks = [Chunk((r * 2, c * 3), (2, 3), item) for r in range(rows) for c in range(cols)]
    if chunks and rng.random() < 0.5:
        chunks.pop(rng.randrange(len(chunks)))
    return Tensor(f"w_{i}", (rows * 2, cols * 3), "bfloat16", tuple(chunks))


@pytest.mark.parametrize("seed", range(20))
def test_random_chunkings_same_coverage_findings(seed: int) -> None:
    rng = random.Random(seed)
    tensors = tuple(_random_tensor(rng, i) for i in range(40))
    table = table_from_tensors(tensors, {})
    with_table = Checkpoint("x", Format.TORCH_DCP, tensors=table.tensor_views(), table=table)
    plain = Checkpoint("x", Format.TORCH_DCP, tensors=tensors)
    ctx = CheckContext()
    assert list(coverage.run(with_table, ctx)) == list(coverage.run(plain, ctx))


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
