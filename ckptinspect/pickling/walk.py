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
  after the first `STOP`): walking resumes after `STOP` while the next bytes can start a pickle, up to the five a
  loader unpickles (`MAX_STREAM_PICKLES`); what does not walk through to a `STOP` after a complete pickle, and what
  follows the fifth, is trailing data, not an error;
- length claims beyond the data (`BINUNICODE8` of 100 GB): reported, never allocated;
- `STACK_GLOBAL` whose operands are not literal strings (a name computed at load time): reported as dangerous, since
  no allowlist can judge it;
- Python 2 names (`__builtin__.eval`): judged as the unpickler imports them (`_compat_pickle`, protocols < 3);
  a name dangerous as written stays dangerous.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import IO

from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.engine import (
    DYNAMIC_GLOBAL as DYNAMIC_GLOBAL,
    MAX_DEPTH as MAX_DEPTH,
    MAX_TRACKED_STR as MAX_TRACKED_STR,
    walk_segment,
)
from ckptinspect.pickling.walkstate import GlobalRef as GlobalRef, Source, Stop
from ckptinspect.pickling.report import VERDICT_RANK
from ckptinspect.pickling.opcodes import HIGHEST_PROTOCOL, VALID_OPCODES, PROTO_BYTE, STOP_BYTE

