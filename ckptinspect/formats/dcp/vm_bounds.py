"""The list and object boundaries a run of records crosses (`vm_fast.py`), replayed with the loop's own steps.

A run of WriteItems used to end with its items list: at every `SavePlan` (one per rank, ~75 items each at 1M chunks)
the loop took over for a few dozen opcodes and the next run paid the batch decoders' fixed cost again. The PLAN
pattern now also matches what follows a WriteItem up to the next one when it is one of two fixed shapes
(`vm_patterns.py`): APPENDS MARK (the next batch of 1,000 items of the same list), or APPENDS, the SavePlan's
other fields, SETITEMS BUILD, and the next SavePlan up to its items list's MARK. Those opcodes are not modelled
here: they are evaluated by the walker's own methods (`Walker.pop_mark`, `append`, `set_items`, `build`,
`new_inst`, `new_list`, `Memo.push`), in the loop's order, on the values its GETs name (verified before: slots filled
before the run, keys strings, the class `SavePlan`). So a stack the loop would refuse here raises the loop's
`Fallback` at the same step; since the walk's state has changed by then, that `Fallback` is not the fast path's "not
my pattern" but ends the walk (`Ctx.dirty`), exactly as the loop's own would.
"""

from __future__ import annotations

import re
from itertools import compress
from typing import TYPE_CHECKING, Any

from ckptinspect.formats.dcp.vm_eval import MAX_STACK, OPAQUE, Fallback, Rows, StoragePairs

if TYPE_CHECKING:
    from ckptinspect.formats.dcp.vm_ctx import Ctx
    from ckptinspect.formats.dcp.vm_patterns import Pattern


class Bound:
    """One boundary a run crosses, read from its row's boundary group: `cont` (APPENDS MARK) or the next object."""

    __slots__ = ("tensor", "plan", "pd_new", "get", "sig", "key", "grad", "pin", "usable", "size", "size_marked",
                 "append1", "lmark")

    def __init__(self) -> None:
        self.tensor = self.plan = False
        self.append1 = False  # the list ends with APPEND (one item, no MARK), not APPENDS
        self.lmark = True  # the next chunk list starts with MARK (False: a list of one chunk follows)
        self.pd_new = 0
        self.get: dict[str, bytes] = {}
        self.sig: tuple[bytes, ...] = ()  # the GETs of `get`, in `want` order
        self.key = ""
        self.grad = self.pin = self.usable = False
        self.size: list[int] = []
        self.size_marked = False


def read_bounds(ctx: Ctx, pat: Pattern, rec: re.Pattern[bytes], want: dict[str, Any], col: list[bytes],
                n0: int) -> dict[int, Bound | None]:
    """The boundaries of a run's rows (the rows whose boundary group is not empty), checked before anything
    changes: every GET names a slot filled before the run that holds what `want` says (checked once per distinct
    combination of them), a spelled key has its declared length, a torch.Size decodes to at most 127 ints. None for
    a row that does not check out (the run is cut before it). A real `dcp.save` of one-chunk tensors has a boundary
    on every row: one `fullmatch` and tuple indexing per row, no per-name lookups."""
    from ckptinspect.formats.dcp import vm_batch as B

    out: dict[int, Bound | None] = {}
    if not any(col):
        return out
    names = tuple(want)
    idx = [pat.index[name] for name in names]
    cont = pat.index["cont"]
    good = ctx.bound_good
    tensor = "tsm" in pat.index
    for r in compress(range(len(col)), col):  # the rows whose group is not empty, without a step per row
        m = rec.fullmatch(col[r])
        if m is None:
            out[r] = None
            continue
        gs = m.groups()
        b = Bound()
        if gs[cont]:
            out[r] = b
            continue
        sig = tuple([gs[i] for i in idx])
        if (id(pat), sig) not in good:
            for name, g in zip(names, sig):
                assert g is not None
                if (name, g) not in good:
                    if B.slot(g) < n0 and ctx.verify(g, want[name], n0):
                        good.add((name, g))
                    else:
                        break
            else:
                good.add((id(pat), sig))
            if (id(pat), sig) not in good:
                out[r] = None
                continue
        b.get, b.sig = dict(zip(names, sig)), sig
        out[r] = _tensor_fields(pat, gs, b) if tensor else _plan_fields(pat, gs, b)
    return out


