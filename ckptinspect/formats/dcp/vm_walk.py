"""The opcode loop of the streaming `.metadata` reader: reads the file once, in blocks, and evaluates it.

Opcodes are the binary ones of protocols 2-5 (what `pickle.dump` writes for DCP `Metadata`); anything else
(protocol-0 text opcodes, persistent ids, extension codes, out-of-band buffers) raises `Fallback`. `fast` (see
`vm_fast.py`) takes over at the byte patterns a DCP writer repeats per chunk; this loop does the rest.
"""

from __future__ import annotations

from typing import IO, Any, Callable

from ckptinspect.formats.dcp.vm_eval import (
    D,
    UNSET,
    BUILDER_VALUES,
    MAX_BYTES_ARG,
    MAX_STACK,
    OPAQUE,
    STORAGE_MARK,
    CountList,
    Fallback,
    Global,
    Inst,
    Memo,
    Rows,
    Sink,
    StoragePairs,
    hook_key,
    may_hook,
    resolve_global,
)
from ckptinspect.formats.dcp.names import CHUNK, PLAN_ITEMS, TSM, WRITE_ITEM
from ckptinspect.formats.dcp.vm_stats import KINDS
from ckptinspect.pickling.report import PickleReport

BLOCK = 8 << 20
MARGIN = 1 << 16  # bytes kept ahead of the cursor: every fixed-size argument and every fast-path record fits

# A fast path: (buf, pos, walker) -> new pos, or -1 when the bytes at pos are not its pattern.
FastPath = Callable[[bytes, int, "Walker"], int]


class Walker:
    """State of one walk: the stack, the memo, the sink, and whether the plans began."""

    def __init__(self, f: IO[bytes], sink: Sink, report: PickleReport, max_bytes: int) -> None:
        self.f = f
        self.sink = sink
        self.report = report
        self.max_bytes = max_bytes
        self.read_total = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo = Memo()
        self.cache: dict[tuple[str, str], Any] = {}
        self.plans = False
        self.fast: dict[int, FastPath] = {}
        # fast-path markers pushed / consumed by the list append or dict update that follows them
        self.rows_pushed = self.rows_listed = self.pairs_pushed = self.pairs_set = 0
        # records of each kind (`vm_stats.KINDS`) read by the batch paths / by this loop past memo slot `batch_from`
        self.batch, self.loop, self.batch_from = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0), 0
        self.runs = dict.fromkeys(KINDS, 0)  # batch-path calls that read records (`ReadStats.runs`)

    def release(self) -> None:
        """Drop what the walk built and its fast paths. The fast paths close over the walker (`vm_fast.py`): a
        reference cycle that holds the memo, the stack and so the whole object graph. Built under `no_gc`, which
        freezes it, that cycle is never collected: every `.metadata` read would stay in memory for good."""
        self.fast.clear()
        self.stack.clear()
        self.marks.clear()
        self.cache.clear()
        self.memo = Memo()

    def markers_ok(self) -> bool:
        return self.rows_pushed == self.rows_listed and self.pairs_pushed == self.pairs_set

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        self.read_total += len(data)
        if self.read_total > self.max_bytes:
            raise Fallback(f"more than {self.max_bytes} bytes")
        return data

    def global_(self, module: Any, name: Any) -> Any:
        if type(module) is not str or type(name) is not str:
            raise Fallback("STACK_GLOBAL operands are not strings")
        v = resolve_global(module, name, self.report, self.cache)
        if v.__class__ is Global and v.plan:
            self.plans = True
        return v

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise Fallback("no MARK")
        k = self.marks.pop()
        items = self.stack[k:]
        del self.stack[k:]
        return items

    def new_list(self) -> Any:
        return CountList() if self.plans else []

    def new_inst(self, cls: Any, args: Any) -> Any:
        """NEWOBJ (and REDUCE on a class): a `Rec` class of the reference ignores the arguments, an `Obj` class
        keeps them as ``_args`` in its attributes (`unpickle.Obj.__new__`)."""
        if cls.__class__ is not Global or type(args) is not tuple:
            raise Fallback("NEWOBJ on a non-class")
        if not cls.new_ok:  # the reference judges it (a call: CK604)
            raise Fallback(f"NEWOBJ on {cls.qual}, which may run code")
        if cls.rec and args:
            # the reference's records ignore NEWOBJ arguments, the walk does not (what went in may be called later)
            raise Fallback(f"NEWOBJ on {cls.qual} with arguments")
        inst = Inst(cls)
        if not cls.rec:
            inst.state = {"_args": args} if args else {}
        return inst

    def reduce(self, fn: Any, args: Any) -> Any:
        if type(args) is not tuple:
            raise Fallback("REDUCE arguments are not a tuple")
        if fn.__class__ is Global:
            if fn.rec:
                raise Fallback("REDUCE on a record class")
            if not fn.call_ok:  # `cls(*args)` runs its `__init__`: the reference judges it (CK604)
                raise Fallback(f"REDUCE on {fn.qual}, which may run code")
            return self.new_inst(fn, args)
        if id(fn) not in BUILDER_VALUES:
            raise Fallback("REDUCE on a value")
        for a in args:
            if a is OPAQUE or a.__class__ in (Inst, CountList, Rows):
                if self.plans:
                    return OPAQUE
                raise Fallback("REDUCE on an object")
        return fn(*args)

    def build(self, inst: Any, state: Any) -> None:
        if inst.__class__ is not Inst:
            if self.plans and inst is OPAQUE:
                return
            raise Fallback("BUILD on a non-object")
        if may_hook(state):
            raise Fallback("a BUILD state that may install a hook")
        if not inst.cls.rec:  # `StatefulObj.__setstate__`
            d = inst.state
            if type(state) is dict:
                d.update(state)
            elif type(state) is tuple and len(state) == 2 and (state[0] is None or type(state[0]) is dict) \
                    and type(state[1]) is dict:
                d.update(state[0] or {})
                d.update(state[1])
            else:
                d["_state"] = state
            return
        if inst.state is not UNSET:
            raise Fallback("BUILD twice")
        inst.state = state
        if self.plans:
            if inst.cls.qual in PLAN_ITEMS:
                inst.state = None  # plan items: only counted
                self.loop["plan"] += inst.cls.qual == WRITE_ITEM and self.memo.n >= self.batch_from
            return
        q = inst.cls.qual
        if q == CHUNK:
            inst.row = self.sink.add_chunk(state)
            inst.state = None
            self.loop["chunk"] += self.memo.n >= self.batch_from
        elif q == TSM:
            chunks = state.get("chunks") if type(state) is dict else None
            items = chunks if type(chunks) is list else ([] if not chunks else None)
            if items is None:
                raise Fallback("TensorStorageMetadata chunks")
            inst.row = self.sink.add_tensor(state, items)
            items.clear()
            inst.state = None

    def set_items(self, d: Any, items: list[Any]) -> None:
        if type(d) is not dict:
            raise Fallback("SETITEMS on a non-dict")
        i, n = 0, len(items)
        sink = self.sink
        while i < n:
            k = items[i]
            if k.__class__ is StoragePairs:
                d[STORAGE_MARK] = True
                self.pairs_set += k.n
                i += 1
                continue
            if i + 1 >= n:
                raise Fallback("odd SETITEMS")
            v = items[i + 1]
            i += 2
            if k.__class__ is Inst:
                if self.plans:
                    raise Fallback("an object as a dict key in the plans")
                sink.add_storage(k, v)
                d[STORAGE_MARK] = True
                self.loop["storage"] += self.memo.n >= self.batch_from
                continue
            if hook_key(k):
                raise Fallback(f"a value stored under {k!r}, a name the unpickler calls")
            try:
                d[k] = v
            except TypeError as e:
                raise Fallback("unhashable key") from e
        if STORAGE_MARK in d and sink.storage_dicts != id(d):
            if sink.storage_dicts:
                raise Fallback("two storage dicts")
            sink.storage_dicts = id(d)

    def append(self, lst: Any, items: list[Any]) -> None:
        if type(lst) is list:
            lst.extend(items)
            for v in items:
                if v.__class__ is Rows:
                    self.rows_listed += v.n
        elif lst.__class__ is CountList:
            for v in items:
                if v.__class__ is Rows:
                    lst.n += v.n
                    self.rows_listed += v.n
                else:
                    lst.add(v)
        else:
            raise Fallback("APPEND on a non-list")


