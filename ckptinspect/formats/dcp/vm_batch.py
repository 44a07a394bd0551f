"""Vectorised decoding of the columns a run of records yields (`vm_fast.py`): ints, tuples, names, memo slots.

A run is read with one `findall` over the raw bytes; its capture groups, transposed, are columns of `bytes` (one per
record, `b""` where an optional part is absent). These helpers turn such columns into numpy arrays without a Python
step per record: the captured opcodes are concatenated and decoded in numpy (BININT1 / BININT2 / BININT / LONG1,
exactly as `int.from_bytes` reads them), and the few distinct memo GETs of a column are decoded once each.
Everything here is pure: a column that is not what the pattern promises raises `Fallback` (the caller then leaves
the run to the opcode loop), nothing is written to the walk's state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptinspect.formats.dcp.vm_eval import Fallback

I64 = np.int64
# One int opcode with its argument, as `_INT` of `vm_patterns.py` accepts it.
_TOKEN = re.compile(rb"K.|M..|J....|\x8a\x01.|\x8a\x02..|\x8a\x03...|\x8a\x04....|\x8a\x05.....|\x8a\x06......"
                    rb"|\x8a\x07.......|\x8a\x08........", re.DOTALL)
_ARITY = {0x85: 1, 0x86: 2, 0x87: 3}  # TUPLE1/2/3; MARK ... TUPLE ('t') is counted


def lengths(col: Sequence[bytes]) -> Any:
    """Each captured value's length, as int64. Through `bytes` of a list (a C loop) when they fit a byte, as
    nearly all captures do: a quarter faster than `np.fromiter`, and this runs over every column of every run."""
    sizes = list(map(len, col))
    try:
        return np.frombuffer(bytes(sizes), dtype=np.uint8).astype(I64)
    except ValueError:  # one of 256 bytes or more (a long MARK tuple)
        return np.array(sizes, dtype=I64)


def present(col: Sequence[bytes]) -> Any:
    """Mask of the records where an optional group was captured (not `b""`)."""
    return np.frombuffer(bytes(list(map(bool, col))), dtype=np.bool_)


def flags(col: Sequence[bytes]) -> Any:
    """`present` of a `flag` group's column (`vm_patterns._Pattern.flag`: one byte, never 0, or nothing), in
    one C join: each record's value followed by a 0 byte, so a record is present where its 0 is not at its start."""
    n = len(col)
    a = np.frombuffer(b"\x00".join(col) + b"\x00", dtype=np.uint8)
    sep = np.flatnonzero(a == 0)
    if len(sep) != n:  # a value holds a 0 byte: the 0s are not one per record, the general way
        return present(col)
    out = np.ones(n, dtype=np.bool_)
    out[0] = sep[0] != 0
    out[1:] = sep[1:] != sep[:-1] + 1
    return out


def _table(pairs: dict[int, int], default: int = 0) -> Any:
    t = np.full(256, default, dtype=I64)
    for k, v in pairs.items():
        t[k] = v
    return t


_WIDTH = _table({0x4B: 1, 0x4D: 2, 0x4A: 4})  # argument bytes of BININT1/2/BININT; LONG1 says its own
_ARITY_OF = _table(_ARITY)
_BYTE = np.arange(8, dtype=I64)


SMALL = 256  # below this many ints a Python loop beats numpy's fixed cost per call


def _decode_small(tokens: Sequence[bytes]) -> Any:
    out = []
    for t in tokens:
        op = t[0]
        if op == 0x4B:
            out.append(t[1])
        elif op == 0x4D:
            out.append(t[1] | t[2] << 8)
        elif op == 0x4A and len(t) == 5:
            out.append(int.from_bytes(t[1:], "little", signed=True))
        elif op == 0x8A and len(t) == t[1] + 2 and t[1]:
            out.append(int.from_bytes(t[2:], "little", signed=True))
        else:
            raise Fallback("int opcode")
    return np.array(out, dtype=I64)


def decode_ints(tokens: Sequence[bytes]) -> Any:
    """The value of each int opcode (`K.`, `M..`, `J....`, `\\x8a` k bytes): unsigned for BININT1/2, two's
    complement for BININT and LONG1, as the unpickler reads them. Every token must be one whole opcode."""
    n = len(tokens)
    if n < SMALL:
        return _decode_small(tokens)
    lens = lengths(tokens)
    a = np.frombuffer(b"".join(tokens) + bytes(10), dtype=np.uint8)
    start = np.zeros(n, dtype=I64)
    np.cumsum(lens[:-1], out=start[1:])
    out, width = _ints_at(a, start)
    if (lens != width).any():
        raise Fallback("int opcode")
    return out