MAX_OPS = 50_000_000  # opcodes per pickle stream (all concatenated pickles together)
# Pickles back to back that any loader unpickles from one stream: torch's legacy (non-zip) loader reads five (magic
# number, protocol, sys_info, the object, the storage keys; `pickling/legacy_format.py`), `pickle.load` one. What
# follows the fifth is raw storage bytes no loader unpickles: walked as pickles, a storage that happens to start
# with an opcode byte (99 elements: b"c", GLOBAL) read as globals, and a benign file as unsafe.
MAX_STREAM_PICKLES = 5
MAX_STACK = 20_000_000  # stack entries + open MARKs

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
    unjudged: the bound hit was the scanner's own (op count, stack, nesting, memo, globals), not a length claim past
      the data: the rest of the stream was not judged, so the verdict fails closed (`unsafe`, CK605).
    deep: where the nesting first went beyond `engine.MAX_DEPTH`, or None; deepest: the deepest nesting seen. Such a
      pickle is judged to its end, and `limit` names the nesting (CK603): too deep for the unpickler to build.
    trailing: bytes after the last complete pickle that are not one (not walked, or not walkable to a STOP).
    trailing_problem: why those bytes did not walk as a pickle, when they started like one.
    called: globals the pickle CALLS that are not inert constructors (`callables.py`) → where ("REDUCE at byte 12").
    blobs: (offset, length, latin1) of byte strings inside that hold a pickle or a zip archive (offsets in the
      stream); latin1: a str (protocol 2's `_codecs.encode(s, 'latin1')`), UTF-8 encoded in the stream.
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
    unjudged: bool = False
    deep: str | None = None
    deepest: int = 0
    trailing: int = 0
    trailing_problem: str | None = None
    max_memo_index: int = -1
    called: dict[str, str] = field(default_factory=dict)
    blobs: list[tuple[int, int, bool]] = field(default_factory=list)
    _seen: set[tuple[str, str, GlobalClass]] = field(default_factory=set, repr=False)

    @property
    def globals(self) -> dict[str, GlobalClass]:
        """qualname → verdict (the worst verdict when one name was seen several times)."""
        out: dict[str, GlobalClass] = {}
        for r in self.refs:
            prev = out.get(r.qualname)
            if prev is None or VERDICT_RANK[r.verdict] > VERDICT_RANK[prev]:
                out[r.qualname] = r.verdict
        return out

    @property
    def dangerous(self) -> list[str]:
        return sorted(q for q, v in self.globals.items() if v is GlobalClass.DANGEROUS)

    @property
    def unknown(self) -> list[str]:
        return sorted(q for q, v in self.globals.items() if v is GlobalClass.UNKNOWN)

    @property
    def unsafe(self) -> bool:
        """The real loader would run code from this pickle: a dangerous global, or a call outside the inert
        constructors."""
        return bool(self.called) or any(r.verdict is GlobalClass.DANGEROUS for r in self.refs)

    @property
    def complete(self) -> bool:
        """True when the whole stream was walked (no malformation, no bound hit)."""
        return self.error is None and self.limit is None


def is_pickle_start(head: bytes) -> bool:
    """Whether `head` can start a pickle: a PROTO 0–5 header, or a valid protocol-0/1 opcode other than STOP."""
    if not head:
        return False
    if head[0] == PROTO_BYTE:
        return len(head) < 2 or head[1] <= HIGHEST_PROTOCOL
    return head[0] in VALID_OPCODES and head[0] != STOP_BYTE


# --- the walker ---------------------------------------------------------------------------------------------------


def walk_pickle(
    data: bytes | bytearray | memoryview, max_ops: int = MAX_OPS, max_stack: int = MAX_STACK
) -> PickleWalk:
    """Walk every pickle in `data` and return the globals they reference. Never raises for bad input.

    A walk is a pure function of the bytes: the same bytes walked again in this process (`audit` and `scan` of one
    checkpoint both walk every `.metadata` and every `data.pkl`) are answered from a small cache keyed by a digest of
    the bytes, as a copy the caller may change."""
    buf = data if isinstance(data, bytes) else bytes(data)
    key = (hashlib.blake2b(buf, digest_size=20).digest(), len(buf), max_ops, max_stack)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
    if hit is not None:
        return _copy(hit)
    walk = _walk(Source(buf), max_ops, max_stack)
    with _CACHE_LOCK:
        _CACHE[key] = _copy(walk)
        while len(_CACHE) > _CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return walk


_CACHE_ENTRIES = 256
_CACHE: OrderedDict[tuple[bytes, int, int, int], PickleWalk] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _copy(w: PickleWalk) -> PickleWalk:
    return dataclasses.replace(w, refs=list(w.refs), called=dict(w.called), blobs=list(w.blobs), _seen=set(w._seen))


def walk_stream(f: IO[bytes], length: int, max_ops: int = MAX_OPS, max_stack: int = MAX_STACK) -> PickleWalk:
    """`walk_pickle` over the next `length` bytes of the binary stream `f`, read in windows (bounded memory).
    Blob offsets are relative to the stream position at the call."""
    return _walk(Source(None, f, length), max_ops, max_stack)


def _walk(src: Source, max_ops: int, max_stack: int) -> PickleWalk:
    walk = PickleWalk()
    pos = 0
    if src.total == 0:
        walk.error, walk.error_offset = "empty: no pickle data", 0
        return walk
    while src.base + pos < src.total:
        if walk.segments >= MAX_STREAM_PICKLES:
            walk.trailing = src.total - src.base - pos
            break
        if walk.segments:
            try:
                if pos + 2 > len(src.buf):
                    pos = src.fill(pos, min(2, src.total - src.base - pos))
            except Stop:
                pass
            if not is_pickle_start(src.buf[pos : pos + 2]):
                walk.trailing = src.total - src.base - pos
                break
        walk.segments += 1
        start, memo_before = src.base + pos, walk.max_memo_index
        try:
            pos = walk_segment(src, pos, walk, max_ops, max_stack)
        except Stop as stop:
            if walk.segments > 1 and not stop.limit:
                # After a complete pickle, bytes that start like one but do not walk through are trailing data
                # (the raw storages after the pickles of a pre-1.6 `torch.save` file), not a broken pickle. What
                # globals they seemed to name (or call) stay recorded: the walker errs on the side of reporting.
                walk.segments -= 1
                walk.trailing, walk.trailing_problem = src.total - start, str(stop)
                walk.max_memo_index = memo_before
            else:
                if stop.limit:
                    walk.limit = str(stop)
                    walk.unjudged = not stop.claim
                else:
                    walk.error = str(stop)
                walk.error_offset = stop.offset
            break
    if walk.limit is None and walk.deep is not None:
        walk.limit = f"{walk.deep}, {walk.deepest} levels (judged to its end; too deep to unpickle)"
    if walk.limit is None and walk.max_memo_index > walk.ops:
        # A pickler never names a memo slot beyond the objects it memoized; CPython's unpickler allocates (and
        # zeroes) a memo array of twice the index, so `LONG_BINPUT 0x7fffffff` in 14 bytes costs it 32 GiB.
        walk.limit = (f"memo index {walk.max_memo_index} is beyond anything {walk.ops} opcodes can have memoized "
                      "(crafted to exhaust the unpickler's memory)")
    return walk
