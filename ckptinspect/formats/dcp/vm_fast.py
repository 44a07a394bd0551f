"""Fast paths of the streaming `.metadata` reader: the three records a DCP writer repeats per chunk, read in runs.

`pickle.dump` writes every ChunkStorageMetadata, every `storage_data` entry (MetadataIndex → _StorageInfo) and every
plan WriteItem with the same opcodes; only memo indices, integers and names change. Each is one compiled regular
expression over the raw bytes (`vm_patterns.py`): a match is exactly what the opcode loop would parse at that
position (every alternative starts with a distinct opcode byte, every argument has its exact length), and it contains
no opcode that names a global (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*): globals are only ever resolved — and judged —
by the opcode loop.

A run of records is read in one `findall` (at most `SPAN` bytes at a time) and decoded column by column
(`vm_batch.py`: numpy over the captured bytes), not record by record. The regular expression used is the record's
pattern specialised to the memo GETs already verified for it (class, field names, builders: literal bytes, which sre
matches several times faster than captured alternations); a record naming another slot ends the run, the next call
verifies it (`Ctx.learn`) and extends the specialisation. The memo values a record refers to are checked like the
loop checks them, per column; the run is cut before the first record that does not check out, which the loop then
reads. The effect on stack and memo is the loop's: memo slots advance by each record's MEMOIZE count (strings kept
where the loop keeps them), and a run leaves one marker on the stack (`Rows`, `StoragePairs`) whose consumption is
accounted: a marker that is not consumed by the list append / dict update the writer follows it with makes the walk
fall back (`Walker.markers_ok`). Nothing is written to the walk's state before a run is fully checked.

Fast paths run only past the first `LOW_MEMO` memo slots (there the loop keeps every value, which a skipped slot
would not reproduce), so small files are read entirely by the loop (tests start them earlier to compare the two).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ckptinspect.formats.dcp.vm_eval import (
    LOW_MEMO,
    Fallback,
    Global,
    Rows,
    StoragePairs,
)
from ckptinspect.formats.dcp.names import CHUNK as CHUNK_CLS, INDEX, WRITE_ITEM
from ckptinspect.formats.dcp.vm_bounds import (
    plan_segments,
    read_bounds,
    single_lists,
    storage_segments,
    tensor_segments,
)
from ckptinspect.formats.dcp.vm_ctx import Ctx
from ckptinspect.formats.dcp.vm_patterns import (
    CHUNK_WANT,
    PLAN_WANT,
    STORAGE_WANT,
    CHUNK,
    CHUNK_REC,
    CHUNK_RUN,
    PLAN,
    PLAN_BOUND,
    PLAN_BOUND_REC,
    PLAN_BOUND_WANT,
    PLAN_REC,
    PLAN_RUN,
    STORAGE,
    STORAGE_REC,
    STORAGE_RUN,
    TENSOR_BOUND,
    TENSOR_BOUND_REC,
    TENSOR_BOUND_WANT,
    Pattern,
)

if TYPE_CHECKING:
    from ckptinspect.formats.dcp.vm_walk import Walker


def install_fast_paths(w: Walker, start: int = LOW_MEMO) -> None:
    """Fast paths from memo slot `start` on (below `LOW_MEMO` only for tests: a skipped slot there holds no value,
    so a later GET of it sends the file to the reference)."""
    ctx = Ctx(w)
    w.batch_from = start

    def fast(buf: bytes, pos: int, w: Walker = w) -> int:
        """At a GET: when it names the class of a repeated record and EMPTY_TUPLE NEWOBJ follow, read the run."""
        if w.memo.n < start:
            return -1
        k = 2 if buf[pos] == 0x68 else 5
        if pos + k >= len(buf) or buf[pos + k] != 0x29:
            return -1
        ctx.dirty = False
        try:
            cls = ctx.value(buf[pos:pos + k])
            if cls.__class__ is not Global:
                return -1
            q = cls.qual
            if w.plans:
                return _plans(ctx, buf, pos) if q == WRITE_ITEM else -1
            if q == CHUNK_CLS:
                return _chunks(ctx, buf, pos)
            if q == INDEX:
                return _storage(ctx, buf, pos)
            return -1
        except Fallback:
            if ctx.dirty:  # raised while replaying the loop's steps (`vm_bounds.py`): the loop's own verdict
                raise
            return -1

    w.fast[0x68] = fast
    w.fast[0x6A] = fast




# Bytes one `findall` looks at: a run of records is read in spans of at most this (~10k records), which bounds the
# captured columns held at once.
SPAN = 1 << 20


def _rows(rec: re.Pattern[bytes], buf: bytes, pos: int) -> list[Any]:
    rows = rec.findall(buf, pos, min(len(buf), pos + SPAN))
    if rows and not rows[-1][0]:
        rows.pop()
    return rows


def _run(ctx: Ctx, pat: Pattern, rec: re.Pattern[bytes], run: re.Pattern[bytes], want: dict[str, Any],
         buf: bytes, pos: int) -> tuple[list[Any], dict[int, int]] | None:
    """The columns of the contiguous records from `pos` (column 0: each whole record) and the column of each
    captured group, or None when none: through the pattern specialised to the GETs seen so far, learning the
    record's GETs when that does not match, through the generic pattern when it still does not."""
    ctx.sync()
    spec = ctx.special.get(id(pat))
    rows = _rows(spec[0], buf, pos) if spec is not None else []
    if not rows:
        if not ctx.learn(pat, rec, want, buf, pos):
            return None
        spec = ctx.special.get(id(pat))
        rows = _rows(spec[0], buf, pos) if spec is not None else []
        if not rows:
            spec = (run, {g: g + 1 for g in range(pat.n)})
            rows = _rows(run, buf, pos)
            if not rows:
                return None
    assert spec is not None
    return list(zip(*rows)), spec[1]