def walk(w: Walker) -> Any:
    """Evaluate the pickle; return the root value. Raises `Fallback`."""
    buf = w.read(BLOCK)
    pos = 0
    eof = len(buf) < BLOCK
    limit = len(buf) if eof else len(buf) - MARGIN
    stack, marks, memo = w.stack, w.marks, w.memo
    push, mpush, mget = stack.append, memo.push, memo.get
    fast = w.fast
    from_bytes = int.from_bytes
    while True:
        if pos > limit:
            buf = buf[pos:] + w.read(BLOCK)
            pos = 0
            eof = len(buf) < MARGIN or eof
            limit = len(buf) if eof else len(buf) - MARGIN
            if len(buf) < MARGIN:
                eof = True
                limit = len(buf)
        if pos >= len(buf):
            raise Fallback("truncated")
        op = buf[pos]
        fp = fast.get(op)
        if fp is not None:
            new = fp(buf, pos, w)
            if new >= 0:
                pos = new
                continue
        pos += 1
        if op == 0x94:  # MEMOIZE
            mpush(stack[-1])
        elif op == 0x6A:  # LONG_BINGET
            push(mget(from_bytes(buf[pos:pos + 4], "little")))
            pos += 4
            if stack[-1] is OPAQUE and not w.plans:
                raise Fallback("memo GET of a value not kept")
        elif op == 0x68:  # BINGET
            push(mget(buf[pos]))
            pos += 1
            if stack[-1] is OPAQUE and not w.plans:
                raise Fallback("memo GET of a value not kept")
        elif op == 0x85:  # TUPLE1
            stack[-1] = (stack[-1],)
        elif op == 0x86:  # TUPLE2
            stack[-2:] = [(stack[-2], stack[-1])]
        elif op == 0x87:  # TUPLE3
            stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            if len(marks) + len(stack) > MAX_STACK:
                raise Fallback("stack bound")
        elif op == 0x29:  # EMPTY_TUPLE
            push(())
        elif op == 0x81:  # NEWOBJ
            args = stack.pop()
            stack[-1] = w.new_inst(stack[-1], args)
        elif op == 0x62:  # BUILD
            state = stack.pop()
            w.build(stack[-1], state)
        elif op == 0x7D:  # EMPTY_DICT
            push({})
        elif op == 0x75:  # SETITEMS
            items = w.pop_mark()
            w.set_items(stack[-1], items)
        elif op == 0x73:  # SETITEM
            v = stack.pop()
            k = stack.pop()
            w.set_items(stack[-1], [k, v])
        elif op == 0x52:  # REDUCE
            args = stack.pop()
            stack[-1] = w.reduce(stack[-1], args)
        elif op == 0x4B:  # BININT1
            push(buf[pos])
            pos += 1
        elif op == 0x4D:  # BININT2
            push(from_bytes(buf[pos:pos + 2], "little"))
            pos += 2
        elif op == 0x4A:  # BININT
            push(from_bytes(buf[pos:pos + 4], "little", signed=True))
            pos += 4
        elif op == 0x8A:  # LONG1
            n = buf[pos]
            push(from_bytes(buf[pos + 1:pos + 1 + n], "little", signed=True))
            pos += 1 + n
        elif op == 0x89:  # NEWFALSE
            push(False)
        elif op == 0x88:  # NEWTRUE
            push(True)
        elif op == 0x4E:  # NONE
            push(None)
        elif op == 0x74:  # TUPLE
            push(tuple(w.pop_mark()))
        elif op == 0x5D:  # EMPTY_LIST
            push(w.new_list())
        elif op == 0x6C:  # LIST
            items = w.pop_mark()
            lst = w.new_list()
            w.append(lst, items)
            push(lst)
        elif op == 0x65:  # APPENDS
            items = w.pop_mark()
            w.append(stack[-1], items)
        elif op == 0x61:  # APPEND
            v = stack.pop()
            w.append(stack[-1], [v])
        elif op in (0x8C, 0x58, 0x8D, 0x43, 0x42, 0x8E):  # strings and bytes
            h = 1 if op in (0x8C, 0x43) else 8 if op in (0x8D, 0x8E) else 4
            n = from_bytes(buf[pos:pos + h], "little")
            pos += h
            if n > MAX_BYTES_ARG:
                raise Fallback("string bound")
            if pos + n > len(buf):
                if eof:
                    raise Fallback("truncated")
                buf = buf[pos:] + w.read(max(BLOCK, n + MARGIN))
                pos = 0
                eof = len(buf) < n + MARGIN
                limit = len(buf) if eof else len(buf) - MARGIN
                if pos + n > len(buf):
                    raise Fallback("truncated")
            raw = buf[pos:pos + n]
            pos += n
            if op in (0x8C, 0x58, 0x8D):
                push(w.sink.intern(raw.decode("utf-8", "surrogatepass")))
            else:
                push(raw)
        elif op == 0x93:  # STACK_GLOBAL
            name = stack.pop()
            stack[-1] = w.global_(stack[-1], name)
        elif op == 0x63:  # GLOBAL
            nl = buf.index(b"\n", pos)
            nl2 = buf.index(b"\n", nl + 1)
            module, name = buf[pos:nl].decode("utf-8"), buf[nl + 1:nl2].decode("utf-8")
            pos = nl2 + 1
            push(w.global_(module, name))
        elif op == 0x71:  # BINPUT
            memo.put(buf[pos], stack[-1])
            pos += 1
        elif op == 0x72:  # LONG_BINPUT
            memo.put(from_bytes(buf[pos:pos + 4], "little"), stack[-1])
            pos += 4
        elif op == 0x47:  # BINFLOAT
            push(D.unpack(buf[pos:pos + 8][::-1])[0])
            pos += 8
        elif op == 0x64:  # DICT
            items = w.pop_mark()
            d: dict[Any, Any] = {}
            w.set_items(d, items)
            push(d)
        elif op == 0x30:  # POP
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
        elif op == 0x31:  # POP_MARK
            w.pop_mark()
        elif op == 0x32:  # DUP
            push(stack[-1])
        elif op == 0x95:  # FRAME (the length only helps readers that prefetch)
            pos += 8
        elif op == 0x80:  # PROTO
            if buf[pos] < 2 or buf[pos] > 5:
                raise Fallback(f"protocol {buf[pos]}")
            pos += 1
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or marks or not w.markers_ok():
                raise Fallback("STOP with a stack")
            if pos < len(buf) or w.read(1):
                # What follows a STOP is judged too (a second pickle, or bytes that name globals: the walk reads up
                # to `walk.MAX_STREAM_PICKLES` of them); the reference reader merges that walk's verdict.
                raise Fallback("bytes after STOP")
            return stack[0]
        else:
            raise Fallback(f"opcode 0x{op:02x}")
