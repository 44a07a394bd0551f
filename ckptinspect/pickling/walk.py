"""Opcode-level pickle scanner: which globals a pickle would import, found by walking its opcodes, never by loading.

`walk_pickle(data)` reads the opcode stream of one pickle (every protocol, 0–5) and records each global it would
resolve: `GLOBAL` / `INST` name them inline; `STACK_GLOBAL` takes them from the stack, so the walker keeps a model of
the stack and the memo in which only strings are tracked (`SHORT_BINUNICODE`/`BINUNICODE`/`UNICODE`/`STRING`... and
`MEMOIZE`/`PUT`/`GET`); `EXT1/2/4` name a global through the copyreg extension registry. Nothing is built, imported
or called: the walker only moves a cursor over the bytes, so its memory is bounded by the stack model (no value is
materialised except strings of at most `MAX_TRACKED_STR` characters) and it has no recursion (100,000 nested
`MARK`s are 100,000 integers in a list).

Tricks it handles:
- several pickles back to back in one stream (legacy `torch.save` files are a sequence of pickles; a payload can hide
  after the first `STOP`): walking resumes after `STOP` while the next bytes can start a pickle; what does not walk
  through to a `STOP` after a complete pickle is trailing data, not an error;
- length claims beyond the data (`BINUNICODE8` of 100 GB): reported, never allocated;
- `STACK_GLOBAL` whose operands are not literal strings (a name computed at load time): reported as dangerous, since
  no allowlist can judge it;
- Python 2 names (`__builtin__.eval`): judged as the unpickler imports them (`_compat_pickle`, protocols < 3);
  a name dangerous as written stays dangerous.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import copyreg
import functools
from dataclasses import dataclass, field

from ckptinspect.pickling.allowlist import GlobalClass, classify
from ckptinspect.pickling.opcodes import (  # the opcode table
    HIGHEST_PROTOCOL,
    VALID_OPCODES,
    _A_FIXED,
    _A_INVALID,
    _A_LEN,
    _A_LINE2,
    _A_NONE,
    _DUP,
    _EXT,
    _FRAME,
    _GENERIC,
    _GET,
    _GLOBAL,
    _INST,
    _MARK,
    _MEMOIZE,
    _POP,
    _PROTO,
    _PROTO_BYTE,
    _PUT,
    _STACK_GLOBAL,
    _STOP,
    _STOP_BYTE,
    _STR,
    _T,
    _TEXT_MEMO,
)

MAX_TRACKED_STR = 1024  # longer strings cannot be module/attribute names worth tracking: kept as opaque values
MAX_OPS = 50_000_000  # opcodes per pickle stream (all concatenated pickles together)
MAX_STACK = 20_000_000  # stack entries + open MARKs

# Qualified name recorded for a STACK_GLOBAL whose module/name were not literal strings.
DYNAMIC_GLOBAL = "<dynamic STACK_GLOBAL>"

_VERDICT_RANK = {GlobalClass.ALLOWED: 0, GlobalClass.UNKNOWN: 1, GlobalClass.DANGEROUS: 2}


class _Other:
    """A stack value the walker does not track (a number, a list, a call result...)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<other>"


_OTHER = _Other()


@dataclass(frozen=True, slots=True)
class GlobalRef:
    """One global a pickle references: where (byte offset of the opcode) and through which opcode."""

    module: str
    name: str
    opcode: str
    offset: int
    verdict: GlobalClass

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