def _end(cols: list[Any], pos: int, k: int, w: Walker, kind: str) -> int:
    """Past the `k` records of `kind` a batch path read (counted for `vm_stats.ReadStats`)."""
    w.batch[kind] += k
    w.runs[kind] += 1
    return pos + sum(map(len, cols[0][:k]))


def _chunks(ctx: Ctx, buf: bytes, pos: int) -> int:
    """A run of ChunkStorageMetadata(offsets=Size, sizes=Size): 8 memo slots each, one `Rows` marker."""
    import numpy as np

    from ckptinspect.formats.dcp import vm_batch as B

    got = _run(ctx, CHUNK, CHUNK_REC, CHUNK_RUN, CHUNK_WANT, buf, pos)
    if got is None:
        return -1
    cols, at = got
    w = ctx.w
    ix = CHUNK.index
    n, n0 = len(cols[0]), w.memo.n
    # a tensor boundary after the chunk (few rows): the next entry's key, its TensorStorageMetadata, dict,
    # TensorProperties, their state tuple, torch.Size (3 slots) and the chunk list: 9 memo slots
    bounds = read_bounds(ctx, TENSOR_BOUND, TENSOR_BOUND_REC, TENSOR_BOUND_WANT, cols[at[ix["bound"]]], n0)
    extra = np.zeros(n, dtype=np.int64)
    for r, b in bounds.items():
        if b is not None and b.tensor:
            extra[r] = 9
    base = B.exclusive_cumsum(8 + extra, n0)
    ok = ctx.gets_ok(cols, at, CHUNK, CHUNK_WANT, base, n0)
    both, nd = B.tuples(cols[at[ix["offsets"]]] + cols[at[ix["sizes"]]])  # one decode for the two columns
    o_nd, s_nd = nd[:n], nd[n:]
    split = int(o_nd.sum())
    offs, sizes = both[:split], both[split:]
    ok &= (o_nd == s_nd) & (o_nd <= 127)
    for r, b in bounds.items():
        if b is None:
            ok[r] = False
    single_lists(bounds, ok)
    k = B.first_false(ok)
    if not k:
        return -1
    cut = int(o_nd[:k].sum())
    sink = w.sink
    start = len(sink.c_nd)
    sink.c_nd.frombytes(o_nd[:k].astype(np.int8).tobytes())
    sink.c_off.frombytes(offs[:cut].tobytes())
    sink.c_size.frombytes(sizes[:cut].tobytes())
    ends = [(r, b) for r, b in sorted(bounds.items()) if r < k and b is not None]  # a None row is >= k (cut)
    if ends:
        tensor_segments(ctx, start, k, ends)
        return _end(cols, pos, k, w, "chunk")
    w.memo.skip(8 * k)
    w.stack.append(Rows(start, k))
    w.rows_pushed += k
    return _end(cols, pos, k, w, "chunk")


