"""Per-tensor value statistics decoded from raw element bytes, without torch: the dtypes that can be decoded
(`CODECS`), the accumulable `ValueStats` and the kernels that compute them for one block of elements.

Floating dtypes are read as bits (NaN, ±Inf, zero and subnormal from the exponent and mantissa fields, so a NaN
payload or a -0.0 is seen as stored) and as values (bfloat16 shifted into float32, float16 cast to float32).
One-byte dtypes (float8_e4m3fn, float8_e5m2, int8, uint8, bool) are counted into a 256-bin histogram and every
statistic is read off it exactly. min / max / mean / std / l2 / absmax are over the finite elements only (NaN and
±Inf are counted, not folded in), so one NaN does not hide the rest of the distribution.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Number = int | float


class Kind(enum.Enum):
    FLOAT = "float"  # IEEE-style binary float read through a float32/float64 view
    BYTE = "byte"  # one-byte dtype: 256-bin histogram over a decode table
    INT = "int"  # 16/32/64-bit integers


@dataclass(frozen=True, slots=True)
class Codec:
    """How to decode one dtype.

    name: the dtype as ckptinspect spells it (``bfloat16``).
    width: bits per element.
    kind: which kernel reads it.
    bits: the unsigned little-endian numpy type of one element's raw bits.
    typed: the little-endian numpy type the values are read as (FLOAT: the native float, INT: the integer).
    exp_mask / min_normal: FLOAT only: the exponent field's mask and the smallest normal's bit pattern.
    """

    name: str
    width: int
    kind: Kind
    bits: str
    typed: str = ""
    exp_mask: int = 0
    min_normal: int = 0

    @property
    def itemsize(self) -> int:
        return self.width // 8

    @property
    def abs_mask(self) -> int:
        return (1 << (self.width - 1)) - 1


def _fp8_values(exp_bits: int, man_bits: int, ieee_specials: bool) -> npt.NDArray[np.float64]:
    """The value of every byte of an fp8 format (OCP FP8: E4M3 has no Inf and one NaN mantissa, E5M2 is IEEE)."""
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(256, dtype=np.float64)
    top = (1 << exp_bits) - 1
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> man_bits) & top
        m = b & ((1 << man_bits) - 1)
        if ieee_specials and e == top:
            out[b] = sign * math.inf if m == 0 else math.nan
        elif not ieee_specials and e == top and m == (1 << man_bits) - 1:
            out[b] = math.nan  # e4m3fn: S.1111.111 is NaN, the rest of the top binade is finite (up to 448)
        elif e == 0:
            out[b] = sign * m * 2.0 ** (1 - bias - man_bits)
        else:
            out[b] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


@dataclass(frozen=True, slots=True)
class ByteTable:
    """Decode table of a one-byte dtype: the value of each of the 256 bytes and what kind of value it is."""

    values: npt.NDArray[np.float64]
    nan: npt.NDArray[np.bool_]
    posinf: npt.NDArray[np.bool_]
    neginf: npt.NDArray[np.bool_]
    zero: npt.NDArray[np.bool_]
    subnormal: npt.NDArray[np.bool_]
    integral: bool  # min / max reported as ints (int8, uint8, bool)


def _byte_table(name: str) -> ByteTable:
    b = np.arange(256)
    no = np.zeros(256, dtype=bool)
    if name == "int8":
        vals = b.astype(np.int8).astype(np.float64)
    elif name == "uint8":
        vals = b.astype(np.float64)
    elif name == "bool":
        vals = (b != 0).astype(np.float64)  # torch reads any non-zero byte as True
    else:
        vals = _fp8_values(4, 3, False) if name == "float8_e4m3fn" else _fp8_values(5, 2, True)
    integral = name in ("int8", "uint8", "bool")
    nan = np.isnan(vals)
    man_bits = 3 if name == "float8_e4m3fn" else 2
    exp_zero = ((b >> man_bits) & (0xF if man_bits == 3 else 0x1F)) == 0
    sub = no if integral else exp_zero & ((b & ((1 << man_bits) - 1)) != 0)
    return ByteTable(
        values=vals, nan=nan, posinf=vals == math.inf, neginf=vals == -math.inf,
        zero=(b == 0) if name == "bool" else vals == 0, subnormal=sub, integral=integral,
    )


CODECS: dict[str, Codec] = {
    c.name: c
    for c in (
        Codec("float32", 32, Kind.FLOAT, "<u4", "<f4", 0x7F800000, 0x00800000),
        Codec("float64", 64, Kind.FLOAT, "<u8", "<f8", 0x7FF0000000000000, 0x0010000000000000),
        Codec("float16", 16, Kind.FLOAT, "<u2", "<f2", 0x7C00, 0x0400),
        Codec("bfloat16", 16, Kind.FLOAT, "<u2", "", 0x7F80, 0x0080),
        Codec("float8_e4m3fn", 8, Kind.BYTE, "u1"),
        Codec("float8_e5m2", 8, Kind.BYTE, "u1"),
        Codec("int8", 8, Kind.BYTE, "u1"),
        Codec("uint8", 8, Kind.BYTE, "u1"),
        Codec("bool", 8, Kind.BYTE, "u1"),
        Codec("int16", 16, Kind.INT, "<u2", "<i2"),
        Codec("uint16", 16, Kind.INT, "<u2", "<u2"),
        Codec("int32", 32, Kind.INT, "<u4", "<i4"),
        Codec("uint32", 32, Kind.INT, "<u4", "<u4"),
        Codec("int64", 64, Kind.INT, "<u8", "<i8"),
        Codec("uint64", 64, Kind.INT, "<u8", "<u8"),
    )
}
BYTE_TABLES: dict[str, ByteTable] = {n: _byte_table(n) for n, c in CODECS.items() if c.kind is Kind.BYTE}


def _min_index(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _pick(a: Number | None, b: Number | None, f: Callable[[Number, Number], Number]) -> Number | None:
    if a is None:
        return b
    if b is None:
        return a
    return f(a, b)


@dataclass(frozen=True, slots=True)
class ValueStats:
    """Statistics of a set of elements of one tensor; `merge` combines two disjoint sets (any order, any split:
    counts, min, max and first indices exactly, mean and m2 up to the rounding of float64 sums).

    count: elements seen. nan / posinf / neginf / zeros (+0 and -0) / subnormal: elements of each kind.
    finite: elements that are neither NaN nor ±Inf: those `min`, `max`, `mean` and `m2` describe.
    min / max: the smallest / largest finite value (an int for integer dtypes), None without finite elements.
    mean: their mean; m2: the sum of their squared deviations from it (Chan et al.'s parallel update).
    first_nan / first_inf / first_subnormal: the smallest global flat index of an element of that kind.
    """

    count: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    subnormal: int = 0
    finite: int = 0
    min: Number | None = None
    max: Number | None = None
    mean: float = 0.0
    m2: float = 0.0
    first_nan: int | None = None
    first_inf: int | None = None
    first_subnormal: int | None = None

    @property
    def std(self) -> float | None:
        """Population standard deviation (``correction=0``) of the finite elements."""
        return math.sqrt(max(self.m2, 0.0) / self.finite) if self.finite else None

    @property
    def l2(self) -> float | None:
        """L2 norm of the finite elements: ``sqrt(m2 + finite * mean^2)``."""
        return math.sqrt(max(self.m2, 0.0) + self.finite * self.mean * self.mean) if self.finite else None

    @property
    def absmax(self) -> Number | None:
        """Largest |x| of the finite elements."""
        if self.min is None or self.max is None:
            return None
        return max(abs(self.min), abs(self.max))

    def merge(self, other: ValueStats) -> ValueStats:
        na, nb = self.finite, other.finite
        n = na + nb
        if na == 0 or nb == 0:
            mean, m2 = (self.mean, self.m2) if nb == 0 else (other.mean, other.m2)
        else:
            delta = other.mean - self.mean
            mean = self.mean + delta * (nb / n)
            m2 = self.m2 + other.m2 + delta * delta * (na * (nb / n))
        return ValueStats(
            count=self.count + other.count, nan=self.nan + other.nan, posinf=self.posinf + other.posinf,
            neginf=self.neginf + other.neginf, zeros=self.zeros + other.zeros,
            subnormal=self.subnormal + other.subnormal, finite=n,
            min=_pick(self.min, other.min, min), max=_pick(self.max, other.max, max), mean=mean, m2=m2,
            first_nan=_min_index(self.first_nan, other.first_nan),
            first_inf=_min_index(self.first_inf, other.first_inf),
            first_subnormal=_min_index(self.first_subnormal, other.first_subnormal),
        )


ToGlobal = Callable[[int], int]  # a block's local element position -> global flat index


class Scratch:
    """One thread's reusable buffers for blocks of up to `size` elements (no allocation per block)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.f32 = np.empty(size, dtype=np.float32)
        self.f32b = np.empty(size, dtype=np.float32)
        self.f64 = np.empty(size, dtype=np.float64)
        self.sym = np.empty(1 << 16, dtype=np.float64)  # a slice of a block's fingerprint symbols, widened
        self.narrow = {w: np.empty(size, dtype=f"<u{w // 8}") for w in (16, 32, 64)}


def _first(mask: npt.NDArray[np.bool_], to_global: ToGlobal) -> int:
    return to_global(int(np.argmax(mask)))


def _sumsq(x: npt.NDArray[Any]) -> float:
    """Sum of squares without BLAS: OpenBLAS runs a dot of more than 10000 elements on all its threads, so two
    scanning threads would fight over the cores and the scan would not scale (measured: no gain from 1 to 2
    threads with `np.dot`); numpy's einsum loop runs on the calling thread."""
    return float(np.einsum("i,i->", x, x))


def _moments(f: npt.NDArray[Any], work: npt.NDArray[Any]) -> tuple[float, float]:
    """(mean, m2) of the finite float array `f`: numpy's pairwise sum and a sum of squares when the mean is
    small beside the spread (``mean^2 <= E[x^2] / 64``: the subtraction ``Q - S^2/n`` then loses no precision that
    matters), else a second, centred pass; in float64 when float32 would overflow."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below and redone in float64
        return _moments_inner(f, work)


def _moments_inner(f: npt.NDArray[Any], work: npt.NDArray[Any]) -> tuple[float, float]:
    n = len(f)
    s = float(np.add.reduce(f))
    q = _sumsq(f)
    if math.isfinite(s) and math.isfinite(q):
        if s * s / n <= q / 64:
            return s / n, max(q - s * s / n, 0.0)
        mean = s / n
        d = work[:n]
        np.subtract(f, f.dtype.type(mean), out=d)
        m2 = _sumsq(d)
        if math.isfinite(m2):
            return mean, m2
    # float32 overflowed, or float64 did: scale by a power of two near the largest |x| (exact), then scale back
    # (an m2 beyond float64's range stays inf: values near 1e308)
    e = math.frexp(float(np.max(np.abs(f))))[1]
    f64 = np.ldexp(f.astype(np.float64), -e)
    mean = float(np.add.reduce(f64)) / n
    f64 -= mean
    return float(np.ldexp(mean, e)), float(np.ldexp(_sumsq(f64), 2 * e))


def decode_float(codec: Codec, pattern: int) -> float:
    """The value of one FLOAT bit pattern."""
    if codec.name == "bfloat16":
        return float(struct.unpack("<f", struct.pack("<I", pattern << 16))[0])
    fmt = {16: ("<H", "<e"), 32: ("<I", "<f"), 64: ("<Q", "<d")}[codec.width]
    return float(struct.unpack(fmt[1], struct.pack(fmt[0], pattern))[0])


def float_block(bits: npt.NDArray[Any], codec: Codec, scratch: Scratch, to_global: ToGlobal) -> ValueStats:
    """Stats of a block of a FLOAT dtype given as its raw bits (an unsigned array of the element width).

    min / max come from the bit patterns (sign-magnitude order): the largest pattern read as signed is the largest
    non-negative value (a NaN or +Inf when it reaches the exponent mask), the largest unsigned pattern the most
    negative value (-NaN / -Inf likewise), so the common block needs no float min / max and no NaN mask."""
    n = len(bits)
    if codec.name == "bfloat16":
        f: npt.NDArray[Any] = scratch.f32[:n]
        np.left_shift(bits, 16, out=f.view(np.uint32), dtype=np.uint32)
    elif codec.name == "float16":
        f = scratch.f32[:n]
        np.copyto(f, bits.view(np.float16))
    else:
        f = bits.view(codec.typed)
    # where `_moments` centres the values: not where `f` lives (scratch.f32 holds a widened 16-bit block)
    work: npt.NDArray[Any] = scratch.f64 if codec.width == 64 else scratch.f32 if codec.width == 32 else scratch.f32b
    sign = 1 << (codec.width - 1)
    signed = bits.view(f"<i{codec.itemsize}")
    smax = int(np.maximum.reduce(signed))
    umax = int(np.maximum.reduce(bits))
    # the smallest magnitude: the smallest non-negative pattern (unsigned min, when below the sign bit) or the
    # negative pattern nearest to the sign bit (signed min, plus 2^(w-1)): two narrow reductions, no mask
    umin = int(np.minimum.reduce(bits))
    smin = int(np.minimum.reduce(signed))
    least = min(umin if umin < sign else sign, smin + sign if smin < 0 else sign)
    nan = posinf = neginf = 0
    first_nan = first_inf = first_sub = None
    mn: float | None = None
    mx: float | None = None
    a: npt.NDArray[Any] | None = None
    if smax >= codec.exp_mask or umax >= sign | codec.exp_mask:
        a = np.bitwise_and(bits, codec.abs_mask, out=scratch.narrow[codec.width][:n], casting="unsafe")
        nan_mask = a > codec.exp_mask
        inf_mask = a == codec.exp_mask
        nan = int(np.count_nonzero(nan_mask))
        n_inf = int(np.count_nonzero(inf_mask))
        if n_inf:
            neginf = int(np.count_nonzero(inf_mask & (bits > codec.abs_mask)))
            posinf = n_inf - neginf
            first_inf = _first(inf_mask, to_global)
        if nan:
            first_nan = _first(nan_mask, to_global)
        f = f[~(nan_mask | inf_mask)]
        if len(f):
            mn, mx = float(np.minimum.reduce(f)), float(np.maximum.reduce(f))
    else:
        # no non-negative / no negative element: the extreme is the smallest pattern
        mx = decode_float(codec, smax if smax >= 0 else umin)
        mn = decode_float(codec, umax if umax >= sign else umin)
    zeros = sub = 0
    if least < codec.min_normal:
        if a is None:
            a = np.bitwise_and(bits, codec.abs_mask, out=scratch.narrow[codec.width][:n], casting="unsafe")
        zeros = n - int(np.count_nonzero(a))
        small = a < codec.min_normal
        sub = int(np.count_nonzero(small)) - zeros
        if sub:
            first_sub = _first(small & (a != 0), to_global)
    finite = len(f)
    mean, m2 = _moments(f, work) if finite else (0.0, 0.0)
    return ValueStats(
        count=n, nan=nan, posinf=posinf, neginf=neginf, zeros=zeros, subnormal=sub, finite=finite,
        min=mn if finite else None, max=mx if finite else None, mean=mean, m2=m2,
        first_nan=first_nan, first_inf=first_inf, first_subnormal=first_sub,
    )


def byte_block(b: npt.NDArray[np.uint8], codec: Codec, to_global: ToGlobal) -> ValueStats:
    """Stats of a block of a one-byte dtype, exactly, from its 256-bin histogram."""
    t = BYTE_TABLES[codec.name]
    counts = np.bincount(b, minlength=256)
    fin = ~(t.nan | t.posinf | t.neginf) & (counts > 0)
    finite = int(counts[fin].sum())
    mean = m2 = 0.0
    mn: Number | None = None
    mx: Number | None = None
    if finite:
        v, c = t.values[fin], counts[fin].astype(np.float64)
        mean = float(np.dot(c, v)) / finite
        m2 = float(np.dot(c, (v - mean) ** 2))
        mn, mx = float(v.min()), float(v.max())
        if t.integral:
            mn, mx = int(mn), int(mx)

    def count(mask: npt.NDArray[np.bool_]) -> int:
        return int(counts[mask].sum())

    def first(mask: npt.NDArray[np.bool_], k: int) -> int | None:
        if not k:
            return None
        # look it up in growing prefixes: a block full of NaNs finds one in its first bytes, not after a gather
        # of the whole block
        w = 1024
        while True:
            hit = mask[b[:w]]
            if hit.any() or w >= len(b):
                return _first(hit, to_global)
            w *= 16

    nan, sub = count(t.nan), count(t.subnormal)
    n_inf = count(t.posinf) + count(t.neginf)
    return ValueStats(
        count=len(b), nan=nan, posinf=count(t.posinf), neginf=count(t.neginf), zeros=count(t.zero),
        subnormal=sub, finite=finite, min=mn, max=mx, mean=mean, m2=m2,
        first_nan=first(t.nan, nan), first_inf=first(t.posinf | t.neginf, n_inf), first_subnormal=first(t.subnormal, sub),
    )


def int_block(bits: npt.NDArray[Any], codec: Codec) -> ValueStats:
    """Stats of a block of a 16/32/64-bit integer dtype (min / max exact, mean / m2 in float64)."""
    x = bits.view(codec.typed)
    n = len(x)
    if codec.width < 64:
        mean = int(np.add.reduce(x, dtype=np.int64)) / n  # exact: a block holds < 2^31 elements of < 2^32
    else:
        mean = float(np.add.reduce(x, dtype=np.float64)) / n
    d = x.astype(np.float64)
    d -= mean
    return ValueStats(
        count=n, zeros=n - int(np.count_nonzero(x)), finite=n, min=int(x.min()), max=int(x.max()),
        mean=mean, m2=_sumsq(d),
    )
