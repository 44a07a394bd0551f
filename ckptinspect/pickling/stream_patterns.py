"""The byte patterns of the three records a DCP writer repeats per chunk (used by `stream_fast.py`).

Each record is one regular expression built piece by piece (`_Pattern`): every capturing group is named, every memo
GET is captured, and the `*_WANT` tables say what the named GETs must hold (a class, a field name, a builder).
"""

from __future__ import annotations

import operator
import re
from typing import Any

from ckptinspect.pickling.stream_eval import CHUNK as CHUNK_CLS, INDEX, STORAGE_INFO

_INT = (rb"(?:K.|M..|J....|\x8a\x01.|\x8a\x02..|\x8a\x03...|\x8a\x04....|\x8a\x05.....|\x8a\x06......"
        rb"|\x8a\x07.......|\x8a\x08........)")
# a tuple of ints, arity exact: TUPLE1/2/3 after 1/2/3 ints, or MARK ints TUPLE
_TUP = rb"(?:" + _INT + rb"\x85|" + _INT * 2 + rb"\x86|" + _INT * 3 + rb"\x87|\(" + _INT + rb"+t)"
_NEW = rb"\)\x81\x94\}\x94\("  # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK
_ASCII = rb"([\x00-\x7f]*?)\x94"  # an ASCII name up to the MEMOIZE after it (its length is checked after)