def _names(ctx: Ctx, get: list[bytes], strs: list[str], base: Any, n0: int,
           pushed: dict[int, str]) -> tuple[list[str], Any]:
    """Each record's name: spelled (`strs`), or a GET of a string filled before the run or pushed by an earlier
    record of it (`pushed`: slot -> string); and the mask of records where that holds."""
    import numpy as np

    from ckptinspect.formats.dcp import vm_batch as B

    ok = np.ones(len(get), dtype=bool)
    distinct = {raw: B.slot(raw) for raw in set(get)}
    value: dict[bytes, str] = {}
    bad = set()
    for raw, idx in distinct.items():
        if idx < 0:
            continue
        v = ctx.value(raw) if idx < n0 else pushed.get(idx)
        if type(v) is str:
            value[raw] = v
        else:
            bad.add(raw)
    if bad:
        ok &= ~B.rows_with(get, bad)
    if any(idx >= n0 for idx in distinct.values()):  # a GET of a name spelled in the run: by an earlier record?
        slots = np.fromiter(map(distinct.__getitem__, get), dtype=np.int64, count=len(get))
        late = slots >= n0
        ok &= ~late | (slots < base)
    # a record spells its name or GETs it (the other column holds b"" / ""): `value` has no b"" key
    if not value:  # every record spells its name (or its GET is refused: cut at it)
        return list(strs), ok
    return list(map(value.get, get, strs)), ok


_NAME_GETS = frozenset({"fqn", "path"})


def _decoded(col: tuple[bytes, ...], strings: dict[str, str]) -> list[str]:
    """Each spelled name decoded and interned: once per distinct name of the run (a run repeats a few hundred)."""
    distinct: dict[bytes, Any] = dict.fromkeys(col)
    intern = strings.setdefault
    for raw in distinct:
        text = raw.decode("utf-8", "surrogatepass")  # as the loop decodes SHORT_BINUNICODE
        distinct[raw] = intern(text, text)
    return list(map(distinct.__getitem__, col))


def _storage(ctx: Ctx, buf: bytes, pos: int) -> int:
    """A run of `storage_data` entries MetadataIndex -> _StorageInfo: straight into the storage columns."""
    import numpy as np

    from ckptinspect.formats.dcp import vm_batch as B

    got = _run(ctx, STORAGE, STORAGE_REC, STORAGE_RUN, STORAGE_WANT, buf, pos)
    if got is None:
        return -1
    cols, at = got
    w = ctx.w
    sink, memo = w.sink, w.memo
    ix = STORAGE.index

    def col(name: str) -> Any:
        return cols[at[ix[name]]]

    n, n0 = len(cols[0]), memo.n
    fqn_inline, ok = B.inline_names(col("fqn_s_len"), fqn_s := col("fqn_s"))
    path_inline, ok2 = B.inline_names(col("path_s_len"), col("path_s"))
    ok &= ok2
    offs, nd = B.tuples(B.joined(col("offset_a"), col("offset_b")))
    has_off = nd >= 0
    count = 4 + fqn_inline + 3 * has_off + path_inline
    base = B.exclusive_cumsum(count, n0)
    # the names' GETs: their slots are checked with their values (`_names`)
    ok &= ctx.gets_ok(cols, at, STORAGE, STORAGE_WANT, base, n0, _NAME_GETS) & (nd <= 127)
    fqn_strs = _decoded(fqn_s, sink.strings)
    path_strs = _decoded(col("path_s"), sink.strings)
    fqn_slot = base + 2
    path_slot = base + 4 + fqn_inline + 3 * has_off
    # the names the run spells, at their memo slots, in slot order (a record's name comes before its path)
    f_rows, p_rows = np.flatnonzero(fqn_inline), np.flatnonzero(path_inline)
    push_slot = np.concatenate((fqn_slot[f_rows], path_slot[p_rows]))
    push_val = list(map(fqn_strs.__getitem__, f_rows.tolist())) + list(map(path_strs.__getitem__, p_rows.tolist()))
    order = np.argsort(push_slot, kind="stable")
    push_slot = push_slot[order]
    push_val = list(map(push_val.__getitem__, order.tolist()))
    pushed = dict(zip(push_slot.tolist(), push_val))
    fqns, ok3 = _names(ctx, col("fqn"), fqn_strs, base, n0, pushed)
    paths, ok4 = _names(ctx, col("path"), path_strs, base, n0, pushed)
    ok &= ok3 & ok4
    k = B.first_false(ok)
    if not k:
        return -1
    pos_len = B.ints(col("pos")[:k] + col("len")[:k])  # one decode for the two columns
    pos_v, len_v = pos_len[:k], pos_len[k:]
    cut = int(np.maximum(nd[:k], 0).sum())
    # memo: the names spelled in the run, at their slots (strings are what the loop keeps beyond LOW_MEMO)
    n_push = int(np.searchsorted(push_slot, n0 + int(count[:k].sum())))
    end = n0 + int(count[:k].sum())
    if n0 >= LOW_MEMO:  # kept slots beyond LOW_MEMO are sorted (index, value) arrays: append in one go
        memo.hi_idx.frombytes(push_slot[:n_push].tobytes())
        memo.hi_val.extend(push_val[:n_push])
        memo.n = end
    else:
        for sl, v in zip(push_slot[:n_push].tolist(), push_val[:n_push]):
            memo.skip(sl - memo.n)
            memo.push(v)
        memo.skip(end - memo.n)
    sink.s_fqn.extend(fqns[:k])
    sink.s_nd.frombytes(nd[:k].astype(np.int8).tobytes())
    sink.s_off.frombytes(offs[:cut].tobytes())
    ids = {p: sink.file_id(p) for p in dict.fromkeys(paths[:k])}  # ids in order of first use, as one by one
    sink.s_file.frombytes(np.fromiter(map(ids.__getitem__, paths[:k]), dtype=np.int32, count=k).tobytes())
    sink.s_pos.frombytes(pos_v.tobytes())
    sink.s_len.frombytes(len_v.tobytes())
    ends = np.flatnonzero(B.flags(col("batch")[:k])).tolist()
    if ends:
        storage_segments(ctx, k, ends)
        return _end(cols, pos, k, w, "storage")
    w.stack.append(StoragePairs(k))
    w.pairs_pushed += k
    return _end(cols, pos, k, w, "storage")


