"""The values half of a conversion diff (`convert.py`): read row blocks of a tensor through `services/chunk_bytes`
(memory-mapped chunks, at most `SLAB_ELEMENTS` elements per read) and compare a source block with its target block.

How two elements are equal depends on the dtypes (`Mode`): the same dtype -> bit for bit; a narrowing float
conversion (fp32 -> bf16 / fp16, fp64 -> fp32) -> the target must be the round-to-nearest-even of the source, bit for
bit ("exact rounding"); a widening one -> the exact widening; otherwise, or with `--atol` / `--rtol`, numpy's
``|s - t| <= atol + rtol * |t|``. NaN equals NaN in every mode. numpy only, torch is never imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptinspect.errors import ReadError
from ckptinspect.model import StrEnum, Tensor
from ckptinspect.services.chunk_bytes import NUMPY_CODES, ChunkSource, open_chunk

SLAB_ELEMENTS = 1 << 22
_FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


class Mode(StrEnum):
    EXACT = "exact"
    ROUNDING = "rounding"  # the target is the nearest-even rounding of the source
    WIDENING = "widening"
    TOLERANCE = "tolerance"


def mode_of(src: str, tgt: str, tolerant: bool) -> Mode:
    if tolerant:
        return Mode.TOLERANCE
    if src == tgt:
        return Mode.EXACT
    bs, bt = _FLOAT_BITS.get(src), _FLOAT_BITS.get(tgt)
    if bs is None or bt is None or bs == bt:
        return Mode.TOLERANCE
    if bs > bt:
        return Mode.ROUNDING if tgt in ("bfloat16", "float16", "float32") else Mode.TOLERANCE
    return Mode.WIDENING


@dataclass(slots=True)
class Tally:
    """Running totals for one target tensor."""

    compared: int = 0
    mismatched: int = 0
    first: int | None = None  # the first mismatching target row
    source_value: Any = None
    target_value: Any = None


@dataclass(frozen=True, slots=True)
class Part:
    """A parameter as the mapping sees it: a whole tensor, or layer `layer` of a torch_dist tensor whose layers are
    stacked along a leading axis (``decoder.layers.self_attention.linear_qkv.weight`` of shape (L, ...))."""

    tensor: Tensor
    layer: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape) if self.layer is None else tuple(self.tensor.shape[1:])

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    @property
    def key(self) -> str:
        return self.tensor.key if self.layer is None else f"{self.tensor.key}[{self.layer}]"


def read_rows(p: Part, src: ChunkSource, lo: int, hi: int) -> npt.NDArray[Any]:
    """Rows [lo, hi) of `p` (axis 0 of the part; a 0-d tensor is one row), in its stored numpy dtype (bfloat16 as
    uint16), assembled from the chunks that overlap them. Raises `ReadError` when part of the rows has no chunk."""
    t, lead = p.tensor, (0 if p.layer is None else 1)
    code = NUMPY_CODES.get(t.dtype)
    if code is None:
        raise ReadError(f"{t.key}: dtype {t.dtype} not compared")
    if not t.shape:
        return np.asarray(open_chunk(src, next(iter(t.chunks)), t.dtype)).reshape(1)
    out = np.empty((hi - lo, *p.shape[1:]), dtype=np.dtype("<" + code[0]))
    covered = 0
    for c in t.chunks:
        if p.layer is not None and not c.offsets[0] <= p.layer < c.offsets[0] + c.sizes[0]:
            continue
        off, size = c.offsets[lead:], c.sizes[lead:]
        c_lo, c_hi = off[0], off[0] + size[0]
        a, b = max(lo, c_lo), min(hi, c_hi)
        if a >= b:
            continue
        arr = open_chunk(src, c, t.dtype)
        if p.layer is not None:
            arr = arr[p.layer - c.offsets[0]]
        rest = tuple(slice(o, o + s) for o, s in zip(off[1:], size[1:]))
        out[(slice(a - lo, b - lo), *rest)] = arr[a - c_lo:b - c_lo]
        covered += (b - a) * math.prod(size[1:])
        del arr
    if covered != out.size:
        raise ReadError(f"{t.key}: rows [{lo}, {hi}) not covered by its chunks ({covered} of {out.size} elements)")
    return out


def _as_float(x: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x


def _bits(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "f" else x


def expected(x: npt.NDArray[Any], src: str, tgt: str, mode: Mode) -> npt.NDArray[Any]:
    """The target encoding `x` (source dtype `src`) must have under `mode` (EXACT / ROUNDING / WIDENING)."""
    if mode is Mode.EXACT:
        return x
    f = _as_float(x, src)
    if tgt == "bfloat16":
        u = f.astype(np.float32).view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(np.isnan(f), np.uint16(0x7FC0), r)
    with np.errstate(over="ignore", invalid="ignore"):
        return f.astype(np.dtype(NUMPY_CODES[tgt][0]))


def compare(s: npt.NDArray[Any], src: str, t: npt.NDArray[Any], tgt: str, mode: Mode, atol: float, rtol: float,
            row0: int, tally: Tally, reverse: bool = False) -> None:
    """Compare source rows `s` with target rows `t` (same shape; `row0`: the first target row). `reverse`: the
    target is the original and the source what the converter made of it (an HF -> Megatron import): `mode` is
    from the target's dtype to the source's, and the source must be the expected encoding of the target."""
    if s.shape != t.shape:
        raise ReadError(f"blocks of {s.shape} and {t.shape}")
    orig, made, o_dt, m_dt = (t, s, tgt, src) if reverse else (s, t, src, tgt)
    with np.errstate(invalid="ignore", over="ignore"):
        if mode is Mode.TOLERANCE:
            fs, ft = _as_float(s, src).astype(np.float64), _as_float(t, tgt).astype(np.float64)
            same = (np.abs(fs - ft) <= atol + rtol * np.abs(ft)) | (np.isnan(fs) & np.isnan(ft)) | (fs == ft)
        else:
            e = expected(orig, o_dt, m_dt, mode)
            same = _bits(e) == _bits(made)
            if e.dtype.kind == "f" or m_dt == "bfloat16":
                same |= np.isnan(_as_float(e, m_dt)) & np.isnan(_as_float(made, m_dt))
    tally.compared += int(same.size)
    bad = ~same
    n = int(np.count_nonzero(bad))
    if not n:
        return
    tally.mismatched += n
    if tally.first is None:
        at = np.unravel_index(int(np.argmax(bad)), bad.shape)
        tally.first = row0 + int(at[0])
        tally.source_value = _scalar(_as_float(s[at], src))
        tally.target_value = _scalar(_as_float(t[at], tgt))


def _scalar(v: Any) -> Any:
    out = v.item() if hasattr(v, "item") else v
    return str(out) if isinstance(out, float) and not math.isfinite(out) else out


def compare_blocks(st: Part, s_src: ChunkSource, tt: Part, t_src: ChunkSource,
                   blocks: list[tuple[int, int, int]], mode: Mode, atol: float, rtol: float,
                   reverse: bool = False) -> Tally:
    """Compare target `tt` with the source row blocks it is made of, a slab of rows at a time."""
    tally = Tally()
    row = max(1, math.prod(st.shape[1:]))
    step = max(1, SLAB_ELEMENTS // row)
    for start, stop, t_start in blocks:
        for a in range(start, stop, step):
            b = min(stop, a + step)
            s = read_rows(st, s_src, a, b)
            t = read_rows(tt, t_src, t_start + a - start, t_start + b - start)
            compare(s, st.dtype, t, tt.dtype, mode, atol, rtol, t_start + a - start, tally, reverse)
    return tally