@dataclass(slots=True)
class PickleWalk:
    """What walking one pickle stream found.

    refs: every global reference, in stream order (first occurrence of each qualname kept).
    segments: number of pickles walked (more than 1 when several are concatenated).
    ops: opcodes read.
    protocol: highest protocol announced by a PROTO opcode (0 when none).
    error: why walking stopped early on malformed input (truncated, invalid opcode, stack underflow), or None.
    error_offset: byte offset of that problem.
    limit: a resource bound that was hit (huge length claim, op count, stack size), or None.
    trailing: bytes after the last complete pickle that are not one (not walked, or not walkable to a STOP).
    trailing_problem: why those bytes did not walk as a pickle, when they started like one.
    max_memo_index: the largest index a PUT / BINPUT / LONG_BINPUT names (-1 when none). A real pickler never
      writes one beyond the number of memoized objects; CPython's unpickler sizes its memo array to twice it.
    """

    refs: list[GlobalRef] = field(default_factory=list)
    segments: int = 0
    ops: int = 0
    protocol: int = 0
    error: str | None = None
    error_offset: int | None = None
    limit: str | None = None
    trailing: int = 0
    trailing_problem: str | None = None
    max_memo_index: int = -1
    _seen: set[tuple[str, str, GlobalClass]] = field(default_factory=set, repr=False)

    @property
    def globals(self) -> dict[str, GlobalClass]:
        """qualname → verdict (the worst verdict when one name was seen several times)."""
        out: dict[str, GlobalClass] = {}
        for r in self.refs:
            prev = out.get(r.qualname)
            if prev is None or _VERDICT_RANK[r.verdict] > _VERDICT_RANK[prev]:
                out[r.qualname] = r.verdict
        return out

    @property
    def dangerous(self) -> list[str]:
        return sorted(q for q, v in self.globals.items() if v is GlobalClass.DANGEROUS)

    @property
    def unknown(self) -> list[str]:
        return sorted(q for q, v in self.globals.items() if v is GlobalClass.UNKNOWN)

    @property
    def complete(self) -> bool:
        """True when the whole stream was walked (no malformation, no bound hit)."""
        return self.error is None and self.limit is None


class _Stop(Exception):
    """Internal: the current segment cannot be walked further."""

    def __init__(self, message: str, offset: int, limit: bool = False) -> None:
        super().__init__(message)
        self.offset = offset
        self.limit = limit


def is_pickle_start(head: bytes) -> bool:
    """Whether `head` can start a pickle: a PROTO 0–5 header, or a valid protocol-0/1 opcode other than STOP."""
    if not head:
        return False
    if head[0] == _PROTO_BYTE:
        return len(head) < 2 or head[1] <= HIGHEST_PROTOCOL
    return head[0] in VALID_OPCODES and head[0] != _STOP_BYTE


# --- the walker ---------------------------------------------------------------------------------------------------


def walk_pickle(
    data: bytes | bytearray | memoryview, max_ops: int = MAX_OPS, max_stack: int = MAX_STACK
) -> PickleWalk:
    """Walk every pickle in `data` and return the globals they reference. Never raises for bad input."""
    buf = data if isinstance(data, bytes) else bytes(data)
    walk = PickleWalk()
    pos = 0
    end = len(buf)
    if end == 0:
        walk.error, walk.error_offset = "empty: no pickle data", 0
        return walk
    while pos < end:
        if walk.segments and not is_pickle_start(buf[pos : pos + 2]):
            walk.trailing = end - pos
            break
        walk.segments += 1
        start, memo_before = pos, walk.max_memo_index
        try:
            pos = _walk_segment(buf, pos, walk, max_ops, max_stack)
        except _Stop as stop:
            if walk.segments > 1:
                # After a complete pickle, bytes that start like one but do not walk through are trailing data
                # (the raw storages after the pickles of a pre-1.6 `torch.save` file), not a broken pickle. What
                # globals they seemed to name stay recorded: the walker errs on the side of reporting.
                walk.segments -= 1
                walk.trailing, walk.trailing_problem = end - start, str(stop)
                walk.max_memo_index = memo_before
            else:
                if stop.limit:
                    walk.limit = str(stop)
                else:
                    walk.error = str(stop)
                walk.error_offset = stop.offset
            break
    if walk.limit is None and walk.max_memo_index > walk.ops:
        # A pickler never names a memo slot beyond the objects it memoized; CPython's unpickler allocates (and
        # zeroes) a memo array of twice the index, so `LONG_BINPUT 0x7fffffff` in 14 bytes costs it 32 GiB.
        walk.limit = (f"memo index {walk.max_memo_index} is beyond anything {walk.ops} opcodes can have memoized "
                      "(crafted to exhaust the unpickler's memory)")
    return walk