def ints(col: Sequence[bytes]) -> Any:
    """A column where every record holds exactly one int opcode."""
    if not all(col):
        raise Fallback("absent int")
    return decode_ints(col)


def _ints_at(a: Any, p: Any) -> tuple[Any, Any]:
    """(value, width) of the int opcode starting at each byte index `p` of `a` (uint8, padded by 10 zero bytes), as
    `decode_ints` reads them. Any other opcode, or a LONG1 of 0 or more than 8 bytes, raises `Fallback`."""
    op = a[p]
    long1 = op == 0x8A
    k = np.where(long1, a[p + 1], _WIDTH[op]).astype(I64)
    if not k.all() or (k > 8).any():
        raise Fallback("int opcode")
    # per opcode, only its own argument bytes are gathered (BININT: 4 of them, not 8 masked)
    out = np.empty(len(p), dtype=I64)
    for code, mask in ((0x4A, op == 0x4A), (0x4B, op == 0x4B), (0x4D, op == 0x4D)):
        if not mask.any():
            continue
        q = p[mask] + 1
        v = a[q].astype(I64)
        if code != 0x4B:
            v |= a[q + 1].astype(I64) << 8
        if code == 0x4A:
            v |= a[q + 2].astype(I64) << 16 | a[q + 3].astype(I64) << 24
            v -= (v >= 1 << 31) << 32  # two's complement over 4 bytes
        out[mask] = v
    if long1.any():
        kl, q = k[long1], p[long1] + 2
        raw = a[q[:, None] + _BYTE]
        raw[_BYTE[None, :] >= kl[:, None]] = 0
        v = raw.view("<i8").ravel().copy()
        neg = (kl < 8) & (raw[np.arange(len(q)), kl - 1] >= 0x80)
        if neg.any():
            v[neg] -= np.left_shift(np.ones(int(neg.sum()), dtype=I64), 8 * kl[neg])
        out[long1] = v
    return out, 1 + long1 + k


def tuples(col: Sequence[bytes]) -> tuple[Any, Any]:
    """(every int of the column's tuples in order, each record's arity: -1 where the tuple is absent). Each present
    record is one tuple of ints as `vm_patterns._TUP` matches it: ints then TUPLE1/2/3, or MARK ints TUPLE."""
    if len(col) < SMALL:
        joined = b"".join(col)
        values = decode_ints(_TOKEN.findall(joined))
        arity = np.array([(_ARITY.get(c[-1]) or len(_TOKEN.findall(c))) if c else -1 for c in col], dtype=I64)
        if int(np.maximum(arity, 0).sum()) != len(values):
            raise Fallback("tuple arity")
        return values, arity
    # numpy over all records at once, one int position at a time (at most the largest arity steps)
    lens = lengths(col)
    a = np.frombuffer(b"".join(col) + bytes(16), dtype=np.uint8)
    rows = np.flatnonzero(lens)
    end = np.cumsum(lens)[rows] - 1  # each tuple's last byte: TUPLE1/2/3 or TUPLE
    cur = end - lens[rows] + 1
    mark = a[cur] == 0x28
    cur += mark
    term = a[end]
    want = _ARITY_OF[term]
    if (mark & (term != 0x74)).any() or (~mark & (want == 0)).any():
        raise Fallback("tuple arity")
    got = np.zeros(len(rows), dtype=I64)
    steps: list[tuple[Any, Any]] = []
    act = np.flatnonzero(cur < end)
    while len(act):
        vals, width = _ints_at(a, cur[act])
        steps.append((act, vals))
        got[act] += 1
        cur[act] += width
        act = act[cur[act] < end[act]]
    if (cur != end).any() or (~mark & (got != want)).any() or (mark & (got == 0)).any():
        raise Fallback("tuple arity")
    first = np.zeros(len(rows), dtype=I64)
    np.cumsum(got[:-1], out=first[1:])
    values = np.empty(int(got.sum()), dtype=I64)
    for j, (act, vals) in enumerate(steps):
        values[first[act] + j] = vals
    arity = np.full(len(col), -1, dtype=I64)
    arity[rows] = got
    return values, arity


