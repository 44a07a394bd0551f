"""The shard-invariant value fingerprint of a tensor (docs/contract.md, "Value fingerprint"): its definition, the
numpy kernel that adds a block of elements to it, and the final digest.

Each element ``i`` (global flat C-order index) is split into symbols (its byte, or its little-endian 16-bit
halves); row ``rho = i >> 8`` of 256 elements gets, per lane ``k``, the exact integer
``S_k(rho) = sum (symbol + 1) * B_k[position in the row]`` with 27-bit odd weights ``B_k``; lane ``k`` is
``sum A_k(rho) * S_k(rho) mod 2^64`` with odd 64-bit ``A_k``. Four lanes. Every step is a sum, so chunks, runs and
blocks add up in any order and split in any way; the digest hashes the lanes with the dtype and the global shape.

Why this shape: ``S_k`` of a block of rows is one float64 matrix product (symbols as float64, ``X @ B``), exact
because every partial sum is an integer below 2^53, so BLAS's summation order cannot change it; the 64-bit part
runs once per 256 elements. That is what lets the fingerprint keep pace with SHA-256 in numpy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

U64 = np.uint64
MASK64 = (1 << 64) - 1
LANES = 4
ROW_BITS = 8
ROW = 1 << ROW_BITS  # elements per row
MAX_SYMBOLS = 4  # 16-bit symbols of an 8-byte element
VERSION = "ckptinspect-fp1"

# Nothing-up-my-sleeve seeds: the first 64-bit words of the hex digits of pi after the leading 3.
CB = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)  # B_k (column weights)
CA = (0x452821E638D01377, 0xBE5466CF34E90C6C, 0xC0AC29B7C97C50DD, 0x3F84D5B5B5470917)  # A_k (row weights)

U64Array = npt.NDArray[np.uint64]


def splitmix64(x: int) -> int:
    """Vigna's SplitMix64 of the state ``x``: add the golden gamma, then the finaliser (all mod 2^64)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64_array(x: U64Array) -> U64Array:
    """`splitmix64` of every element (uint64 arithmetic wraps mod 2^64, as the definition needs)."""
    z = x + U64(0x9E3779B97F4A7C15)
    z ^= z >> U64(30)
    z *= U64(0xBF58476D1CE4E5B9)
    z ^= z >> U64(27)
    z *= U64(0x94D049BB133111EB)
    z ^= z >> U64(31)
    return z


def column_weight(lane: int, p: int) -> int:
    """``B_k[p] = (splitmix64(CB_k XOR p) >> 37) | 1``: 27-bit odd, for the symbol at position ``p`` of its row."""
    return (splitmix64(CB[lane] ^ p) >> 37) | 1


def row_weights(rows: npt.NDArray[np.int64]) -> U64Array:
    """``A_k(rho) = splitmix64(CA_k XOR rho) | 1`` for every row (shape ``(len(rows), LANES)``)."""
    r = rows.astype(U64).reshape(-1, 1) ^ np.array(CA, dtype=U64).reshape(1, LANES)
    out: U64Array = splitmix64_array(r) | U64(1)
    return out


# B as float64 matrices, one per symbols-per-element: row p of `_B[s]` holds B_0..B_3 of position p (< 256 s)
_B = {
    s: np.array([[column_weight(k, p) for k in range(LANES)] for p in range(ROW * s)], dtype=np.float64)
    for s in (1, 2, 4)
}

_B_SUM = {s: b.sum(axis=0).astype(U64) for s, b in _B.items()}  # exact: 1024 weights below 2^27


@dataclass(frozen=True, slots=True)
class Lanes:
    """The four lane sums of a set of elements (mod 2^64). Adding is merging: any order, any split."""

    sums: tuple[int, ...] = (0,) * LANES

    def __add__(self, other: Lanes) -> Lanes:
        return Lanes(tuple((a + b) & MASK64 for a, b in zip(self.sums, other.sums)))