def _plans(ctx: Ctx, buf: bytes, pos: int) -> int:
    """A run of the plans' WriteItems: only their number and their memo slots matter (no string is kept)."""
    import numpy as np

    from ckptinspect.formats.dcp import vm_batch as B

    got = _run(ctx, PLAN, PLAN_REC, PLAN_RUN, PLAN_WANT, buf, pos)
    if got is None:
        return -1
    cols, at = got
    w = ctx.w
    ix = PLAN.index

    def flagged(name: str) -> Any:
        return B.flags(cols[at[ix[name]]])

    n0 = w.memo.n
    fqn_inline, ok = B.inline_names(cols[at[ix["fqn_s_len"]]], cols[at[ix["fqn_s"]]])
    # MEMOIZEs: WI object, dict, MI object, dict, [fqn], [offset Size: 3], [type REDUCE: 2],
    # [TWD object, dict, [own chunk object, dict, [offsets: 3], [sizes: 3]], [props object, state], [size: 3]]
    twd = flagged("twd_new")
    chunk = 2 * flagged("chunk_new") + 3 * flagged("c_offsets") + 3 * flagged("c_sizes")  # (bool + bool is or)
    rec = (4 + fqn_inline + 3 * (flagged("offset_a") | flagged("offset_b")) + 2 * flagged("type_reduce")
           + twd * (2 + 2 * flagged("props_new") + 3 * flagged("size")) + chunk)
    # a SavePlan boundary after the record (few rows): [planner_data {}], the next SavePlan, its dict, its items list
    bounds = read_bounds(ctx, PLAN_BOUND, PLAN_BOUND_REC, PLAN_BOUND_WANT, cols[at[ix["bound"]]], n0)
    extra = np.zeros(len(rec), dtype=np.int64)
    for r, b in bounds.items():
        if b is not None and b.plan:
            extra[r] = 3 + b.pd_new
    base = B.exclusive_cumsum(rec + extra, n0)
    ok &= ctx.gets_ok(cols, at, PLAN, PLAN_WANT, base, n0)
    for r, b in bounds.items():
        if b is None:
            ok[r] = False
    k = B.first_false(ok)
    if not k:
        return -1
    ends = [(r, b) for r, b in sorted(bounds.items()) if r < k and b is not None]  # a None row is >= k (cut)
    if ends:
        plan_segments(ctx, k, rec, ends)
        return _end(cols, pos, k, w, "plan")
    w.memo.skip(int(rec[:k].sum()))  # plans: strings not kept either (a STACK_GLOBAL naming one falls back)
    w.stack.append(Rows(-1, k))  # plan items: only their number matters
    w.rows_pushed += k
    return _end(cols, pos, k, w, "plan")
