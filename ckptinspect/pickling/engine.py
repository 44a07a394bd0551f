"""The opcode walker's engine: one pickle segment walked over a byte buffer or a stream, never built.

`walk_segment` moves a cursor over the opcodes (argument layout and stack effect from `opcodes.py`) and keeps a
model of the stack and the memo in which each entry is one of:
- an `int`: an untracked value, holding its nesting depth (0 for a scalar, 1 + the deepest part for a container);
- a `str` of at most `MAX_TRACKED_STR` characters (module / attribute names for STACK_GLOBAL);
- a `Val`: a global (as GLOBAL / STACK_GLOBAL / INST / EXT pushed it) or a value built from globals that may not be
  called (its "taint"), with its depth.

What it records into the `PickleWalk` (`walk.py`): every global referenced (with the allowlist verdict) and every
global CALLED that is not an inert constructor (both judged in `judge.py`), nesting beyond `MAX_DEPTH` whatever
opcode builds it (the C unpickler hashes a tuple used as a dict key or set member recursively, in C: 100,000 levels
overflow the C stack), memo indices beyond what was memoized, and byte strings that hold a pickle or a zip archive
(Transformer Engine's `_extra_state`, a pickled `BytesIO`).

Memory: the memo keeps one byte of depth per slot (a `bytearray`) plus the tracked strings / `Val`s; a stream is
read in windows of `WINDOW` bytes, so a 4 GB `.metadata` is walked in bounded memory.
"""

from __future__ import annotations

import copyreg
from typing import TYPE_CHECKING

from ckptinspect.pickling.walkstate import (
    EMPTY,
    MAX_LINE,
    MAX_TRACKED_STR as MAX_TRACKED_STR,
    GlobalRef,
    Source,
    Stop,
    combine,
    decode_str,
    depth_of,
    length_claim,
    line_pair,
    text_index,
    tuple_of,
    Val,
)
from ckptinspect.pickling.judge import (
    DYNAMIC_GLOBAL as DYNAMIC_GLOBAL,
    CALL_OPS,
    add_ref,
    judge_call,
    record,
    dict_value,
    makes_dict,
    makes_str,
)
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.opcodes import (  # the opcode table
    HIGHEST_PROTOCOL,
    A_FIXED,
    A_INVALID,
    A_LEN,
    A_LINE2,
    A_NONE,
    ACT_DUP,
    ACT_EXT,
    ACT_FRAME,
    ACT_GENERIC,
    ACT_GET,
    ACT_GLOBAL,
    ACT_INST,
    ACT_MARK,
    ACT_MEMOIZE,
    ACT_POP,
    ACT_PROTO,
    ACT_PUT,
    ACT_STACK_GLOBAL,
    ACT_STOP,
    STR,
    T,
    TEXT_MEMO,
)

if TYPE_CHECKING:
    from ckptinspect.pickling.walk import PickleWalk

MAX_DEPTH = 250  # nesting of containers / calls; real state dicts stay below ~20
MAX_BLOBS = 1000  # embedded pickles / archives recorded per stream
_MODIFY_OPS = frozenset(ord(c) for c in "ae" "s" "u" "\x90")  # APPEND(S) SETITEM(S) ADDITEMS: container stays
_BLOB_OPS = frozenset({ord("B"), ord("C"), ord("\x8e"), ord("\x96")})  # BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8
_PERSID_OPS = frozenset({ord("P"), ord("Q")})
_SETITEM_OPS = frozenset({ord("s"), ord("u")})  # SETITEM SETITEMS
_DICT_OP = ord("d")
_TUPLE_OPS = frozenset({ord("t"), 0x85, 0x86, 0x87})  # TUPLE TUPLE1 TUPLE2 TUPLE3
# What a generic opcode does with what it consumes, by opcode byte.
_K_PLAIN, _K_CALL, _K_MODIFY, _K_PERSID = 0, 1, 2, 3
_KINDS = [_K_CALL if i in CALL_OPS else _K_MODIFY if i in _MODIFY_OPS else _K_PERSID if i in _PERSID_OPS
          else _K_PLAIN for i in range(256)]
_PICKLE_HEADS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_ZIP_HEAD = b"PK\x03\x04"
_LATIN1_PICKLE_HEADS = tuple("\x80".encode() + bytes([p]) for p in (2, 3, 4, 5))


