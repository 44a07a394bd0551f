"""The value-scan kernel (ckptinspect/services/values*.py) against torch and against the fingerprint's definition.

- statistics equal torch's on random tensors of every supported dtype salted with NaN, ±Inf, subnormals, ±0.0 and
  (fp8) every byte pattern, e4m3fn's NaN encodings included;
- the fingerprint equals a plain-Python implementation of docs/contract.md's "Value fingerprint" text (so the
  documented definition is the computed one), is the same for every chunking (1-D runs, 2-D / 3-D boxes split along
  any axis, chunks fed in several buffers, any merge order), and changes with any one element, with the dtype and
  with the shape;
- unsupported dtypes and bad geometry are results / ValueErrors, never crashes.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptinspect.services import values as V
from ckptinspect.services.values import TensorValues, chunk_runs, geometry, scan_chunk, scan_run

FLOATS = ["float32", "float64", "float16", "bfloat16"]
FP8 = ["float8_e4m3fn", "float8_e5m2"]
INTS = ["int8", "uint8", "int16", "int32", "int64", "bool", "uint16", "uint32", "uint64"]

# --- the definition, as docs/contract.md states it, in plain Python -------------------------------------------------
MASK = (1 << 64) - 1
CB = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)
CA = (0x452821E638D01377, 0xBE5466CF34E90C6C, 0xC0AC29B7C97C50DD, 0x3F84D5B5B5470917)


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_fingerprint(raw: bytes, itemsize: int, dtype: str, shape: Sequence[int]) -> str:
    s = 1 if itemsize <= 2 else itemsize // 2
    lanes = [0, 0, 0, 0]
    for i in range(len(raw) // itemsize):
        e = raw[i * itemsize : (i + 1) * itemsize]
        syms = [e[0]] if itemsize == 1 else [int.from_bytes(e[2 * j : 2 * j + 2], "little") for j in range(s)]
        rho, c = i >> 8, i & 255
        for k in range(4):
            big_s = sum((u + 1) * ((_splitmix64(CB[k] ^ (c * s + j)) >> 37) | 1) for j, u in enumerate(syms))
            lanes[k] = (lanes[k] + (_splitmix64(CA[k] ^ rho) | 1) * big_s) & MASK
    text = "|".join(["ckptinspect-fp1", dtype, ",".join(map(str, shape)), *(f"{v:016x}" for v in lanes)])
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


# --- tensors ----------------------------------------------------------------------------------------------------------
def tdtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def salted(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A random tensor of `name` with NaN, ±Inf, subnormals, +0.0 and -0.0 at random places (fp8: random bytes,
    so every encoding occurs; ints: random values over the dtype's range)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    if name in FP8:
        return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(tdtype(name)).reshape(shape)
    if name in ("uint16", "uint32", "uint64"):
        bits = np.random.default_rng(seed).integers(0, 256, size=n * int(name[4:]) // 8, dtype=np.uint8)
        return torch.from_numpy(bits.view(f"<{name[0]}{int(name[4:]) // 8}").copy()).reshape(shape)
    if name == "bool":
        return torch.randint(0, 2, (n,), generator=g).bool().reshape(shape)
    if name.startswith("int") or name == "uint8":
        info = torch.iinfo(tdtype(name))
        return torch.randint(info.min, info.max, (n,), generator=g, dtype=tdtype(name)).reshape(shape)
    t = torch.randn(n, generator=g, dtype=torch.float64) * 3
    idx = torch.randperm(n, generator=g)
    tiny = torch.finfo(tdtype(name)).tiny
    eps = torch.finfo(tdtype(name)).eps
    # the smallest normal (not subnormal) and the largest subnormal on either side of the boundary
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, tiny / 4, -tiny / 2, tiny * 0.75, tiny, -tiny,
                tiny * (1 - eps)]
    for j, v in enumerate(specials):
        if j < n // 4:
            t[idx[j]] = v
    return t.to(tdtype(name)).reshape(shape)


def truth(t: torch.Tensor) -> dict[str, object]:
    """What the scan should report, computed by torch (float64 on the finite elements)."""
    flat = t.reshape(-1)
    is_float = t.dtype.is_floating_point
    ints = None if is_float else [int(v) for v in flat.numpy().astype(object)]  # exact, uint64 included
    if flat.dtype in (torch.uint16, torch.uint32, torch.uint64):
        flat = torch.from_numpy(flat.numpy().astype(np.float64))
    if is_float:
        flat = flat.double()  # exact for every float dtype; torch has no isinf for fp8
    nanm = torch.isnan(flat) if is_float else torch.zeros_like(flat, dtype=torch.bool)
    infm = torch.isinf(flat) if is_float else torch.zeros_like(flat, dtype=torch.bool)
    fin = flat[~(nanm | infm)].double()
    out: dict[str, object] = {
        "count": flat.numel(), "nan": int(nanm.sum()), "posinf": int((infm & (flat > 0)).sum()),
        "neginf": int((infm & (flat < 0)).sum()), "zeros": int((flat == 0).sum()), "finite": fin.numel(),
    }
    if is_float:
        tiny = torch.finfo(t.dtype).tiny
        subm = (flat != 0) & (flat.abs() < tiny) & ~nanm
        out["subnormal"] = int(subm.sum())
        out["first_subnormal"] = int(subm.nonzero()[0, 0]) if subm.any() else None
        out["first_nan"] = int(nanm.nonzero()[0, 0]) if nanm.any() else None
        out["first_inf"] = int(infm.nonzero()[0, 0]) if infm.any() else None
    if fin.numel():
        out.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()),
                   std=float(fin.std(correction=0)), l2=float(fin.norm()), absmax=float(fin.abs().max()))
    if ints:
        out.update(min=min(ints), max=max(ints), absmax=max(abs(min(ints)), abs(max(ints))))
    return out


def check_stats(r: TensorValues, t: torch.Tensor) -> None:
    want = truth(t)
    s = r.stats
    for k in ("count", "nan", "posinf", "neginf", "zeros", "finite", "subnormal", "first_nan", "first_inf",
              "first_subnormal"):
        if k in want:
            assert getattr(s, k) == want[k], k
    if "min" not in want:
        assert s.min is None and s.std is None
        return
    assert s.min == want["min"] and s.max == want["max"] and s.absmax == want["absmax"]
    scale = max(float(want["absmax"]), 1e-300)  # type: ignore[arg-type]
    # float32 accumulation inside a block (numpy pairwise sum, BLAS dot), float64 across blocks
    assert s.mean == pytest.approx(want["mean"], rel=1e-5, abs=1e-6 * scale)
    assert s.std == pytest.approx(want["std"], rel=1e-5, abs=1e-6 * scale)
    assert s.l2 == pytest.approx(want["l2"], rel=1e-5)


# --- statistics -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FLOATS + FP8 + INTS)
def test_stats_equal_torch(name: str) -> None:
    t = salted(name, (300, 77))
    check_stats(scan_run(raw(t), name, t.shape), t)


@pytest.mark.parametrize("name", FLOATS)
def test_stats_across_blocks_and_chunks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks smaller than a run, chunks along both axes, a chunk fed in two buffers: the same stats as torch."""
    monkeypatch.setattr(V, "BLOCK", 1000)
    t = salted(name, (130, 97), seed=3)
    parts = [
        scan_chunk(raw(t[:, :40]), name, t.shape, (0, 0), (130, 40)),
        scan_chunk(raw(t[:70, 40:]), name, t.shape, (0, 40), (70, 57)),
    ]
    rest = raw(t[70:, 40:])
    cut = 7 * t.element_size() * 13  # not a run boundary
    parts.append(scan_chunk(rest[:cut], name, t.shape, (70, 40), (60, 57)))
    parts.append(scan_chunk(rest[cut:], name, t.shape, (70, 40), (60, 57), local_start=cut // t.element_size()))
    random.Random(1).shuffle(parts)
    merged = TensorValues(name, tuple(t.shape))
    for p in parts:
        merged = merged.merge(p)
    check_stats(merged, t)
    assert merged.fingerprint == scan_run(raw(t), name, t.shape).fingerprint


def test_fp8_decoding_equals_torch() -> None:
    """Every byte of both fp8 formats decodes to torch's value (e4m3fn: 0x7F / 0xFF are NaN and there is no Inf)."""
    from ckptinspect.services.values_stats import BYTE_TABLES

    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for name in FP8:
        want = b.view(tdtype(name)).double().numpy()
        got = BYTE_TABLES[name].values
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    assert not np.isinf(BYTE_TABLES["float8_e4m3fn"].values).any()
    assert sorted(np.flatnonzero(np.isnan(BYTE_TABLES["float8_e4m3fn"].values))) == [0x7F, 0xFF]


def test_float_extremes_and_signs() -> None:
    """All-negative, all-positive, -0.0 only, huge values (float32 sums would overflow), one finite value."""
    cases = {
        "neg": -torch.rand(500) - 1, "pos": torch.rand(500) + 1, "negzero": torch.full((300,), -0.0),
        "huge": torch.full((400,), 3e38) * torch.randn(400).sign(), "one": torch.tensor([float("nan"), 2.5, float("inf")]),
        "mean_dominates": 1000 + torch.rand(5000) * 1e-3,
    }
    for case, t in cases.items():
        for name in ("float32", "bfloat16", "float64"):
            u = t.to(tdtype(name))
            check_stats(scan_run(raw(u), name, u.shape), u)


@pytest.mark.parametrize("name", FLOATS)
def test_smallest_magnitude_either_sign(name: str) -> None:
    """The zero / subnormal test reads the smallest magnitude off the bit patterns: a lone negative or positive
    subnormal among normals is found, the smallest normal of either sign is not one."""
    tiny = torch.finfo(tdtype(name)).tiny
    for lone in (-tiny / 2, tiny / 2, -0.0, 0.0):
        t = (torch.rand(3000, dtype=torch.float64) + 1).to(tdtype(name))
        t[1234] = lone
        check_stats(scan_run(raw(t), name, t.shape), t)
    t = torch.tensor([tiny, -tiny, 1.0, -2.0] * 100, dtype=torch.float64).to(tdtype(name))
    r = scan_run(raw(t), name, t.shape)
    assert r.stats.subnormal == r.stats.zeros == 0
    check_stats(r, t)


def test_all_nan_has_no_moments() -> None:
    t = torch.full((64,), float("nan"))
    r = scan_run(raw(t), "float32", t.shape)
    assert r.stats.nan == 64 and r.stats.finite == 0 and r.stats.min is None and r.stats.std is None
    assert r.stats.first_nan == 0 and r.fingerprint is not None


# --- the fingerprint's definition ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 301), (4, 256)])  # off the 256-element row grid / on it (two code paths)
@pytest.mark.parametrize("name", FLOATS + FP8 + INTS)
def test_fingerprint_is_the_documented_definition(name: str, shape: tuple[int, int]) -> None:
    t = salted(name, shape, seed=5)
    assert scan_run(raw(t), name, t.shape).fingerprint == reference_fingerprint(raw(t), t.element_size(), name, t.shape)


def test_fingerprint_of_empty_and_scalar() -> None:
    assert scan_run(b"", "float32", (0, 5)).fingerprint == reference_fingerprint(b"", 4, "float32", (0, 5))
    one = raw(torch.tensor(1.5))
    assert scan_run(one, "float32", ()).fingerprint == reference_fingerprint(one, 4, "float32", ())


# --- invariance under chunking ---------------------------------------------------------------------------------------
def split_points(n: int, k: int, rng: random.Random) -> list[int]:
    return sorted({0, n, *(rng.randrange(1, n) for _ in range(k))})


@pytest.mark.parametrize("name", ["bfloat16", "float32", "float64", "float8_e5m2", "int64"])
def test_fingerprint_same_for_any_1d_split(name: str) -> None:
    t = salted(name, (5000,), seed=7)
    b, z = raw(t), t.element_size()
    whole = scan_run(b, name, t.shape)
    rng = random.Random(11)
    for _ in range(5):
        cuts = split_points(t.numel(), rng.randrange(1, 12), rng)
        parts = [scan_run(b[a * z : c * z], name, t.shape, a) for a, c in zip(cuts, cuts[1:])]
        rng.shuffle(parts)
        merged = TensorValues(name, tuple(t.shape))
        for p in parts:
            merged = merged.merge(p)
        assert merged.fingerprint == whole.fingerprint
        m, w = merged.stats, whole.stats
        exact = ("count", "nan", "posinf", "neginf", "zeros", "subnormal", "finite", "min", "max", "first_nan",
                 "first_inf", "first_subnormal")
        assert [getattr(m, k) for k in exact] == [getattr(w, k) for k in exact]
        # float32 inside a block: another split rounds differently, within the documented 1e-6
        assert m.mean == pytest.approx(w.mean, rel=1e-5, abs=1e-6) and m.std == pytest.approx(w.std, rel=1e-5)


def boxes(shape: tuple[int, ...], cuts: list[list[int]]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every box of the grid that `cuts` (per axis, from 0 to the size) make."""
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((), ())]
    for c in cuts:
        out = [(o + (a,), z + (b - a,)) for o, z in out for a, b in zip(c, c[1:])]
    return out


def scan_boxes(t: torch.Tensor, name: str, grid: list[list[int]], rng: random.Random) -> TensorValues:
    parts = []
    for off, size in boxes(tuple(t.shape), grid):
        piece = t[tuple(slice(o, o + z) for o, z in zip(off, size))]
        parts.append(scan_chunk(raw(piece), name, t.shape, off, size))
    rng.shuffle(parts)
    merged = TensorValues(name, tuple(t.shape))
    for p in parts:
        merged = merged.merge(p)
    return merged


@pytest.mark.parametrize("name", ["bfloat16", "float32", "float16", "uint8"])
@pytest.mark.parametrize("shape", [(512, 256), (97, 131), (6, 50, 44)])
def test_fingerprint_same_for_any_nd_split(name: str, shape: tuple[int, ...]) -> None:
    t = salted(name, shape, seed=9)
    whole = scan_run(raw(t), name, t.shape)
    rng = random.Random(13)
    grids = [[split_points(d, 0, rng) for d in shape]]  # one chunk
    for axis in range(len(shape)):  # along each axis alone
        grids.append([split_points(d, rng.randrange(1, 4), rng) if a == axis else [0, d] for a, d in enumerate(shape)])
    grids.append([split_points(d, rng.randrange(1, 4), rng) for d in shape])  # along all at once
    if shape == (512, 256):
        grids.append([[0, 256, 512], [0, 128, 256]])  # row-aligned (the fast path)
    for grid in grids:
        merged = scan_boxes(t, name, grid, rng)
        assert merged.complete
        assert merged.fingerprint == whole.fingerprint, grid
        assert merged.stats.nan == whole.stats.nan and merged.stats.min == whole.stats.min


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    data=st.data(),
)
def test_fingerprint_split_property(shape: tuple[int, ...], data: st.DataObject) -> None:
    t = salted("float32", shape, seed=data.draw(st.integers(0, 1000)))
    grid = [sorted({0, d, *data.draw(st.lists(st.integers(0, d), max_size=3))}) for d in shape]
    rng = random.Random(data.draw(st.integers(0, 1000)))
    merged = scan_boxes(t, "float32", grid, rng)
    assert merged.fingerprint == reference_fingerprint(raw(t), 4, "float32", shape)


def test_results_pickle() -> None:
    """Results cross process boundaries (a pool of scanning processes, a `--shard` part written and merged)."""
    import pickle

    r = scan_run(raw(salted("float16", (999,))), "float16", (999,))
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.fingerprint == r.fingerprint


def test_threads_give_the_same_result() -> None:
    t = salted("bfloat16", (700, 300), seed=2)
    want = scan_run(raw(t), "bfloat16", t.shape).fingerprint
    got: list[str | None] = []

    def work() -> None:
        for _ in range(3):
            got.append(scan_run(raw(t), "bfloat16", t.shape).fingerprint)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == [want] * 6


# --- sensitivity -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "int8"])
def test_any_one_element_change_changes_the_fingerprint(name: str) -> None:
    t = salted(name, (40, 33), seed=4)
    base = raw(t)
    z = t.element_size()
    seen = {scan_run(base, name, t.shape).fingerprint}
    rng = random.Random(5)
    positions = [0, t.numel() - 1, 255, 256, *(rng.randrange(t.numel()) for _ in range(6))]
    changes = 1
    for i in positions:
        for bit in range(8 * z):  # every bit of the element, one at a time
            b = bytearray(base)
            b[i * z + bit // 8] ^= 1 << (bit % 8)
            seen.add(scan_run(bytes(b), name, t.shape).fingerprint)
            changes += 1
    assert len(seen) == changes


def test_signed_zero_and_nan_payload_change_the_fingerprint() -> None:
    t = torch.zeros(1000)
    pos = scan_run(raw(t), "float32", t.shape)
    t[517] = -0.0
    neg = scan_run(raw(t), "float32", t.shape)
    assert pos.stats.zeros == neg.stats.zeros == 1000 and pos.fingerprint != neg.fingerprint
    a = np.zeros(10, dtype=np.uint32)
    a[3] = 0x7FC00000
    b = a.copy()
    b[3] = 0x7FC00001  # another quiet NaN payload
    fa, fb = scan_run(a.tobytes(), "float32", (10,)), scan_run(b.tobytes(), "float32", (10,))
    assert fa.stats.nan == fb.stats.nan == 1 and fa.fingerprint != fb.fingerprint


def test_same_bits_other_dtype_or_shape_differ() -> None:
    b = raw(salted("bfloat16", (64, 32), seed=1))
    prints = {scan_run(b, d, (64, 32)).fingerprint for d in ("bfloat16", "float16", "int16", "uint16")}
    prints |= {scan_run(b, "bfloat16", s).fingerprint for s in ((2048,), (32, 64), (2, 32, 32))}
    prints.add(scan_run(b, "float32", (1024,)).fingerprint)
    assert len(prints) == 8


def test_zeros_are_not_absent_elements() -> None:
    """An element of bits 0 contributes (the "+ 1"): a scan that misses a zero chunk is incomplete, and a tensor of
    zeros differs from a smaller one."""
    z = bytes(4 * 512)
    half = scan_run(z[:1024], "float32", (512,))
    assert not half.complete and half.fingerprint is None
    assert scan_run(z, "float32", (512,)).fingerprint != scan_run(z[:1024], "float32", (256,)).fingerprint


# --- runs, geometry, bad input -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_chunk_runs_cover_the_box(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=0, max_size=4)))
    offsets, sizes = [], []
    for d in shape:
        a = data.draw(st.integers(0, d))
        offsets.append(a)
        sizes.append(data.draw(st.integers(0, d - a)))
    want = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[
        tuple(slice(o, o + z) for o, z in zip(offsets, sizes))].ravel()
    got = [g for s, n in chunk_runs(shape, offsets, sizes) for g in range(s, s + n)]
    assert got == want.tolist()
    g = geometry(shape, offsets, sizes)
    n = g.numel
    if n:
        p = data.draw(st.integers(0, n - 1))
        k = data.draw(st.integers(1, n - p))
        starts, lengths = g.local_runs(p, k)
        assert [x for s, m in zip(starts.tolist(), lengths.tolist()) for x in range(s, s + m)] == want[p : p + k].tolist()


def test_unsupported_dtypes_are_results() -> None:
    for name in ("complex64", "float8_e4m3fnuz", "qint8", "no_such_dtype"):
        r = scan_run(b"\x00" * 16, name, (4,))
        assert r.unsupported and r.fingerprint is None and not r.complete
        assert scan_chunk(b"\x00" * 16, name, (4,), (0,), (4,)).unsupported


def test_bad_geometry_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        scan_chunk(bytes(16), "float32", (4,), (2,), (4,))  # outside the tensor
    with pytest.raises(ValueError):
        scan_chunk(bytes(16), "float32", (4, 4), (0,), (4,))  # rank mismatch
    with pytest.raises(ValueError):
        scan_run(bytes(15), "float32", (4,))  # not whole elements
    with pytest.raises(ValueError):
        scan_run(bytes(16), "float32", (4,), start=1)  # overruns the tensor
    with pytest.raises(ValueError):
        scan_chunk(bytes(16), "float32", (8,), (0,), (4,), local_start=2)  # overruns the chunk
    with pytest.raises(ValueError):
        scan_run(bytes(8), "float32", (2,)).merge(scan_run(bytes(8), "float32", (1, 2)))


def test_unaligned_buffer() -> None:
    t = salted("float64", (333,), seed=8)
    b = bytearray(b"x" + raw(t))
    r = scan_run(memoryview(b)[1:], "float64", t.shape)
    assert r.fingerprint == scan_run(raw(t), "float64", t.shape).fingerprint


def test_services_do_not_import_torch() -> None:
    code = ("import sys; import ckptinspect.services.values as v; v.scan_run(bytes(8), 'bfloat16', (4,)); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