def symbols_per_element(itemsize: int) -> int:
    return 1 if itemsize <= 2 else itemsize // 2


def symbols(bits: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The symbols of raw elements: bytes stay bytes, wider elements are read as little-endian 16-bit halves."""
    if bits.dtype.itemsize <= 2:
        return bits
    return bits.view("<u2")


# Rows per matrix product: 32768 symbols (256 KiB of float64, stays in a core's L2), and m*n*k = 65536*2, below
# the bound (65536*4) under which OpenBLAS's gemm runs on the calling thread: BLAS threads under the caller's own
# would make two scanning threads no faster than one (measured).
def _step(s: int) -> int:
    return max(1, (1 << 17) // (ROW * s * LANES))


def _lanes_of_sums(sums: npt.NDArray[np.float64], rows: npt.NDArray[np.int64], plus: npt.NDArray[np.uint64] | None) -> Lanes:
    """Lanes from the row sums ``S`` (float64, exact integers below 2^53; shape ``(len(rows), LANES)``), plus
    `plus` on every row (the weights' row sum: the "+ 1" of whole rows of plain symbols)."""
    su = sums.astype(U64)  # exact
    if plus is not None:
        su += plus
    prods = su * row_weights(rows)
    return Lanes(tuple(int(v) for v in np.add.reduce(prods, axis=0)))


def block_lanes(
    syms: npt.NDArray[Any], s: int, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
    work: npt.NDArray[np.float64],
) -> Lanes:
    """Lanes of a block: `syms` holds the symbols of consecutive local elements, laid out as runs of global indices
    (starts, lengths) in order. `work` is float64 scratch of at least 32768 elements."""
    n = len(syms)
    if n == 0:
        return Lanes()
    b = _B[s]
    if not (np.any(starts & (ROW - 1)) or np.any(lengths & (ROW - 1))):
        # every run is whole rows: the symbols are the rows, in order; widened to float64 a slice at a time
        width = ROW * s
        per = _step(s) * width
        parts = []
        for i in range(0, n, per):
            piece = syms[i : i + per]
            x = work[: len(piece)]
            np.copyto(x, piece)  # the "+ 1" of every symbol is added to the row sums: _B_SUM
            parts.append(x.reshape(-1, width) @ b)
        if len(starts) == 1:
            rows = np.arange(int(starts[0]) >> ROW_BITS, int(starts[0] + lengths[0]) >> ROW_BITS, dtype=np.int64)
        else:
            rows = np.concatenate([np.arange(a >> ROW_BITS, (a + m) >> ROW_BITS) for a, m in zip(starts.tolist(), lengths.tolist())])
        return _lanes_of_sums(np.concatenate(parts) if len(parts) > 1 else parts[0], rows, _B_SUM[s])
    # runs off the row grid: place every element at its row and column (a scatter into zero-filled rows)
    idx = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n // s, dtype=np.int64)
    rows, inv = np.unique(idx >> ROW_BITS, return_inverse=True)
    m = np.zeros((len(rows), ROW * s), dtype=np.float64)
    col = (idx & (ROW - 1)) * s
    for j in range(s):
        m[inv, col + j] = syms[j::s] + 1.0
    step = _step(s)
    sums = [m[i : i + step] @ b for i in range(0, len(m), step)]
    return _lanes_of_sums(np.concatenate(sums) if len(sums) > 1 else sums[0], rows, None)


def digest(dtype: str, shape: tuple[int, ...], lanes: Lanes) -> str:
    """The fingerprint: the first 32 hex digits of SHA-256 of the ASCII text
    ``ckptinspect-fp1|<dtype>|<d0,d1,...>|<lane 0>|<lane 1>|<lane 2>|<lane 3>`` (lanes as 16 lower-case hex)."""
    text = "|".join([VERSION, dtype, ",".join(str(d) for d in shape), *(f"{v:016x}" for v in lanes.sums)])
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]
