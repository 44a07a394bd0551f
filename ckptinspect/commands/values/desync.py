"""CK911: a bf16 / fp16 model weight that is not the rounding of its fp32 main param, where the checkpoint holds both.

Megatron's DistributedOptimizer keeps fp32 main params and copies them, rounded, into the bf16 / fp16 model params
after every step (`_copy_main_params_to_model_params`); a save that holds both must hold a model weight equal to the
rounding of the main param, bit for bit (Megatron-LM PR #6920: params not re-synced after a load). The tolerance is
exact rounding, not an epsilon: float32 -> bfloat16 rounds to nearest, ties to even (torch's `.to(torch.bfloat16)`),
float32 -> float16 by numpy's cast (also nearest-even). NaN is compared as NaN.

Pairs are found by name, in the layouts that store per-parameter main params: Megatron's `fully_reshardable` /
`fully_sharded_model_space` (`optimizer.state.param.<model key>`). Bucket layouts (`dp_reshardable`) flatten the
main params in bucket order, which the metadata does not map to parameters: not judged. Each model chunk is compared
with the main-param chunks it overlaps, one pair of chunks in memory at a time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.model import Checkpoint, Tensor
from ckptinspect.services.chunk_bytes import ChunkSource, open_chunk

_NARROW = ("bfloat16", "float16")
PREFIX = "optimizer.state.param."


def pairs(ckpt: Checkpoint) -> list[tuple[Tensor, Tensor]]:
    """(model weight, fp32 main param) pairs of the same shape."""
    by_key = {t.key: t for t in ckpt.tensors}
    out = []
    for t in ckpt.tensors:
        main = by_key.get(PREFIX + t.key)
        if t.dtype in _NARROW and main is not None and main.dtype == "float32" and main.shape == t.shape:
            out.append((t, main))
    return out


def rounded_bits(main: npt.NDArray[np.uint32], dtype: str) -> npt.NDArray[np.uint16]:
    """The bit patterns of float32 values (given as uint32 bits) rounded to `dtype`, nearest-even."""
    if dtype == "float16":
        return main.view(np.float32).astype(np.float16).view(np.uint16)
    b = main.astype(np.uint64)
    r = ((b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    nan = (main & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r[nan] = ((main[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # keep NaN a NaN (quiet bit)
    return r


def _is_nan(bits: npt.NDArray[np.uint16], dtype: str) -> npt.NDArray[np.bool_]:
    exp, man = (0x7F80, 0x007F) if dtype == "bfloat16" else (0x7C00, 0x03FF)
    out: npt.NDArray[np.bool_] = ((bits & exp) == exp) & ((bits & man) != 0)
    return out


def desync_findings(ckpt: Checkpoint, src: ChunkSource, path: str, shard: tuple[int, int] | None = None
                    ) -> list[Finding]:
    """CK911 for every pair whose model weight differs from the rounded main param (pairs `i % N == K` of a
    `--shard K/N` slice). A pair whose chunks cannot be read here is left out (its CK908 says so)."""
    out = []
    for i, (model, main) in enumerate(pairs(ckpt)):
        if shard is not None and i % shard[1] != shard[0]:
            continue
        try:
            bad, compared, first = _compare(src, model, main)
        except (ReadError, OSError, ValueError):
            continue
        if bad:
            out.append(Finding(
                "CK911", f"model weight {model.key} ({model.dtype}): {bad} of {compared} elements are not the "
                f"{model.dtype} rounding of the fp32 main param {main.key}; the first at {list(first or ())}",
                model.key, path, {"tensor": model.key, "main_param": main.key, "dtype": model.dtype,
                                  "mismatched": bad, "compared": compared,
                                  "first_index": list(first) if first is not None else None}))
    return out


def _compare(src: ChunkSource, model: Tensor, main: Tensor) -> tuple[int, int, tuple[int, ...] | None]:
    bad = compared = 0
    first: tuple[int, ...] | None = None
    for ca in model.chunks:
        lo_a = tuple(ca.offsets)
        hi_a = tuple(o + s for o, s in zip(ca.offsets, ca.sizes))
        a: npt.NDArray[np.uint16] | None = None
        for cb in main.chunks:
            lo = tuple(max(x, y) for x, y in zip(lo_a, cb.offsets))
            hi = tuple(min(x, y + s) for x, y, s in zip(hi_a, cb.offsets, cb.sizes))
            if any(h <= low for low, h in zip(lo, hi)):
                continue
            if a is None:
                a = np.asarray(open_chunk(src, ca, model.dtype))
            b = np.asarray(open_chunk(src, cb, "float32")).view(np.uint32)
            sa = a[tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, lo_a))]
            sb = b[tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, cb.offsets))]
            want = rounded_bits(np.ascontiguousarray(sb), model.dtype)
            have = np.ascontiguousarray(sa)
            diff = (have != want) & ~(_is_nan(have, model.dtype) & _is_nan(want, model.dtype))
            n = int(np.count_nonzero(diff))
            compared += int(diff.size)
            if n:
                bad += n
                if first is None:
                    local = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
                    first = tuple(int(low) + int(i) for low, i in zip(lo, local))
    return bad, compared, first