def _tensor_fields(pat: Pattern, gs: tuple[Any, ...], b: Bound) -> Bound | None:
    from ckptinspect.formats.dcp import vm_batch as B

    ix = pat.index
    key_len, key, size = gs[ix["key_len"]], gs[ix["key"]], gs[ix["tsize"]]
    if key_len[0] != len(key):
        return None
    try:
        values = B.tuple_ints(size)
    except Fallback:
        return None
    if len(values) > 127:
        return None
    b.tensor = True
    b.key = key.decode("utf-8", "surrogatepass")
    b.grad, b.pin = gs[ix["grad"]] == b"\x88", gs[ix["pin"]] == b"\x88"
    b.size, b.size_marked = values, size[:1] == b"("
    b.append1, b.lmark = gs[ix["end"]] == b"a", gs[ix["lmark"]] == b"("
    return b


def _plan_fields(pat: Pattern, gs: tuple[Any, ...], b: Bound) -> Bound:
    b.plan = True
    b.pd_new = int(gs[pat.index["pd"]] == b"}\x94")
    b.usable = gs[pat.index["usable"]] == b"\x88"
    return b


def _mark(w: Any) -> None:
    w.marks.append(len(w.stack))
    if len(w.marks) + len(w.stack) > MAX_STACK:
        raise Fallback("stack bound")


def _rows(w: Any, n: int) -> None:
    if n:
        w.stack.append(Rows(-1, n))
        w.rows_pushed += n


def plan_segments(ctx: Ctx, k: int, rec_slots: Any, ends: list[tuple[int, Bound]]) -> None:
    """Apply the first `k` records of a plans run whose rows `ends` end with a boundary: per segment, skip its
    records' memo slots and push their `Rows` marker, then replay the boundary. `rec_slots`: each record's MEMOIZE
    count (without its boundary)."""
    import numpy as np

    w = ctx.w
    ctx.dirty = True
    memo, stack = w.memo, w.stack
    cum = np.concatenate(([0], np.cumsum(rec_slots[:k]))).tolist()
    prev = 0
    for r, b in ends:
        memo.skip(int(cum[r + 1] - cum[prev]))
        _rows(w, r + 1 - prev)
        items = w.pop_mark()  # APPENDS
        w.append(stack[-1], items)
        prev = r + 1
        if not b.plan:
            _mark(w)  # MARK: the next batch of the same list
            continue
        value = ctx.value
        pd: Any = None
        if b.pd_new:
            pd = {}
            memo.push(pd)
        stack.extend((value(b.get["k_sd"]), None, value(b.get["k_pd"]), pd, value(b.get["k_usable"]), b.usable))
        items = w.pop_mark()  # SETITEMS
        w.set_items(stack[-1], items)
        state = stack.pop()  # BUILD
        w.build(stack[-1], state)
        inst = w.new_inst(value(b.get["saveplan"]), ())  # GET EMPTY_TUPLE NEWOBJ MEMOIZE
        stack.append(inst)
        memo.push(inst)
        d: dict[Any, Any] = {}  # EMPTY_DICT MEMOIZE MARK
        stack.append(d)
        memo.push(d)
        _mark(w)
        stack.append(value(b.get["k_items"]))  # GET EMPTY_LIST MEMOIZE MARK
        lst = w.new_list()
        stack.append(lst)
        memo.push(lst)
        _mark(w)
    memo.skip(int(cum[k] - cum[prev]))
    _rows(w, k - prev)


_TENSOR_GETS = ("tsm", "k_properties", "props_cls", "dtype", "layout", "memory_format", "k_size", "tsize_fn",
                "k_chunks")


