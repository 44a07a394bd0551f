"""The padded vocabulary Megatron recomputes for the target TP ([tok] `_vocab_size_with_padding`).

Owns `predict_vocab` (saved vs predicted padded size, and the `--make-vocab-size-divisible-by` values that keep the saved
size) and `_pad`. The `model.vocab*` rule texts built from its result live in `conditions`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ckptinspect.model import Checkpoint, Format
from ckptinspect.commands.resume.model import Layout, ResumeTarget, VocabCandidate, VocabPrediction
from ckptinspect.formats.args_values import arg_int


def predict_vocab(ckpt: Checkpoint, a: Mapping[str, Any], src: Layout, t: ResumeTarget) -> VocabPrediction | None:
    keys = sorted({x.key for x in ckpt.tensors if not x.key.startswith(("optimizer.", "distrib_optim."))
                   and x.key.endswith(("word_embeddings.weight", "output_layer.weight"))})
    shapes = [x.shape for x in ckpt.tensors if x.key in keys and x.shape]
    saved = arg_int(a, "padded_vocab_size")
    if saved is None and shapes:  # legacy tensors are the local TP shard of the vocabulary
        saved = shapes[0][0] * (src.tp if ckpt.format is Format.TORCH else 1)
    if saved is None:
        return None
    hidden = shapes[0][1] if shapes and len(shapes[0]) == 2 else arg_int(a, "hidden_size")
    m_saved = arg_int(a, "make_vocab_size_divisible_by")
    m = t.make_vocab_size_divisible_by or m_saved or 128  # 128 = Megatron's default
    step_saved = m_saved * src.tp if m_saved else saved  # unknown padding: any vocabulary in (0, saved]
    low_saved = max(saved - step_saved, 0)
    v, how = t.vocab_size, "given (--vocab-size)"
    saved_vocab = arg_int(a, "vocab_size")
    if v is None and saved_vocab and _pad(saved_vocab, step_saved) == saved:
        v, how = saved_vocab, "from the checkpoint args"
    elif v is None:
        how = f"size unknown: the tokenizer's, somewhere in ({low_saved}, {saved}]"
    cands = []
    # Every `make-vocab-size-divisible-by` value whose padding (value × TP) divides the saved size: the divisors of
    # saved / TP, found by trial division up to its square root (closed form in the size of the number, no loop
    # over the value itself); an absurd saved size (a hostile or corrupt args) gets no candidate list.
    if 0 < saved <= MAX_CANDIDATE_SEARCH and t.tp > 0 and saved % t.tp == 0:
        for value in _divisors_desc(saved // t.tp):
            q = value * t.tp
            if v is None or _pad(v, q) == saved:
                cands.append(VocabCandidate(value, saved - q, saved, v is not None or q >= step_saved))
    q = m * t.tp
    if v is not None:
        return VocabPrediction(saved, _pad(v, q), v, how, m, t.tp, hidden, tuple(keys), tuple(cands))
    lo, hi = _pad(low_saved + 1, q), _pad(saved, q)
    predicted: int | None = hi
    note = None if lo == hi else f"between {lo} and {hi} rows depending on the tokenizer's vocabulary"
    if saved % q == 0 and q < step_saved:
        predicted = None
        below = str(lo) if lo == saved - q else f"{lo} to {saved - q}"
        note = f"{saved} rows only for a vocabulary above {saved - q}, else {below}"
    return VocabPrediction(saved, predicted, None, how, m, t.tp, hidden, tuple(keys), tuple(cands), note)


MAX_CANDIDATE_SEARCH = 1 << 40  # sqrt = 2**20 trial divisions at most


def _divisors_desc(n: int) -> list[int]:
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
    return large + small[::-1]


def _pad(v: int, multiple: int) -> int:
    """`v` rounded up to a multiple of `multiple`, in exact integers (a float ceil overflows on huge values)."""
    if multiple <= 0:
        return v
    return -(-int(v) // multiple) * multiple
