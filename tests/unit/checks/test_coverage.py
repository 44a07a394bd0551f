"""Coverage check: exact gaps / overlaps / bounds on builder tensors, and clean coverage on real checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptinspect.checks.coverage import tensor_coverage
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import Chunk, StoredItem, Tensor
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "sample_ckpts" / "mcore_0_19_2" / "iter_0000400"
_ITEM = StoredItem("__0_0.distcp", 0, 1)


def tensor(shape: tuple[int, ...], *boxes: tuple[tuple[int, ...], tuple[int, ...]], storage: bool = True) -> Tensor:
    chunks = [Chunk(o, s, _ITEM if storage else None) for o, s in boxes]
    return ChunkTable.of([TensorEntry("t", shape, "float32", chunks)]).tensors[0]


def test_regular_2d_grid_is_exact() -> None:
    t = tensor((4, 6), ((0, 0), (2, 3)), ((0, 3), (2, 3)), ((2, 0), (2, 3)), ((2, 3), (2, 3)))
    cov = tensor_coverage(t)
    assert cov.ok and cov.covered == 24 and cov.exact


def test_2d_gap_reports_coordinates() -> None:
    t = tensor((4, 6), ((0, 0), (2, 3)), ((0, 3), (2, 3)), ((2, 0), (2, 3)))
    cov = tensor_coverage(t)
    assert cov.gap == 6 and cov.overlap == 0
    assert cov.gaps == (((2, 3), (2, 3)),)


def test_2d_overlap_of_irregular_boxes() -> None:
    t = tensor((4, 4), ((0, 0), (3, 3)), ((2, 2), (2, 2)), ((0, 3), (2, 1)), ((3, 0), (1, 2)), ((2, 3), (1, 1)))
    cov = tensor_coverage(t)
    assert cov.overlap == 2  # (2,2) covered twice by box 1 and 2; (2,3) by box 2 and 5
    assert cov.gap == 0
    covered = [[0] * 4 for _ in range(4)]
    for c in t.chunks:
        for i in range(c.offsets[0], c.offsets[0] + c.sizes[0]):
            for j in range(c.offsets[1], c.offsets[1] + c.sizes[1]):
                covered[i][j] += 1
    assert cov.gap == sum(v == 0 for row in covered for v in row)
    assert cov.overlap == sum(max(v - 1, 0) for row in covered for v in row)


def test_1d_irregular_buckets_like_distopt() -> None:
    # dp_reshardable buckets: contiguous irregular pieces incl. tiny padding chunks tile [0, numel)
    cuts = [0, 7, 8, 100, 101, 250, 256]
    t = tensor((256,), *(((a,), (b - a,)) for a, b in zip(cuts, cuts[1:])))
    assert tensor_coverage(t).ok


def test_1d_gap_and_overlap() -> None:
    t = tensor((100,), ((0,), (40,)), ((30,), (20,)), ((60,), (40,)))
    cov = tensor_coverage(t)
    assert cov.gaps == (((50,), (10,)),)
    assert cov.overlaps == (((30,), (10,)),)


def test_out_of_bounds_and_missing_storage() -> None:
    t = tensor((10,), ((0,), (10,)), ((8,), (4,)))
    assert tensor_coverage(t).out_of_bounds == 1
    t2 = tensor((10,), ((0,), (10,)), storage=False)
    assert tensor_coverage(t2).no_storage == 1


def test_zero_dim_tensor() -> None:
    assert tensor_coverage(tensor((), ((), ()))).ok
    assert tensor_coverage(tensor(())).gap == 1
    assert tensor_coverage(tensor((), ((), ()), ((), ()))).overlap == 1


def test_stacked_3d_layer_axis() -> None:
    # Megatron stacked layers: (L, 3h, h) with chunk (1, 3h/TP, h) per (layer, tp)
    boxes = [((layer, tp * 6, 0), (1, 6, 4)) for layer in range(4) for tp in range(2)]
    assert tensor_coverage(tensor((4, 12, 4), *boxes)).ok
    cov = tensor_coverage(tensor((4, 12, 4), *boxes[:-1]))
    assert cov.gap == 24 and cov.gaps == (((3, 6, 0), (1, 6, 4)),)


def test_real_checkpoint_covers_exactly() -> None:
    ckpt = read_checkpoint(FIXTURE, str(FIXTURE))
    covs = [tensor_coverage(t) for t in ckpt.tensors]
    assert covs and all(c.ok for c in covs), [c.key for c in covs if not c.ok]
    assert sum(c.chunks for c in covs) == 583


def test_200k_1d_chunks_cover_exactly() -> None:
    # correctness at scale only: speed is measured by benchmarks/bench_coverage.py, never asserted in tests
    n = 200_000
    t = tensor((n * 3,), *(((i * 3,), (3,)) for i in range(n)))
    assert tensor_coverage(t).ok


def test_fallback_reports_a_gap_an_overlap_of_the_same_volume_hides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback (grids too irregular to compress) used the volume sum: 4 elements covered twice made up for 4
    elements covered by nothing, and it reported a complete tensor."""
    from ckptinspect.checks import coverage

    t = tensor((4, 4), ((0, 0), (2, 4)), ((2, 0), (2, 2)), ((0, 0), (2, 2)))  # gap (2,2)+(2,2); overlap (0,0)+(2,2)
    exact = tensor_coverage(t)
    assert exact.exact and (exact.gap, exact.overlap) == (4, 4)
    monkeypatch.setattr(coverage, "MAX_CELLS", 0)
    fallback = tensor_coverage(t)
    assert not fallback.exact
    assert (fallback.gap, fallback.overlap, fallback.covered) == (4, 4, 12)


def test_fallback_agrees_with_the_exact_method_on_random_boxes(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from ckptinspect.checks import coverage

    rng = random.Random(15)
    for _ in range(300):
        ndim = rng.randint(1, 3)
        shape = tuple(rng.randint(1, 6) for _ in range(ndim))
        boxes = []
        for _ in range(rng.randint(1, 6)):
            lo = tuple(rng.randint(0, n - 1) for n in shape)
            boxes.append((lo, tuple(rng.randint(1, n - o) for o, n in zip(lo, shape))))
        t = tensor(shape, *boxes)
        monkeypatch.setattr(coverage, "MAX_CELLS", 20_000_000)
        exact = tensor_coverage(t)
        monkeypatch.setattr(coverage, "MAX_CELLS", 0)
        fallback = tensor_coverage(t)
        assert (fallback.gap, fallback.overlap, fallback.covered) == (exact.gap, exact.overlap, exact.covered), boxes