def walk_segment(src: Source, pos: int, walk: PickleWalk, max_ops: int, max_stack: int) -> int:
    """Walk one pickle starting at `src.buf[pos]`; return the position after its STOP. Raises `Stop`."""
    stack: list[object] = []
    marks: list[int] = []
    # The memo: filled slots are [0, prefix) plus `sparse`; their count is where MEMOIZE stores (C `memo_len`,
    # pickle.py `len(memo)`). Modelled exactly, or a crafted pickle could make a later GET feed STACK_GLOBAL a string
    # the walker did not expect. `depths[i]` is slot i's nesting depth; `tracked` holds its str / `Val`.
    prefix = 0
    sparse: set[int] = set()
    tracked: dict[int, object] = {}
    depths = bytearray()
    textmemo = TEXT_MEMO
    proto = 0
    t = T
    names, argk, asize, asigned, acts = t.names, t.argk, t.asize, t.asigned, t.act
    markp, popsp, pushesp = t.mark, t.pops, t.pushes
    kinds, blob_ops = _KINDS, _BLOB_OPS
    ops = walk.ops
    buf = src.buf
    end = len(buf)
    try:
        while True:
            if pos >= end:
                pos = src.fill(pos, 1)
                buf, end = src.buf, len(src.buf)
            code = buf[pos]
            ak = argk[code]
            if ak == A_INVALID:
                raise Stop(f"invalid opcode 0x{code:02x} at byte {src.base + pos}", src.base + pos)
            ops += 1
            if ops > max_ops:
                raise Stop(f"more than {max_ops} opcodes", src.base + pos, limit=True)
            start = src.base + pos
            pos += 1
            act = acts[code]
            # 1. the argument (sliced only when the action needs it)
            arg: bytes | None = None
            if ak == A_NONE:
                pass
            elif ak == A_FIXED:
                n = asize[code]
                if pos + n > end:
                    pos = src.fill(pos, n)
                    buf, end = src.buf, len(src.buf)
                if act != ACT_GENERIC:
                    arg = buf[pos : pos + n]
                pos += n
            elif ak == A_LEN:
                h = asize[code]
                if pos + h > end:
                    pos = src.fill(pos, h)
                    buf, end = src.buf, len(src.buf)
                n = int.from_bytes(buf[pos : pos + h], "little", signed=asigned[code])
                pos += h
                if n < 0:
                    raise Stop(f"{names[code]} at byte {start} has a negative length {n}", start)
                if src.base + pos + n > src.total:
                    raise length_claim(names[code], start, n, src.total - src.base - pos, src.total)
                if act == STR or (code in blob_ops and n >= 8):
                    want = n if act == STR and n <= MAX_TRACKED_STR else 4
                    if pos + want > end:
                        pos = src.fill(pos, min(want, n))
                        buf, end = src.buf, len(src.buf)
                    head = buf[pos : pos + 4]
                    if n >= 8 and len(walk.blobs) < MAX_BLOBS:
                        if act != STR and (head[:2] in _PICKLE_HEADS or head == _ZIP_HEAD):
                            walk.blobs.append((src.base + pos, n, False))
                        elif act == STR and (head[:3] in _LATIN1_PICKLE_HEADS or head == _ZIP_HEAD):
                            # protocol 2 writes bytes as `_codecs.encode(str, 'latin1')`: the str, UTF-8 encoded
                            walk.blobs.append((src.base + pos, n, True))
                    arg = buf[pos : pos + n] if act == STR and n <= MAX_TRACKED_STR else None
                if pos + n <= end:
                    pos += n
                else:
                    pos = src.skip(pos, n)
                    buf, end = src.buf, len(src.buf)
            else:
                pos, nl = src.line(pos)
                buf, end = src.buf, len(src.buf)
                if ak == A_LINE2:
                    while True:
                        nl2 = buf.find(b"\n", nl + 1)
                        if nl2 >= 0:
                            break
                        if nl - pos > MAX_LINE:
                            raise Stop(f"{names[code]} at byte {start} has no second line", start)
                        off = nl - pos
                        pos = src.fill(pos, len(buf) - pos + 1)
                        buf, end = src.buf, len(src.buf)
                        nl = pos + off
                    arg = buf[pos:nl2]
                    pos = nl2 + 1
                else:
                    if act != ACT_GENERIC and nl - pos <= MAX_TRACKED_STR + 2:
                        arg = buf[pos:nl]
                    pos = nl + 1

            # 2. the effect on the stack / memo model
            if act == ACT_GENERIC:
                base = marks[-1] if marks else 0
                consumed: list[object] | None = None
                if markp[code]:
                    if not marks:
                        raise Stop(f"{names[code]} at byte {start} without a MARK", start)
                    m = marks.pop()
                    consumed = stack[m:]
                    del stack[m:]
                    base = marks[-1] if marks else 0
                n = popsp[code]
                if n:
                    if len(stack) - base < n:
                        raise Stop(f"stack underflow: {names[code]} at byte {start}", start)
                    popped = stack[-n:]
                    del stack[-n:]
                    consumed = popped + consumed if consumed else popped
                kind = kinds[code]
                if not pushesp[code]:
                    pass
                elif not consumed:
                    stack.append(1 if kind == _K_PERSID else 0)
                elif kind == _K_PLAIN or kind == _K_PERSID:
                    # the hot path (tuples, lists, dicts of plain values): depth = 1 + the deepest part
                    d = 0
                    for x in consumed:
                        c = x.__class__
                        if c is int:
                            if x > d:  # type: ignore[operator]
                                d = x  # type: ignore[assignment]
                        elif c is Val:
                            d = -1
                            break
                    if kind == _K_PERSID:
                        stack.append(1)  # torch's persistent_load reads the id as data (storage type, key, ...)
                    elif d >= 0:
                        if d >= MAX_DEPTH:
                            _deep(walk, d + 1, start, names[code])
                        stack.append(d + 1)
                    elif code in _TUPLE_OPS and len(consumed) <= 4:  # 4: `_rebuild_from_type_v2` operands
                        _push(walk, stack, _made(tuple_of(consumed), EMPTY), start, names[code])
                    elif code == _DICT_OP:
                        v = dict_value(walk, None, consumed, combine(consumed), start)
                        _push(walk, stack, v, start, names[code])
                    else:
                        _push(walk, stack, _made(combine(consumed), EMPTY), start, names[code])
                elif kind == _K_CALL:
                    if judge_call(walk, code, consumed, start):
                        # an inert constructor / allowed class created: the result carries only its arguments (and
                        # is a dict made from them only when the constructor makes dicts: `judge.hooked`)
                        r = combine(consumed[1:]) if len(consumed) > 1 else 1
                        if makes_str(consumed[0]):
                            r = _strish(r)
                        _push(walk, stack, _made(r, None if makes_dict(consumed[0]) else EMPTY), start, names[code])
                    elif code == 0x62:  # BUILD: the object stays, with its state inside
                        obj = consumed[0]
                        r = combine([obj, combine(consumed[1:])], extra=0)
                        hook = obj.hook if obj.__class__ is Val else EMPTY
                        _push(walk, stack, _made(r, hook), start, names[code])
                    else:
                        _push(walk, stack, combine(consumed), start, names[code])
                else:  # _K_MODIFY: the container stays; its depth is its own or 1 + an added item's
                    items = consumed[1:]
                    v = combine([consumed[0], combine(items) if items else 0], extra=0)
                    if code in _SETITEM_OPS:
                        v = dict_value(walk, consumed[0], items, v, start)
                    else:
                        c0 = consumed[0]
                        v = _made(v, c0.hook if c0.__class__ is Val else EMPTY)
                    _push(walk, stack, v, start, names[code])
            elif act == ACT_MEMOIZE or act == ACT_PUT:
                if len(stack) <= (marks[-1] if marks else 0):
                    raise Stop(f"stack underflow: {names[code]} at byte {start}", start)
                if act == ACT_MEMOIZE:
                    if sparse:
                        idx = prefix + len(sparse)  # > prefix: a new sparse slot, or an overwrite of one
                        sparse.add(idx)
                    else:
                        idx = prefix
                        prefix += 1
                else:
                    if arg is None:
                        raise Stop(f"oversized memo index at byte {start}", start)
                    idx = text_index(arg, start) if code in textmemo else int.from_bytes(arg, "little")
                    if idx > walk.max_memo_index:
                        walk.max_memo_index = idx
                    if idx >= prefix and idx not in sparse:
                        if idx == prefix:
                            prefix += 1
                            while sparse and prefix in sparse:
                                sparse.remove(prefix)
                                prefix += 1
                        else:
                            sparse.add(idx)
                if idx >= len(depths):
                    if idx > ops + (1 << 20):
                        # A pickler never names a slot beyond the objects it memoized; CPython's unpickler
                        # allocates (and zeroes) a memo array of twice the index: `LONG_BINPUT 0x7fffffff` in
                        # 14 bytes costs it 32 GiB.
                        walk.max_memo_index = max(walk.max_memo_index, idx)
                        raise Stop(f"memo index {idx} at byte {start} is beyond anything {ops} opcodes can have "
                                   "memoized (crafted to exhaust the unpickler's memory)", start, limit=True)
                    depths.extend(bytes(idx + 1 - len(depths) + (len(depths) >> 1)))
                top = stack[-1]
                c = top.__class__
                if c is int:
                    depths[idx] = top  # type: ignore[call-overload]
                    if tracked:
                        tracked.pop(idx, None)
                else:
                    depths[idx] = depth_of(top)
                    tracked[idx] = top
            elif act == STR:
                value = decode_str(code, arg)
                if value is None:
                    raise Stop(f"STRING argument at byte {start} is not quoted", start)
                stack.append(value)
            elif act == ACT_GET:
                if arg is None:
                    raise Stop(f"oversized memo index at byte {start}", start)
                idx = text_index(arg, start) if code in textmemo else int.from_bytes(arg, "little")
                v = tracked.get(idx)
                stack.append(v if v is not None else (depths[idx] if idx < len(depths) else 0))
            elif act == ACT_MARK:
                marks.append(len(stack))
            elif act == ACT_STACK_GLOBAL:
                if len(stack) - (marks[-1] if marks else 0) < 2:
                    raise Stop(f"stack underflow: STACK_GLOBAL at byte {start}", start)
                name_v = stack.pop()
                module_v = stack.pop()
                if isinstance(module_v, str) and isinstance(name_v, str):
                    stack.append(record(walk, module_v, name_v, "STACK_GLOBAL", start))
                else:
                    add_ref(walk, GlobalRef("", DYNAMIC_GLOBAL, "STACK_GLOBAL", start, GlobalClass.DANGEROUS))
                    dyn = frozenset({DYNAMIC_GLOBAL})
                    stack.append(Val(DYNAMIC_GLOBAL, dyn, dyn, 0))
            elif act == ACT_GLOBAL or act == ACT_INST:
                module, name = line_pair(arg, names[code], start)
                ref = record(walk, module, name, names[code], start)
                if act == ACT_INST:
                    if not marks:
                        raise Stop(f"INST at byte {start} without a MARK", start)
                    m = marks.pop()
                    args = stack[m:]
                    del stack[m:]
                    judge_call(walk, code, [ref, *args], start)
                    stack.append(combine(args))
                else:
                    stack.append(ref)
            elif act == ACT_DUP:
                if len(stack) - (marks[-1] if marks else 0) < 1:
                    raise Stop(f"stack underflow: DUP at byte {start}", start)
                stack.append(stack[-1])
            elif act == ACT_POP:
                if marks and marks[-1] == len(stack):
                    marks.pop()  # POP on an empty mark frame drops the MARK (as the C unpickler does)
                elif not stack:
                    raise Stop(f"stack underflow: POP at byte {start}", start)
                else:
                    stack.pop()
            elif act == ACT_EXT:
                ext = int.from_bytes(arg or b"", "little", signed=(code == 0x84))
                key = copyreg._inverted_registry.get(ext)  # type: ignore[attr-defined]
                if isinstance(key, tuple) and len(key) == 2:
                    stack.append(record(walk, str(key[0]), str(key[1]), names[code], start))
                else:
                    q = frozenset({f"copyreg.extension[{ext}]"})
                    add_ref(walk, GlobalRef("copyreg", f"extension[{ext}]", names[code], start, GlobalClass.UNKNOWN))
                    stack.append(Val(next(iter(q)), q, q, 0))
            elif act == ACT_PROTO:
                proto = arg[0] if arg else 0
                if proto > HIGHEST_PROTOCOL:
                    raise Stop(f"unsupported pickle protocol {proto} at byte {start}", start)
                if proto > walk.protocol:
                    walk.protocol = proto
            elif act == ACT_FRAME:
                n = int.from_bytes(arg or b"", "little")
                if src.base + pos + n > src.total:
                    raise length_claim("FRAME", start, n, src.total - src.base - pos, src.total)
            elif act == ACT_STOP:
                if len(stack) - (marks[-1] if marks else 0) < 1:
                    raise Stop(f"stack underflow: STOP at byte {start}", start)
                return pos
            if not ops & 1023 and len(stack) + len(marks) > max_stack:  # checked every 1024 ops: cheap, bounded
                raise Stop(f"more than {max_stack} stack entries (nesting or fan-out)", start, limit=True)
    finally:
        walk.ops = ops