def _walk_segment(buf: bytes, pos: int, walk: PickleWalk, max_ops: int, max_stack: int) -> int:
    """Walk one pickle starting at `pos`; return the offset after its STOP. Raises `_Stop`."""
    end = len(buf)
    stack: list[object] = []
    marks: list[int] = []
    # The memo: filled slots are [0, prefix) plus `sparse`; their count is where MEMOIZE stores (C `memo_len`,
    # pickle.py `len(memo)`), which is not the number of MEMOIZEs once PUT is mixed in. Modelled exactly, or a
    # crafted pickle could make a later GET feed STACK_GLOBAL a string the walker did not expect. Only string
    # values are kept.
    prefix = 0
    sparse: set[int] = set()
    strings: dict[int, str] = {}
    textmemo = _TEXT_MEMO
    proto = 0
    t = _T
    names, argk, asize, asigned, acts = t.names, t.argk, t.asize, t.asigned, t.act
    markp, popsp, pushesp = t.mark, t.pops, t.pushes
    ops = walk.ops
    other = _OTHER
    try:
        while True:
            if pos >= end:
                raise _Stop(f"truncated: pickle ends at byte {end} without STOP", end)
            code = buf[pos]
            ak = argk[code]
            if ak == _A_INVALID:
                raise _Stop(f"invalid opcode 0x{code:02x} at byte {pos}", pos)
            ops += 1
            if ops > max_ops:
                raise _Stop(f"more than {max_ops} opcodes", pos, limit=True)
            start = pos
            pos += 1
            act = acts[code]
            # 1. the argument (sliced only when the action needs it)
            arg: bytes | None = None
            if ak == _A_NONE:
                pass
            elif ak == _A_FIXED:
                n = asize[code]
                if pos + n > end:
                    raise _Stop(f"truncated: {names[code]} at byte {start} needs {n} argument bytes", start)
                if act != _GENERIC:
                    arg = buf[pos : pos + n]
                pos += n
            elif ak == _A_LEN:
                h = asize[code]
                if pos + h > end:
                    raise _Stop(f"truncated: {names[code]} at byte {start} has no length field", start)
                n = int.from_bytes(buf[pos : pos + h], "little", signed=asigned[code])
                pos += h
                if n < 0:
                    raise _Stop(f"{names[code]} at byte {start} has a negative length {n}", start)
                if pos + n > end:
                    raise _length_claim(names[code], start, n, end - pos, end)
                if act == _STR and n <= MAX_TRACKED_STR:
                    arg = buf[pos : pos + n]
                pos += n
            else:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    raise _Stop(f"truncated: {names[code]} at byte {start} has no end of line", start)
                if ak == _A_LINE2:
                    nl2 = buf.find(b"\n", nl + 1)
                    if nl2 < 0:
                        raise _Stop(f"truncated: {names[code]} at byte {start} has no second line", start)
                    arg = buf[pos:nl2]
                    pos = nl2 + 1
                else:
                    if act != _GENERIC and nl - pos <= MAX_TRACKED_STR + 2:
                        arg = buf[pos:nl]
                    pos = nl + 1

            # 2. the effect on the stack / memo model
            if act == _GENERIC:
                if markp[code]:
                    if not marks:
                        raise _Stop(f"{names[code]} at byte {start} without a MARK", start)
                    del stack[marks.pop() :]
                n = popsp[code]
                if n:
                    if len(stack) - (marks[-1] if marks else 0) < n:
                        raise _Stop(f"stack underflow: {names[code]} at byte {start}", start)
                    del stack[-n:]
                if pushesp[code]:
                    stack.append(other)
            elif act == _MEMOIZE:
                if len(stack) <= (marks[-1] if marks else 0):
                    raise _Stop(f"stack underflow: MEMOIZE at byte {start}", start)
                top = stack[-1]
                if sparse:
                    idx = prefix + len(sparse)  # > prefix: a new sparse slot, or an overwrite of one
                    sparse.add(idx)
                    if top.__class__ is str:
                        strings[idx] = top
                    else:
                        strings.pop(idx, None)
                else:
                    if top.__class__ is str:
                        strings[prefix] = top
                    prefix += 1
            elif act == _STR:
                value = _decode_str(code, arg)
                if value is None:
                    raise _Stop(f"STRING argument at byte {start} is not quoted", start)
                stack.append(value)
            elif act == _GET:
                if arg is None:
                    raise _Stop(f"oversized memo index at byte {start}", start)
                idx = _text_index(arg, start) if code in textmemo else int.from_bytes(arg, "little")
                stack.append(strings.get(idx, other))
            elif act == _MARK:
                marks.append(len(stack))
            elif act == _PUT:
                if len(stack) <= (marks[-1] if marks else 0):
                    raise _Stop(f"stack underflow: {names[code]} at byte {start}", start)
                if arg is None:
                    raise _Stop(f"oversized memo index at byte {start}", start)
                idx = _text_index(arg, start) if code in textmemo else int.from_bytes(arg, "little")
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
                top = stack[-1]
                if top.__class__ is str:
                    strings[idx] = top
                else:
                    strings.pop(idx, None)
            elif act == _STACK_GLOBAL:
                if len(stack) - (marks[-1] if marks else 0) < 2:
                    raise _Stop(f"stack underflow: STACK_GLOBAL at byte {start}", start)
                name_v = stack.pop()
                module_v = stack.pop()
                if isinstance(module_v, str) and isinstance(name_v, str):
                    _record(walk, module_v, name_v, "STACK_GLOBAL", start, proto)
                else:
                    _add(walk, GlobalRef("", DYNAMIC_GLOBAL, "STACK_GLOBAL", start, GlobalClass.DANGEROUS))
                stack.append(other)
            elif act == _GLOBAL or act == _INST:
                module, name = _line_pair(arg, names[code], start)
                _record(walk, module, name, names[code], start, proto)
                if act == _INST:
                    if not marks:
                        raise _Stop(f"INST at byte {start} without a MARK", start)
                    del stack[marks.pop() :]
                stack.append(other)
            elif act == _DUP:
                if len(stack) - (marks[-1] if marks else 0) < 1:
                    raise _Stop(f"stack underflow: DUP at byte {start}", start)
                stack.append(stack[-1])
            elif act == _POP:
                if marks and marks[-1] == len(stack):
                    marks.pop()  # POP on an empty mark frame drops the MARK (as the C unpickler does)
                elif not stack:
                    raise _Stop(f"stack underflow: POP at byte {start}", start)
                else:
                    stack.pop()
            elif act == _EXT:
                ext = int.from_bytes(arg or b"", "little", signed=(code == 0x84))
                key = copyreg._inverted_registry.get(ext)  # type: ignore[attr-defined]
                if isinstance(key, tuple) and len(key) == 2:
                    _record(walk, str(key[0]), str(key[1]), names[code], start, proto)
                else:
                    _add(walk, GlobalRef("copyreg", f"extension[{ext}]", names[code], start, GlobalClass.UNKNOWN))
                stack.append(other)
            elif act == _PROTO:
                proto = arg[0] if arg else 0
                if proto > HIGHEST_PROTOCOL:
                    raise _Stop(f"unsupported pickle protocol {proto} at byte {start}", start)
                if proto > walk.protocol:
                    walk.protocol = proto
            elif act == _FRAME:
                n = int.from_bytes(arg or b"", "little")
                if pos + n > end:
                    raise _length_claim("FRAME", start, n, end - pos, end)
            elif act == _STOP:
                if len(stack) - (marks[-1] if marks else 0) < 1:
                    raise _Stop(f"stack underflow: STOP at byte {start}", start)
                return pos
            if not ops & 1023 and len(stack) + len(marks) > max_stack:  # checked every 1024 ops: cheap, bounded
                raise _Stop(f"more than {max_stack} stack entries (nesting or fan-out)", start, limit=True)
    finally:
        walk.ops = ops