def tensor_segments(ctx: Ctx, start: int, k: int, ends: list[tuple[int, Bound]]) -> None:
    """Apply the first `k` records of a chunk run (their rows already in the sink from row `start`) whose rows
    `ends` end with a boundary: per segment, skip its chunks' memo slots (8 each) and push their `Rows` marker, then
    replay the boundary with the walker's methods, in the loop's order. What the loop does opcode by opcode
    without consequence for the outcome is folded (issue 31: a real `dcp.save` has a boundary after every chunk):
    the GETs' values are looked up once per combination of them; the boundary's nine memo slots are filled after
    its objects are built (nothing inside it reads them); the loop's stack-bound checks at its four MARKs are the
    one at the deepest of them; a MARK that is pushed and popped around the TensorProperties tuple is not pushed."""
    w = ctx.w
    ctx.dirty = True
    memo, stack, marks, sink = w.memo, w.stack, w.marks, w.sink
    new_inst, build, intern = w.new_inst, w.build, sink.intern
    seen: dict[tuple[bytes, ...], list[Any]] = {}
    prev = 0
    for r, b in ends:
        n = r + 1 - prev
        memo.skip(8 * n)
        rows = Rows(start + prev, n)
        w.rows_pushed += n
        if b.append1:  # APPEND: its one chunk (`single_lists` cut the run before a longer segment)
            w.append(stack[-1], [rows])
        else:
            stack.append(rows)
            items = w.pop_mark()  # APPENDS
            w.append(stack[-1], items)
        prev = r + 1
        if not b.tensor:
            _mark(w)  # MARK: the next batch of the same list
            continue
        items = w.pop_mark()  # SETITEMS
        w.set_items(stack[-1], items)
        state = stack.pop()  # BUILD: the tensor's row (`Sink.add_tensor`)
        build(stack[-1], state)
        v = seen.get(b.sig)
        if v is None:
            v = [ctx.value(b.get[name]) for name in _TENSOR_GETS]
            if any(x is OPAQUE for x in v):  # BINGET / LONG_BINGET of a value the walk did not keep
                raise Fallback("memo GET of a value not kept")
            seen[b.sig] = v
        tsm, kp, props_cls, dtype, layout, mf, ks, size_fn, kc = v
        if len(marks) + len(stack) + (9 if b.lmark else 7 if b.size_marked else 5) + 2 > MAX_STACK:
            raise Fallback("stack bound")
        key = intern(b.key)  # SHORT_BINUNICODE MEMOIZE
        inst = new_inst(tsm, ())  # GET EMPTY_TUPLE NEWOBJ MEMOIZE
        d: dict[Any, Any] = {}  # EMPTY_DICT MEMOIZE MARK
        props = new_inst(props_cls, ())  # GET GET EMPTY_TUPLE NEWOBJ MEMOIZE
        st = (dtype, layout, b.grad, mf, b.pin)  # MARK GET GET NEWFALSE/NEWTRUE GET NEWFALSE/NEWTRUE TUPLE MEMOIZE
        build(props, st)  # BUILD
        size = tuple(b.size)  # GET GET ints TUPLEn MEMOIZE TUPLE1 MEMOIZE REDUCE MEMOIZE
        args = (size,)
        value = w.reduce(size_fn, args)
        lst = w.new_list()  # GET EMPTY_LIST MEMOIZE [MARK]
        for x in (key, inst, d, props, st, size, args, value, lst):
            memo.push(x)
        stack.extend((key, inst, d))
        marks.append(len(stack))
        stack.extend((kp, props, ks, value, kc, lst))
        if b.lmark:
            marks.append(len(stack))
    memo.skip(8 * (k - prev))
    if k > prev:
        stack.append(Rows(start + prev, k - prev))
        w.rows_pushed += k - prev


def single_lists(bounds: dict[int, Bound | None], ok: Any) -> None:
    """Cut a chunk run (`ok[r] = False`) where a list of one chunk would not be one record: a segment that ends
    with APPEND must be one row (APPEND takes one item off the stack, a `Rows` marker stands for all of its rows),
    and a list begun without MARK must be one row ending with APPEND. Rows past a None boundary are cut anyway."""
    prev, single = -1, -1  # the last boundary row; the row whose boundary began a list without MARK
    for r in sorted(bounds):
        b = bounds[r]
        if b is None:
            return
        if single >= 0 and r != single + 1:
            ok[single + 2] = False  # row single + 1 had no boundary: a second chunk in that list
            return
        if (single >= 0 and not b.append1) or (b.append1 and r != prev + 1):
            ok[r] = False
            return
        single = r if b.tensor and not b.lmark else -1
        prev = r
    if 0 <= single < len(ok) - 2:
        ok[single + 2] = False


def storage_segments(ctx: Ctx, k: int, ends: list[int]) -> None:
    """The first `k` storage_data entries of a run (already in the sink) whose rows `ends` end a SETITEMS batch: per
    batch, its `StoragePairs` marker, then SETITEMS and MARK replayed (no MEMOIZE in between)."""
    w = ctx.w
    ctx.dirty = True
    prev = 0
    for r in ends:
        w.stack.append(StoragePairs(r + 1 - prev))
        w.pairs_pushed += r + 1 - prev
        items = w.pop_mark()  # SETITEMS
        w.set_items(w.stack[-1], items)
        _mark(w)  # MARK
        prev = r + 1
    if k > prev:
        w.stack.append(StoragePairs(k - prev))
        w.pairs_pushed += k - prev
