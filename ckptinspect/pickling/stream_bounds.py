"""The list and object boundaries a run of records crosses (`stream_fast.py`), replayed with the loop's own steps.

A run of WriteItems used to end with its items list: at every `SavePlan` (one per rank, ~75 items each at 1M chunks)
the loop took over for a few dozen opcodes and the next run paid the batch decoders' fixed cost again. The PLAN
pattern now also matches what follows a WriteItem up to the next one when it is one of two fixed shapes
(`stream_patterns.py`): APPENDS MARK (the next batch of 1,000 items of the same list), or APPENDS, the SavePlan's
other fields, SETITEMS BUILD, and the next SavePlan up to its items list's MARK. Those opcodes are not modelled
here: they are evaluated by the walker's own methods (`Walker.pop_mark`, `append`, `set_items`, `build`,
`new_inst`, `new_list`, `Memo.push`), in the loop's order, on the values its GETs name (verified before: slots filled
before the run, keys strings, the class `SavePlan`). So a stack the loop would refuse here raises the loop's
`Fallback` at the same step; since the walk's state has changed by then, that `Fallback` is not the fast path's "not
my pattern" but ends the walk (`Ctx.dirty`), exactly as the loop's own would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptinspect.pickling.stream_eval import MAX_STACK, OPAQUE, Fallback, Rows, StoragePairs

if TYPE_CHECKING:
    from ckptinspect.pickling.stream_ctx import Ctx


def _mark(w: Any) -> None:
    w.marks.append(len(w.stack))
    if len(w.marks) + len(w.stack) > MAX_STACK:
        raise Fallback("stack bound")


def _rows(w: Any, n: int) -> None:
    if n:
        w.stack.append(Rows(-1, n))
        w.rows_pushed += n


def plan_segments(ctx: Ctx, k: int, rec_slots: Any, ends: list[int], cont: Any, pd_new: Any,
                  gets: dict[str, list[bytes]], usable: list[bytes]) -> None:
    """Apply the first `k` records of a plans run whose rows `ends` end with a boundary: per segment, skip its
    records' memo slots and push their `Rows` marker, then replay the boundary. `rec_slots`: each record's MEMOIZE
    count (without its boundary); `gets`: the boundary GET columns by name."""
    import numpy as np

    w = ctx.w
    ctx.dirty = True
    memo, stack = w.memo, w.stack
    cum = np.concatenate(([0], np.cumsum(rec_slots[:k]))).tolist()
    prev = 0
    for r in ends:
        memo.skip(int(cum[r + 1] - cum[prev]))
        _rows(w, r + 1 - prev)
        items = w.pop_mark()  # APPENDS
        w.append(stack[-1], items)
        if cont[r]:
            _mark(w)  # MARK: the next batch of the same list
        else:
            value = ctx.value
            pd: Any = None
            if pd_new[r]:
                pd = {}
                memo.push(pd)
            stack.extend((value(gets["k_sd"][r]), None, value(gets["k_pd"][r]), pd, value(gets["k_usable"][r]),
                          usable[r] == b"\x88"))
            items = w.pop_mark()  # SETITEMS
            w.set_items(stack[-1], items)
            state = stack.pop()  # BUILD
            w.build(stack[-1], state)
            inst = w.new_inst(value(gets["saveplan"][r]), ())  # GET EMPTY_TUPLE NEWOBJ MEMOIZE
            stack.append(inst)
            memo.push(inst)
            d: dict[Any, Any] = {}  # EMPTY_DICT MEMOIZE MARK
            stack.append(d)
            memo.push(d)
            _mark(w)
            stack.append(value(gets["k_items"][r]))  # GET EMPTY_LIST MEMOIZE MARK
            lst = w.new_list()
            stack.append(lst)
            memo.push(lst)
            _mark(w)
        prev = r + 1
    memo.skip(int(cum[k] - cum[prev]))
    _rows(w, k - prev)


# The captured columns of a tensor boundary (`stream_patterns.CHUNK`) the replay reads.
TENSOR_BOUNDARY = ("key", "tsm", "k_properties", "props_cls", "dtype", "layout", "grad", "memory_format", "pin",
                   "k_size", "tsize_fn", "tsize", "k_chunks")


def tensor_segments(ctx: Ctx, start: int, k: int, ends: list[int], cont: Any, cols: dict[str, list[bytes]]) -> None:
    """Apply the first `k` records of a chunk run (their rows already in the sink from row `start`) whose rows
    `ends` end with a boundary: per segment, skip its chunks' memo slots (8 each) and push their `Rows` marker, then
    replay the boundary opcode by opcode with the walker's methods."""
    from ckptinspect.pickling import stream_batch as B

    w = ctx.w
    ctx.dirty = True
    memo, stack, sink = w.memo, w.stack, w.sink

    def get(name: str, r: int) -> Any:  # BINGET / LONG_BINGET, as the loop pushes it
        v = ctx.value(cols[name][r])
        if v is OPAQUE:
            raise Fallback("memo GET of a value not kept")
        stack.append(v)
        return v

    def memoize() -> None:
        memo.push(stack[-1])

    prev = 0
    for r in ends:
        memo.skip(8 * (r + 1 - prev))
        stack.append(Rows(start + prev, r + 1 - prev))
        w.rows_pushed += r + 1 - prev
        items = w.pop_mark()  # APPENDS
        w.append(stack[-1], items)
        prev = r + 1
        if cont[r]:
            _mark(w)  # MARK: the next batch of the same list
            continue
        items = w.pop_mark()  # SETITEMS
        w.set_items(stack[-1], items)
        state = stack.pop()  # BUILD: the tensor's row (`Sink.add_tensor`)
        w.build(stack[-1], state)
        stack.append(sink.intern(cols["key"][r].decode("utf-8", "surrogatepass")))  # SHORT_BINUNICODE MEMOIZE
        memoize()
        cls = get("tsm", r)  # GET EMPTY_TUPLE NEWOBJ MEMOIZE
        stack[-1] = w.new_inst(cls, ())
        memoize()
        stack.append({})  # EMPTY_DICT MEMOIZE MARK
        memoize()
        _mark(w)
        get("k_properties", r)
        cls = get("props_cls", r)  # GET EMPTY_TUPLE NEWOBJ MEMOIZE
        stack[-1] = w.new_inst(cls, ())
        memoize()
        _mark(w)  # MARK GET GET NEWFALSE/NEWTRUE GET NEWFALSE/NEWTRUE TUPLE MEMOIZE BUILD
        get("dtype", r)
        get("layout", r)
        stack.append(cols["grad"][r] == b"\x88")
        get("memory_format", r)
        stack.append(cols["pin"][r] == b"\x88")
        stack.append(tuple(w.pop_mark()))
        memoize()
        state = stack.pop()
        w.build(stack[-1], state)
        get("k_size", r)
        get("tsize_fn", r)  # GET ints TUPLEn MEMOIZE TUPLE1 MEMOIZE REDUCE MEMOIZE
        raw = cols["tsize"][r]
        ints = B.decode_ints(B._TOKEN.findall(raw[1:-1] if raw[:1] == b"(" else raw[:-1])).tolist()
        if raw[:1] == b"(":
            _mark(w)
            stack.extend(ints)
            stack.append(tuple(w.pop_mark()))
        else:
            stack.append(tuple(ints))
        memoize()
        stack[-1] = (stack[-1],)
        memoize()
        args = stack.pop()
        stack[-1] = w.reduce(stack[-1], args)
        memoize()
        get("k_chunks", r)
        stack.append(w.new_list())  # EMPTY_LIST MEMOIZE MARK
        memoize()
        _mark(w)
    memo.skip(8 * (k - prev))
    if k > prev:
        stack.append(Rows(start + prev, k - prev))
        w.rows_pushed += k - prev


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