def _strish(v: object) -> Val:
    """`v` (a call's result) as a tracked value that may be a str (`judge.makes_str`)."""
    out = v if isinstance(v, Val) else Val(None, EMPTY, EMPTY, depth_of(v))
    out.strish = True
    return out


def _made(v: object, hook: frozenset[str] | None) -> object:
    """`v` with its `hook` (`judge.hooked`) set, when it is a tracked value."""
    if v.__class__ is Val:
        v.hook = hook
    return v


def _push(walk: PickleWalk, stack: list[object], v: object, start: int, name: str) -> None:
    d = depth_of(v)
    if d > MAX_DEPTH:
        _deep(walk, d, start, name)
    stack.append(v)


def _deep(walk: PickleWalk, depth: int, start: int, name: str) -> None:
    """Note nesting beyond `MAX_DEPTH`. The walk goes on (its depth is a number, so the verdict is judged to the end
    of the pickle); the value is too deep for the unpickler to build (CPython hashes and frees nested tuples
    recursively in C), so the walk records a bound that keeps the unpickler away (`PickleWalk.deep`)."""
    if depth > walk.deepest:
        if walk.deepest <= MAX_DEPTH:
            walk.deep = f"nesting deeper than {MAX_DEPTH} at byte {start} ({name})"
        walk.deepest = depth