def _length_claim(name: str, offset: int, claimed: int, remaining: int, total: int) -> _Stop:
    """A length field pointing past the data: a resource-bound violation when the claim is absurd for the stream
    (beyond 4 GiB or 16× the whole pickle), otherwise plain truncation."""
    if claimed > (1 << 32) or claimed > 16 * total:
        return _Stop(f"{name} at byte {offset} claims {claimed} bytes, only {remaining} remain", offset, limit=True)
    return _Stop(f"truncated: {name} at byte {offset} claims {claimed} bytes, only {remaining} remain", offset)


def _text_index(arg: bytes, offset: int) -> int:
    """The memo index of a protocol-0 PUT / GET (a decimal line)."""
    try:
        return int(arg.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as e:
        raise _Stop(f"bad memo index {arg[:20]!r} at byte {offset}", offset) from e


_S, _V, _T_OP, _U = ord("S"), ord("V"), ord("T"), ord("U")


def _decode_str(code: int, raw: bytes | None) -> object:
    """The str a string opcode pushes (as the unpickler decodes it), `_OTHER` when too long / undecodable, None for
    a protocol-0 STRING that is not quoted (the unpickler rejects it)."""
    if raw is None:
        return _OTHER
    try:
        if code == _S:
            # STRING: a repr-quoted line, escape-decoded (pickle.py load_string).
            if len(raw) < 2 or raw[0] != raw[-1] or raw[:1] not in (b"'", b'"'):
                return None
            value = codecs.escape_decode(raw[1:-1])[0].decode("utf-8")
        elif code == _V:
            value = raw.decode("raw-unicode-escape")
        elif code == _T_OP or code == _U:
            value = raw.decode("utf-8")
        else:
            value = raw.decode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, ValueError):
        return _OTHER
    return value if len(value) <= MAX_TRACKED_STR else _OTHER


