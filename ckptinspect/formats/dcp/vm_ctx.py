"""Per-walk state of the batch paths (`vm_fast.py`): memo values seen, GETs verified, specialised patterns."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ckptinspect.formats.dcp.vm_eval import OPAQUE, Global
from ckptinspect.formats.dcp.vm_patterns import ANY_CLASS, ANY_KEY, ANY_VALUE, Pattern

if TYPE_CHECKING:
    from ckptinspect.formats.dcp.vm_walk import Walker

MAX_LITERALS = 64  # GETs a specialised pattern may list; beyond, runs use the generic (slower) one


class Ctx:
    """Per-walk caches: GET values, and the verdict on each combination of the GETs a pattern checks (a record's
    class, field names and builders are the same few memo slots over and over)."""

    def __init__(self, w: Walker) -> None:
        self.w = w
        self.values: dict[bytes, Any] = {}
        self.good: dict[tuple[int, int], set[bytes]] = {}
        # per pattern: the GETs its specialised run pattern lists, and that pattern with its columns
        self.literals: dict[int, dict[int, set[bytes]]] = {}
        self.special: dict[int, tuple[re.Pattern[bytes], dict[int, int]]] = {}
        self.version = w.memo.version
        self.dirty = False  # a fast path began to change the walk's state (its Fallback then ends the walk)
        # boundary GETs verified (`vm_bounds.read_bounds`): (name, GET), and (pattern id, all its GETs) per combination
        self.bound_good: set[tuple[object, object]] = set()

    def value(self, raw: bytes) -> Any:
        v = self.values.get(raw, _MISS)
        if v is _MISS:
            idx = raw[1] if len(raw) == 2 else int.from_bytes(raw[1:], "little")
            v = self.w.memo.get(idx)
            if len(self.values) < 4096:
                self.values[raw] = v
        return v

    def sync(self) -> None:
        if self.version != self.w.memo.version:  # a memo slot was overwritten (PUT): forget what was seen
            self.values.clear()
            self.good.clear()
            self.literals.clear()
            self.special.clear()
            self.bound_good.clear()
            self.version = self.w.memo.version

    def learn(self, pat: Pattern, rec: re.Pattern[bytes], want: dict[str, Any], buf: bytes, pos: int) -> bool:
        """Specialise `pat` to the record at `pos` (see `Pattern.specialize`): its GETs that are not `vary` must
        hold what the loop needs (as `gets_ok` checks them) and name slots filled before it. False when there is
        no such record here (the loop reads on)."""
        from ckptinspect.formats.dcp import vm_batch as B

        m = rec.match(buf, pos)
        if m is None:
            return False
        g = m.groups()
        n0 = self.w.memo.n
        lits = self.literals.setdefault(id(pat), {i: set() for i in pat.gets if i not in pat.vary})
        new = []
        for i, name in pat.gets_named():
            raw = g[i]
            if i not in lits or raw is None or raw in lits[i]:
                continue
            expect = want.get(name, _MISS)
            if B.slot(raw) >= n0 or (expect is not _MISS and not self._verify((raw,), [expect], n0)):
                return False
            new.append((i, raw))
        if new and sum(map(len, lits.values())) + len(new) <= MAX_LITERALS:
            for i, raw in new:
                lits[i].add(raw)
            self.special[id(pat)] = pat.specialize(lits)
        return True

    def gets_ok(self, cols: list[Any], at: dict[int, int], pat: Pattern, want: dict[str, Any], base: Any,
                n0: int, own: frozenset[str] = frozenset()) -> Any:
        """Per record: every GET names a slot filled before the record (`base`: its first memo slot); the named
        ones a slot filled before the run (`n0`) that holds what the loop needs there: a `Global` of that name
        (str want starting with 'torch.'), that very string, or that builder. The GETs already seen to pass are
        kept per column (`good`: a record repeats the same few), so a run costs a set difference per
        column, not a step per record. `own`: GETs of any value whose slots the caller checks itself."""
        import numpy as np

        from ckptinspect.formats.dcp import vm_batch as B

        ok = np.ones(len(base), dtype=bool)
        free = []  # GETs of any value: only their slots are checked, all columns in one numpy pass
        for i, name in pat.gets_named():
            if i not in at:  # a literal of the specialised pattern
                continue
            col = cols[at[i]]
            expect = want.get(name, _MISS)
            if expect is _MISS:
                if name not in own and any(col):  # absent in every record (b""): nothing to check
                    free.append(col)
                continue
            new = set(col)
            new.discard(b"")
            good = self.good.setdefault((id(pat), i), set())
            new -= good
            bad = set()
            for raw in new:
                if B.slot(raw) < n0 and self._verify((raw,), [expect], n0):
                    good.add(raw)
                else:
                    bad.add(raw)
            if bad:
                ok &= ~B.rows_with(col, bad)
        if free:
            idx = B.get_slots_many(free).max(axis=0)
            if idx.max(initial=-1) >= n0:  # a slot filled inside the run: by an earlier record?
                ok &= idx < base
        return ok

    def verify(self, raw: bytes, expect: Any, lim: int) -> bool:
        """One GET holds what `expect` says (as `gets_ok` checks a named GET)."""
        return self._verify((raw,), [expect], lim)

    def _verify(self, named: tuple[Any, ...], expects: list[Any], lim: int) -> bool:
        for raw, expect in zip(named, expects):
            if raw is None:
                continue
            if len(raw) == 5 and int.from_bytes(raw[1:], "little") >= lim:
                return False
            v = self.value(raw)
            if expect is ANY_CLASS:
                if v.__class__ is not Global or v.plan:
                    return False
            elif expect is ANY_KEY:
                if type(v) is not str:
                    return False
            elif expect is ANY_VALUE:
                if v is OPAQUE:
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
