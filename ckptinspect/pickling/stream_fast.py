"""Fast paths of the streaming `.metadata` reader: the three records a DCP writer repeats per chunk, matched as bytes.

`pickle.dump` writes every ChunkStorageMetadata, every `storage_data` entry (MetadataIndex → _StorageInfo) and every
plan WriteItem with the same opcodes; only memo indices, integers and names change. Each is one compiled regular
expression over the raw bytes (C speed): a match is exactly what the opcode loop would parse at that position (every
alternative starts with a distinct opcode byte, every argument has its exact length), and it contains no opcode that
names a global (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*): globals are only ever resolved — and judged — by the opcode
loop. The memo values a record refers to (its class, field names, `torch.Size`) are checked like the loop checks
them; a record that does not check out is left to the loop. The effect on stack and memo is the loop's: memo slots
advance by the record's MEMOIZE count (strings kept where the loop keeps them), and a run of records leaves one
marker on the stack (`Rows`, `StoragePairs`) whose consumption is accounted: a marker that is not consumed by the
list append / dict update the writer follows it with makes the walk fall back (`Walker.markers_ok`).

Fast paths run only past the first `LOW_MEMO` memo slots (there the loop keeps every value, which a skipped slot
would not reproduce), so small files are read entirely by the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptinspect.pickling.stream_eval import (
    CHUNK as CHUNK_CLS,
    INDEX,
    LOW_MEMO,
    Fallback,
    Global,
    Rows,
    StoragePairs,
)
from ckptinspect.pickling.stream_patterns import (
    _ANY_CLASS,
    _ANY_KEY,
    _CHUNK_WANT,
    _PLAN_WANT,
    _STORAGE_WANT,
    CHUNK,
    CHUNK_REC,
    PLAN,
    PLAN_REC,
    STORAGE,
    STORAGE_REC,
    WRITE_ITEM,
    _Pattern,
)

if TYPE_CHECKING:
    from ckptinspect.pickling.stream_walk import Walker


def _ints(b: bytes) -> list[int]:
    """The ints of a matched `_TUP` / `_INT` (the opcodes are known to be well formed)."""
    out = []
    i, n = 0, len(b)
    while i < n:
        c = b[i]
        if c == 0x4B:
            out.append(b[i + 1])
            i += 2
        elif c == 0x4D:
            out.append(b[i + 1] | b[i + 2] << 8)
            i += 3
        elif c == 0x4A:
            out.append(int.from_bytes(b[i + 1:i + 5], "little", signed=True))
            i += 5
        elif c == 0x8A:
            k = b[i + 1]
            out.append(int.from_bytes(b[i + 2:i + 2 + k], "little", signed=True))
            i += 2 + k
        else:  # MARK / TUPLEn of the tuple
            i += 1
    return out


class _Ctx:
    """Per-walk caches: GET values, and the verdict on each combination of the GETs a pattern checks (a record's
    class, field names and builders are the same few memo slots over and over)."""

    def __init__(self, w: Walker) -> None:
        self.w = w
        self.values: dict[bytes, Any] = {}
        self.verdicts: dict[tuple[Any, ...], bool] = {}
        self.version = w.memo.version

    def value(self, raw: bytes) -> Any:
        v = self.values.get(raw, _MISS)
        if v is _MISS:
            idx = raw[1] if len(raw) == 2 else int.from_bytes(raw[1:], "little")
            v = self.w.memo.get(idx)
            if len(self.values) < 4096:
                self.values[raw] = v
        return v

    def check(self, g: tuple[Any, ...], pat: _Pattern, lim: int, want: dict[str, Any]) -> bool:
        """Every GET names a slot filled before the record; the named ones hold what the loop needs there:
        a `Global` of that name (str want starting with 'torch.'), that very string, or that builder."""
        if self.version != self.w.memo.version:  # a memo slot was overwritten (PUT): forget what was seen
            self.values.clear()
            self.verdicts.clear()
            self.version = self.w.memo.version
        getter, names, rest = pat.getters(want)
        named = getter(g)
        ok = self.verdicts.get(named)
        if ok is None:
            ok = self._verify(named, names, lim)
            if len(self.verdicts) < 4096:
                self.verdicts[named] = ok
        if not ok:
            return False
        for raw in rest(g):
            if raw is not None and len(raw) == 5 and int.from_bytes(raw[1:], "little") >= lim:
                return False
        return True

    def _verify(self, named: tuple[Any, ...], expects: list[Any], lim: int) -> bool:
        for raw, expect in zip(named, expects):
            if raw is None:
                continue
            if len(raw) == 5 and int.from_bytes(raw[1:], "little") >= lim:
                return False
            v = self.value(raw)
            if expect is _ANY_CLASS:
                if v.__class__ is not Global or v.plan:
                    return False
            elif expect is _ANY_KEY:
                if type(v) is not str:
                    return False
            elif type(expect) is str and expect.startswith("torch."):
                if v.__class__ is not Global or v.qual != expect:
                    return False
            elif type(expect) is str:
                if v != expect or type(v) is not str:
                    return False
            elif v is not expect:
                return False
        return True


_MISS = object()

def install_fast_paths(w: Walker) -> None:
    ctx = _Ctx(w)

    def fast(buf: bytes, pos: int, w: Walker = w) -> int:
        """At a GET: when it names the class of a repeated record and EMPTY_TUPLE NEWOBJ follow, read the run."""
        if w.memo.n < LOW_MEMO:
            return -1
        k = 2 if buf[pos] == 0x68 else 5
        if pos + k >= len(buf) or buf[pos + k] != 0x29:
            return -1
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
            return -1

    w.fast[0x68] = fast
    w.fast[0x6A] = fast


def _after_frames(buf: bytes, p: int) -> int:
    while p + 9 <= len(buf) and buf[p] == 0x95:
        p += 9
    return p


def _chunks(ctx: _Ctx, buf: bytes, pos: int) -> int:
    w = ctx.w
    sink = w.sink
    offs: list[int] = []
    sizes: list[int] = []
    nds: list[int] = []
    p = pos
    lim = w.memo.n
    match = CHUNK_REC.match
    ix = CHUNK.index
    i_off, i_size = ix["offsets"], ix["sizes"]
    while True:
        m = match(buf, p)
        if m is None:
            break
        g = m.groups()
        if not ctx.check(g, CHUNK, lim, _CHUNK_WANT):
            break
        o, s = _ints(g[i_off]), _ints(g[i_size])
        if len(o) != len(s):
            break
        offs.extend(o)
        sizes.extend(s)
        nds.append(len(o))
        lim += 8
        p = _after_frames(buf, m.end())
    n = len(nds)
    if not n:
        return -1
    start = len(sink.c_nd)
    sink.c_nd.extend(nds)
    sink.c_off.extend(offs)
    sink.c_size.extend(sizes)
    w.memo.skip(8 * n)
    w.stack.append(Rows(start, n))
    w.rows_pushed += n
    return p


def _storage(ctx: _Ctx, buf: bytes, pos: int) -> int:
    w = ctx.w
    sink, memo = w.sink, w.memo
    p = pos
    n = 0
    match = STORAGE_REC.match
    ix = STORAGE.index
    i_path, i_path_s, i_path_len = ix["path"], ix["path_s"], ix["path_s_len"]
    i_pos, i_len = ix["pos"], ix["len"]
    alt_a = [ix[n] for n in ("k_fqn_a", "fqn_a", "fqn_s_a", "fqn_s_a_len", "offset_a")]
    alt_b = [ix[n] for n in ("k_fqn_b", "fqn_b", "fqn_s_b", "fqn_s_b_len", "offset_b")]
    while True:
        m = match(buf, p)
        if m is None:
            break
        g = m.groups()
        if not ctx.check(g, STORAGE, memo.n, _STORAGE_WANT):
            break
        _, i_fqn, i_fqn_s, i_fqn_len, i_off = alt_a if g[alt_a[0]] is not None else alt_b
        if g[i_fqn] is not None:
            fqn = ctx.value(g[i_fqn])
            if type(fqn) is not str:
                break
        elif len(g[i_fqn_s]) != g[i_fqn_len][0]:
            break
        else:
            fqn = sink.intern(g[i_fqn_s].decode("ascii"))
        if g[i_path] is not None:
            path = ctx.value(g[i_path])
            if type(path) is not str:
                break
        elif len(g[i_path_s]) != g[i_path_len][0]:
            break
        else:
            path = sink.intern(g[i_path_s].decode("ascii"))
        # memo: MI object, dict, [fqn], [tuple, args, Size], SI object, dict, [path]
        memo.skip(2)
        if g[i_fqn] is None:
            memo.push(fqn)
        memo.skip(5 if g[i_off] is not None else 2)
        if g[i_path] is None:
            memo.push(path)
        sink.s_fqn.append(fqn)
        if g[i_off] is None:
            sink.s_nd.append(-1)
        else:
            o = _ints(g[i_off])
            sink.s_nd.append(len(o))
            sink.s_off.extend(o)
        sink.s_file.append(sink.file_id(path))
        sink.s_pos.append(_ints(g[i_pos])[0])
        sink.s_len.append(_ints(g[i_len])[0])
        n += 1
        p = _after_frames(buf, m.end())
    if not n:
        return -1
    w.stack.append(StoragePairs(n))
    w.pairs_pushed += n
    return p


def _plans(ctx: _Ctx, buf: bytes, pos: int) -> int:
    w = ctx.w
    memo = w.memo
    p = pos
    n = 0
    match = PLAN_REC.match
    ix = PLAN.index
    i_type = ix["type_reduce"]
    alt_a = [ix[n] for n in ("k_fqn_a", "fqn_s_a", "fqn_s_a_len", "offset_a")]
    alt_b = [ix[n] for n in ("k_fqn_b", "fqn_s_b", "fqn_s_b_len", "offset_b")]
    i_twd, i_props, i_size = ix["twd"], ix["props_new"], ix["size"]
    while True:
        m = match(buf, p)
        if m is None:
            break
        g = m.groups()
        if not ctx.check(g, PLAN, memo.n, _PLAN_WANT):
            break
        _, i_fqn_s, i_fqn_len, i_off = alt_a if g[alt_a[0]] is not None else alt_b
        if g[i_fqn_s] is not None and len(g[i_fqn_s]) != g[i_fqn_len][0]:
            break
        # MEMOIZEs: WI object, dict, MI object, dict, [fqn], [offset Size: 3], [type REDUCE: 2],
        # [TWD object, dict, [props object, state], [size: 3]]
        count = 4 + (g[i_fqn_s] is not None) + 3 * (g[i_off] is not None) + 2 * (g[i_type] is not None)
        if g[i_twd] is not None:
            count += 2 + 2 * (g[i_props] is not None) + 3 * (g[i_size] is not None)
        memo.skip(count)  # plans: strings not kept either (a STACK_GLOBAL naming one falls back)
        n += 1
        p = _after_frames(buf, m.end())
    if not n:
        return -1
    w.stack.append(Rows(-1, n))  # plan items: only their number matters
    w.rows_pushed += n
    return p