def tuple_ints(raw: bytes) -> list[int]:
    """The ints of one tuple as `tuples` reads a column of them, without numpy's fixed cost per call (a tensor
    boundary's torch.Size is one tuple): ints then TUPLE1/2/3 of that arity, or MARK, at least one int, TUPLE. Any
    other byte raises `Fallback`."""
    if not raw:
        raise Fallback("tuple arity")
    try:
        return _tuple_ints(raw)
    except IndexError:  # an opcode's argument past the end
        raise Fallback("int opcode") from None


def _tuple_ints(raw: bytes) -> list[int]:
    marked = raw[0] == 0x28
    i, end, out = int(marked), len(raw) - 1, []
    while i < end:
        op = raw[i]
        if op == 0x4B:
            out.append(raw[i + 1])
            i += 2
        elif op == 0x4D:
            out.append(raw[i + 1] | raw[i + 2] << 8)
            i += 3
        elif op == 0x4A:
            out.append(int.from_bytes(raw[i + 1:i + 5], "little", signed=True))
            i += 5
        elif op == 0x8A and i + 1 < end and 1 <= raw[i + 1] <= 8:
            k = raw[i + 1]
            out.append(int.from_bytes(raw[i + 2:i + 2 + k], "little", signed=True))
            i += 2 + k
        else:
            raise Fallback("int opcode")
    if i != end or (raw[end] != 0x74 or not out if marked else _ARITY.get(raw[end]) != len(out)):
        raise Fallback("tuple arity")
    return out


def slot(raw: bytes) -> int:
    """The memo index of a captured BINGET / LONG_BINGET (-1 for an absent one)."""
    if not raw:
        return -1
    return raw[1] if len(raw) == 2 else int.from_bytes(raw[1:5], "little")


def get_slots(col: Sequence[bytes]) -> Any:
    """Each record's memo index of a captured BINGET (`h.`) / LONG_BINGET (`j....`), -1 where absent."""
    n = len(col)
    lens = lengths(col)
    a = np.frombuffer(b"".join(col) + bytes(5), dtype=np.uint8)
    start = np.zeros(n, dtype=I64)
    np.cumsum(lens[:-1], out=start[1:])
    out = np.full(n, -1, dtype=I64)
    h = lens == 2
    out[h] = a[start[h] + 1]
    long = lens == 5
    if long.any():
        j = start[long] + 1
        out[long] = a[j].astype(I64) | a[j + 1].astype(I64) << 8 | a[j + 2].astype(I64) << 16 \
            | a[j + 3].astype(I64) << 24
    return out


def get_slots_many(cols: Sequence[Sequence[bytes]]) -> Any:
    """`get_slots` of several columns of the same records at once (one numpy pass): shape (len(cols), n)."""
    n = len(cols[0]) if cols else 0
    flat: list[bytes] = []
    for c in cols:
        flat.extend(c)
    return get_slots(flat).reshape(len(cols), n)


def rows_with(col: Sequence[bytes], bad: set[bytes]) -> Any:
    """Mask of the records whose value is one of `bad`."""
    return np.fromiter((c in bad for c in col), dtype=bool, count=len(col))


def inline_names(len_col: Sequence[bytes], s_col: Sequence[bytes]) -> tuple[Any, Any]:
    """(mask of records that spell a SHORT_BINUNICODE name, mask of those whose length byte matches the name)."""
    inline = present(len_col)
    ok = np.ones(len(s_col), dtype=bool)
    if inline.any():
        declared = np.frombuffer(b"".join(len_col), dtype=np.uint8).astype(I64)
        ok[inline] = declared == lengths(s_col)[inline]
    return inline, ok


def joined(a: Sequence[bytes], b: Sequence[bytes]) -> Sequence[bytes]:
    """Two columns of which each record uses at most one (the two field orders of a record): merged. A writer uses
    one order throughout, so one column is usually empty in every record: then the other is the merge."""
    if not any(a):
        return b
    if not any(b):
        return a
    return list(map(bytes.__add__, a, b))


def exclusive_cumsum(counts: Any, start: int) -> Any:
    out = np.empty(len(counts), dtype=I64)
    out[0:1] = start
    np.cumsum(counts[:-1], out=out[1:])
    if len(counts) > 1:
        out[1:] += start
    return out


def first_false(ok: Any) -> int:
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(ok)