def _line_pair(arg: bytes | None, name: str, offset: int) -> tuple[str, str]:
    if arg is None or b"\n" not in arg:
        raise _Stop(f"{name} at byte {offset} lacks module/name lines", offset)
    module_b, name_b = arg.split(b"\n", 1)
    return module_b.decode("utf-8", "replace"), name_b.decode("utf-8", "replace")


def _record(walk: PickleWalk, module: str, name: str, opcode: str, offset: int, proto: int) -> None:
    _add(walk, GlobalRef(module, name, opcode, offset, _verdict(module, name, proto < 3)))


@functools.lru_cache(maxsize=4096)
def _verdict(module: str, name: str, py2_names: bool) -> GlobalClass:
    verdict = classify(module, name)
    if py2_names and verdict is not GlobalClass.DANGEROUS:
        # For protocols < 3 the unpickler imports the Python 3 name (`fix_imports`, `_compat_pickle`):
        # `__builtin__.eval` is `builtins.eval`. Judge what it would import.
        mapped = _compat_pickle.NAME_MAPPING.get((module, name))
        if mapped is None and module in _compat_pickle.IMPORT_MAPPING:
            mapped = (_compat_pickle.IMPORT_MAPPING[module], name)
        if mapped is not None:
            verdict = classify(*mapped)
    return verdict


def _add(walk: PickleWalk, ref: GlobalRef) -> None:
    key = (ref.module, ref.name, ref.verdict)
    if key not in walk._seen:
        walk._seen.add(key)
        walk.refs.append(ref)