class _Pattern:
    """A record pattern built piece by piece: every capturing group gets a name, every GET is captured (its memo
    slot must exist before the record: checked for all of them, not only the ones whose value matters)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.index: dict[str, int] = {}
        self.gets: list[int] = []
        self.n = 0
        self._getters: dict[int, tuple[Any, list[Any], Any]] = {}

    def raw(self, b: bytes) -> _Pattern:
        self.parts.append(b)
        return self

    def get(self, name: str | None = None) -> _Pattern:
        self.parts.append(rb"(h.|j....)")
        self.gets.append(self.n)
        if name:
            self.index[name] = self.n
        self.n += 1
        return self

    def cap(self, name: str, pattern: bytes) -> _Pattern:
        self.parts.append(b"(" + pattern + b")")
        self.index[name] = self.n
        self.n += 1
        return self

    def size(self, name: str) -> _Pattern:
        """torch.Size(tuple): REDUCE(GET Size, (tuple,)), 3 MEMOIZEs."""
        return self.get(name + "_fn").cap(name, _TUP).raw(rb"\x94\x85\x94R\x94")

    def string(self, name: str) -> _Pattern:
        """SHORT_BINUNICODE of an ASCII name, MEMOIZE."""
        return self.raw(rb"\x8c").cap(name + "_len", b".").cap(name, rb"[\x00-\x7f]*?").raw(rb"\x94")

    def getters(self, want: dict[str, Any]) -> tuple[Any, list[Any], Any]:
        """(getter of the GETs named in `want`, their expectations, getter of the other GETs) for `m.groups()`."""
        key = id(want)
        hit = self._getters.get(key)
        if hit is None:
            names = [n for n in want if n in self.index]
            idx = [self.index[n] for n in names]
            rest = [i for i in self.gets if i not in idx]
            hit = (_itemgetter(idx), [want[n] for n in names], _itemgetter(rest))
            self._getters[key] = hit
        return hit

    def compile(self) -> re.Pattern[bytes]:
        return re.compile(b"".join(self.parts), re.DOTALL)


def _itemgetter(idx: list[int]) -> Any:
    """A getter that always returns a tuple (operator.itemgetter returns a bare item for one index)."""
    if not idx:
        return lambda g: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda g: (g[i],)
    return operator.itemgetter(*idx)


def _chunk_pattern(p: _Pattern, tag: str) -> _Pattern:
    return (p.get(tag + "cls").raw(_NEW).get(tag + "k_offsets").size(tag + "offsets").get(tag + "k_sizes")
            .size(tag + "sizes").raw(b"ub"))


CHUNK = _chunk_pattern(_Pattern(), "")
CHUNK_REC = CHUNK.compile()

def _index(p: _Pattern, tag: str, strings: bool) -> _Pattern:
    """MetadataIndex(fqn, offset, index): its state dict in either field order torch writes (`fqn, offset, index`,
    or `fqn, index[, offset]`), offset None or a torch.Size, index None or an int."""
    p.raw(b"(?:")
    for alt in ("a", "b"):
        p.get(f"k_fqn_{alt}").raw(b"(?:").get(f"fqn_{alt}").raw(b"|").string(f"fqn_s_{alt}").raw(b")")
        if alt == "a":
            p.get("k_offset_a").raw(b"(?:N|").size("offset_a").raw(b")")
        p.get(f"k_index_{alt}").raw(b"(?:N|" + _INT + b")")
        if alt == "b":
            p.raw(b"(?:").get("k_offset_b").raw(b"(?:N|").size("offset_b").raw(b"))?")
        p.raw(b"|" if alt == "a" else b")")
    return p


STORAGE = _Pattern()
_index(STORAGE.get("mi").raw(_NEW), "", True).raw(b"ub")
(STORAGE.get("si").raw(_NEW).get("k_path").raw(b"(?:").get("path").raw(b"|").string("path_s").raw(b")")
 .get("k_pos").cap("pos", _INT).get("k_len").cap("len", _INT).raw(b"ub"))
STORAGE_REC = STORAGE.compile()

PLAN = _Pattern()
_index(PLAN.get("wi").raw(_NEW).get("k_index").get("mi").raw(_NEW), "", False).raw(b"ub")
(PLAN.get("k_type").raw(b"(?:").get().raw(b"|").get("type_fn").raw(_INT)
 .cap("type_reduce", rb"\x85\x94R\x94").raw(b")").get("k_bytes").raw(b"(?:N|").get().raw(b")")
 .get("k_tensor").raw(b"(?:N|").get("twd").raw(_NEW).get("k_chunk").get().get("k_props").raw(b"(?:").get()
 .raw(b"|").get("props").cap("props_new", rb"\)\x81\x94\(").get().get().raw(rb"\x89").get()
 .raw(rb"\x89t\x94b)").get("k_size").raw(b"(?:").get().raw(b"|").size("size").raw(b")ub)ub"))
PLAN_REC = PLAN.compile()

WRITE_ITEM = "torch.distributed.checkpoint.planner.WriteItem"
_ANY_CLASS = object()
_ANY_KEY = object()

_CHUNK_WANT = {"cls": CHUNK_CLS, "k_offsets": "offsets", "offsets_fn": tuple, "k_sizes": "sizes", "sizes_fn": tuple}
_INDEX_WANT = {"k_fqn_a": "fqn", "k_offset_a": "offset", "offset_a_fn": tuple, "k_index_a": "index",
               "k_fqn_b": "fqn", "k_offset_b": "offset", "offset_b_fn": tuple, "k_index_b": "index"}
_STORAGE_WANT = {"mi": INDEX, **_INDEX_WANT, "si": STORAGE_INFO, "k_path": "relative_path", "k_pos": "offset",
                 "k_len": "length"}
_PLAN_WANT = {"wi": "torch.distributed.checkpoint.planner.WriteItem", "k_index": _ANY_KEY, "mi": _ANY_CLASS,
              "k_fqn_a": _ANY_KEY, "k_offset_a": _ANY_KEY, "offset_a_fn": tuple, "k_index_a": _ANY_KEY,
              "k_fqn_b": _ANY_KEY, "k_offset_b": _ANY_KEY, "offset_b_fn": tuple, "k_index_b": _ANY_KEY,
              "k_type": _ANY_KEY, "type_fn": int, "k_bytes": _ANY_KEY, "k_tensor": _ANY_KEY, "twd": _ANY_CLASS,
              "k_chunk": _ANY_KEY, "k_props": _ANY_KEY, "props": _ANY_CLASS, "k_size": _ANY_KEY, "size_fn": tuple}

