"""The byte patterns of the three records a DCP writer repeats per chunk (used by `vm_fast.py`).

Each record is one regular expression built piece by piece (`Pattern`): every capturing group is named, every memo
GET is captured, and the `*_WANT` tables say what the named GETs must hold (a class, a field name, a builder).
"""

from __future__ import annotations

import re
from typing import Any

from ckptinspect.formats.dcp.names import CHUNK as CHUNK_CLS, INDEX, PROPS, SAVE_PLAN, STORAGE_INFO, TSM, WRITE_ITEM

_INT = (rb"(?:K.|M..|J....|\x8a\x01.|\x8a\x02..|\x8a\x03...|\x8a\x04....|\x8a\x05.....|\x8a\x06......"
        rb"|\x8a\x07.......|\x8a\x08........)")
# a tuple of ints, arity exact: TUPLE1/2/3 after 1/2/3 ints, or MARK ints TUPLE
_TUP = rb"(?:" + _INT + rb"\x85|" + _INT * 2 + rb"\x86|" + _INT * 3 + rb"\x87|\(" + _INT + rb"+t)"
_NEW = rb"\)\x81\x94\}\x94\("  # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK
_NAME = rb"[^\x94]*"  # a spelled name up to its MEMOIZE (`Pattern.string`)


class Pattern:
    """A record pattern built piece by piece: every capturing group gets a name, every GET is captured (its memo
    slot must exist before the record: checked for all of them, not only the ones whose value matters)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.index: dict[str, int] = {}
        self.gets: list[int] = []
        self.n = 0
        self._named: list[tuple[int, str]] = []
        self.part_of: dict[int, int] = {}  # group -> its entry in `parts`
        self.vary: frozenset[int] = frozenset()  # GETs whose slot changes from record to record
        self._flags: dict[int, bytes] = {}  # entry in `parts` -> the pattern of a `flag` group

    def raw(self, b: bytes) -> Pattern:
        self.parts.append(b)
        return self

    def get(self, name: str | None = None) -> Pattern:
        self.part_of[self.n] = len(self.parts)
        self.parts.append(rb"(h.|j....)")
        self.gets.append(self.n)
        if name:
            self.index[name] = self.n
        self.n += 1
        return self

    def cap(self, name: str, pattern: bytes) -> Pattern:
        self.part_of[self.n] = len(self.parts)
        self.parts.append(b"(" + pattern + b")")
        self.index[name] = self.n
        self.n += 1
        return self

    def flag(self, name: str, pattern: bytes) -> Pattern:
        """`pattern`, of which only whether it is there matters: the group captures its first byte (a lookahead),
        not the whole of it. A one-byte capture is one of CPython's cached one-byte objects: nothing is allocated
        per record, and the column's presence pass reads objects that stay in cache."""
        self.part_of[self.n] = len(self.parts)
        self._flags[len(self.parts)] = pattern
        self.parts.append(b"(?=(.))(?:" + pattern + b")")
        self.index[name] = self.n
        self.n += 1
        return self

    def size(self, name: str, flag: bool = False) -> Pattern:
        """torch.Size(tuple): REDUCE(GET Size, (tuple,)), 3 MEMOIZEs. `flag`: only whether it is there is read."""
        self.get(name + "_fn")
        (self.flag if flag else self.cap)(name, _TUP)
        return self.raw(rb"\x94\x85\x94R\x94")

    def string(self, name: str) -> Pattern:
        """SHORT_BINUNICODE of a name, MEMOIZE. Greedy up to the first 0x94 byte (MEMOIZE), without a lazy loop's
        step per character; its declared length is checked after, so a name that holds a 0x94 byte (inside a
        UTF-8 character) is not taken, and the loop reads it. `[^\x94]` is sre's cheapest repeat (a byte
        compare), a fifth of the findall time of storage entries and plans spent in character-class tests."""
        return self.raw(rb"\x8c").cap(name + "_len", b".").cap(name, _NAME).raw(rb"\x94")

    def compile(self) -> re.Pattern[bytes]:
        return re.compile(b"".join(self.parts), re.DOTALL)

    def compile_run(self) -> re.Pattern[bytes]:
        """For `findall` from a record's first byte: group 1 is a whole record with the FRAME opcodes that follow it
        (no-ops between opcodes), group i + 2 the record's group i (index i + 1 of a `findall` tuple); once a
        record does not match, the last alternative takes the rest of the span without capturing it (its tuple is
        all empty), so the records `findall` returns are exactly the contiguous run."""
        return re.compile(b"(" + b"".join(self.parts) + rb"(?:\x95.{8})*)|.+", re.DOTALL)

    def inline(self) -> bytes:
        """The pattern with its groups not capturing: to embed it as one group of another pattern."""
        parts = list(self.parts)
        for i in self.part_of.values():
            assert parts[i].startswith(b"(")
            parts[i] = b"(?:" + self._flags[i] + b")" if i in self._flags else b"(?:" + parts[i][1:]
        return b"".join(parts)

    def group(self, m: re.Match[bytes], name: str) -> bytes | None:
        return m.group(self.index[name] + 1)

    def varying(self, *names: str) -> Pattern:
        self.vary = frozenset(self.index[n] for n in names)
        return self

    def specialize(self, literals: dict[int, set[bytes]]) -> tuple[re.Pattern[bytes], dict[int, int]]:
        """A run pattern (as `compile_run`) where each GET group in `literals` is not captured but must be one of
        the given GETs (`(?!)` when none): sre matches literal bytes several times faster than a capturing
        alternation, and a record that names another slot simply ends the run. Returns it with the column of
        each group still captured (group -> index in a `findall` tuple)."""
        parts = list(self.parts)
        for g, raws in literals.items():
            alts = b"|".join(re.escape(r) for r in sorted(raws))
            parts[self.part_of[g]] = b"(?:" + alts + b")" if alts else b"(?!)"
        kept = [g for g in range(self.n) if g not in literals]
        pattern = re.compile(b"(" + b"".join(parts) + rb"(?:\x95.{8})*)|.+", re.DOTALL)
        return pattern, {g: k + 1 for k, g in enumerate(kept)}

    def gets_named(self) -> list[tuple[int, str]]:
        """Every GET group with its name ("" when unnamed)."""
        if len(self._named) != len(self.gets):
            names = {i: n for n, i in self.index.items()}
            self._named = [(i, names.get(i, "")) for i in self.gets]
        return self._named


def _chunk_pattern(p: Pattern, tag: str) -> Pattern:
    return (p.get(tag + "cls").raw(_NEW).get(tag + "k_offsets").size(tag + "offsets").get(tag + "k_sizes")
            .size(tag + "sizes").raw(b"ub"))


# What may follow a chunk inside a run (`vm_bounds.py`): the next batch of 1,000 of the same chunk list (APPENDS
# MARK), or the end of this tensor (APPENDS, SETITEMS, BUILD of its TensorStorageMetadata) and the next
# state_dict_metadata entry up to its chunk list's MARK: its key (SHORT_BINUNICODE), TensorStorageMetadata(properties=
# TensorProperties(dtype, layout, requires_grad, memory_format, pin_memory), size=torch.Size, chunks=[...]). A list
# of one chunk (every plain tensor of a real `dcp.save`, issue 31 (d)) is pickled without MARK: `]` MEMOIZE, the
# chunk, APPEND (`a`, not `e`), both in CPython's C and Python picklers (`batch_list_exact` / `_batch_appends`);
# `end` and `lmark` say which. One group of the chunk pattern (every record of a run carries it, empty but for the
# rows that end a list): its fields are read from the rows that have one, with `TENSOR_BOUND_REC`.
TENSOR_BOUND = Pattern()
(TENSOR_BOUND.raw(b"(?:").cap("cont", rb"e(?:\x95.{8})*\(").raw(b"|").cap("end", b"[ea]").raw(b"ub\x8c")
 .cap("key_len", b".").cap("key", _NAME).raw(rb"\x94").get("tsm").raw(_NEW).get("k_properties").get("props_cls")
 .raw(rb"\)\x81\x94\(").get("dtype").get("layout").cap("grad", rb"[\x88\x89]").get("memory_format")
 .cap("pin", rb"[\x88\x89]").raw(rb"t\x94b").get("k_size").size("tsize").get("k_chunks").raw(rb"\]\x94")
 .cap("lmark", rb"\(?").raw(b")"))
TENSOR_BOUND_REC = TENSOR_BOUND.compile()
CHUNK = _chunk_pattern(Pattern(), "").cap("bound", b"(?:" + TENSOR_BOUND.inline() + b")?")
CHUNK_REC = CHUNK.compile()
CHUNK_RUN = CHUNK.compile_run()

def _index(p: Pattern, tag: str, read_offsets: bool) -> Pattern:
    """MetadataIndex(fqn, offset, index): its state dict in either field order torch writes (`fqn, index[, offset]`
    as `MetadataIndex.__init__` sets them, tried first, or `fqn, offset, index`), offset None or a torch.Size, index
    None or an int. The name is matched once for both orders (no backtracking over it). `read_offsets` False (the
    plans): the offset's value is not read, only whether there is one."""
    flag = not read_offsets
    p.get("k_fqn").raw(b"(?:").get("fqn").raw(b"|").string("fqn_s").raw(b")(?:")
    p.get("k_index_b").raw(b"(?:N|" + _INT + b")").raw(b"(?:").get("k_offset_b").raw(b"(?:N|")
    p.size("offset_b", flag)
    p.raw(b"))?|").get("k_offset_a").raw(b"(?:N|").size("offset_a", flag).raw(b")").get("k_index_a")
    p.raw(b"(?:N|" + _INT + b"))")
    return p


STORAGE = Pattern()
_index(STORAGE.get("mi").raw(_NEW), "", True).raw(b"ub")
(STORAGE.get("si").raw(_NEW).get("k_path").raw(b"(?:").get("path").raw(b"|").string("path_s").raw(b")")
 .get("k_pos").cap("pos", _INT).get("k_len").cap("len", _INT).raw(b"ub")
 # the end of a batch of 1,000 storage_data entries and the start of the next (SETITEMS MARK): `vm_bounds.py`
 .raw(b"(?:").flag("batch", rb"u(?:\x95.{8})*\(").raw(b")?").varying("fqn", "path"))
STORAGE_REC = STORAGE.compile()
STORAGE_RUN = STORAGE.compile_run()

def _plan_chunk(p: Pattern) -> Pattern:
    """The rest of a plan item's chunk after its `(?:GET chunk|`: a ChunkStorageMetadata of its own (not a memo
    reference to a `state_dict_metadata` chunk, as a writer that builds the plan's chunk apart from the metadata's
    pickles it), each of its two torch.Size values spelled or a GET of one seen before; only whether each is there
    is read (for the memo count)."""
    p.get("chunk_cls").flag("chunk_new", _NEW).get("k_c_offsets").raw(b"(?:").get("c_offsets_ref").raw(b"|")
    p.size("c_offsets", True).raw(b")").get("k_c_sizes").raw(b"(?:").get("c_sizes_ref").raw(b"|")
    return p.size("c_sizes", True).raw(b")ub)")


PLAN = Pattern()
_index(PLAN.get("wi").raw(_NEW).get("k_index").get("mi").raw(_NEW), "", False).raw(b"ub")
(PLAN.get("k_type").raw(b"(?:").get("type_ref").raw(b"|").get("type_fn").raw(_INT)
 .flag("type_reduce", rb"\x85\x94R\x94").raw(b")").get("k_bytes").raw(b"(?:N|").get().raw(b")")
 .get("k_tensor").raw(b"(?:N|").get("twd").flag("twd_new", _NEW).get("k_chunk").raw(b"(?:").get("chunk").raw(b"|"))
_plan_chunk(PLAN)
(PLAN.get("k_props")
 .raw(b"(?:").get("props_ref").raw(b"|").get("props").flag("props_new", rb"\)\x81\x94\(").get().get()
 .raw(rb"\x89").get().raw(rb"\x89t\x94b)").get("k_size").raw(b"(?:").get("size_ref").raw(b"|")
 .size("size", True).raw(b")ub)ub"))
# What may follow a WriteItem inside a run (`vm_bounds.py`): the next batch of the same items list (APPENDS MARK),
# or the end of this SavePlan (APPENDS, its other fields, SETITEMS BUILD) and the start of the next one up to its
# items list's MARK. SavePlan's fields in dataclass order: items, storage_data (None), planner_data, usable. One
# group of the WriteItem pattern, as `TENSOR_BOUND`.
PLAN_BOUND = Pattern()
(PLAN_BOUND.raw(b"(?:").cap("cont", rb"e(?:\x95.{8})*\(").raw(b"|e").get("k_sd").raw(b"N").get("k_pd")
 .cap("pd", rb"\}\x94|N").get("k_usable").cap("usable", rb"[\x88\x89]").raw(b"ub").get("saveplan").raw(_NEW)
 .get("k_items").raw(rb"\]\x94\()"))
PLAN_BOUND_REC = PLAN_BOUND.compile()
PLAN.cap("bound", b"(?:" + PLAN_BOUND.inline() + b")?").varying("fqn", "chunk", "c_offsets_ref", "c_sizes_ref",
                                                                 "props_ref", "size_ref")
PLAN_REC = PLAN.compile()
PLAN_RUN = PLAN.compile_run()

ANY_CLASS = object()
ANY_KEY = object()
ANY_VALUE = object()  # any value the walk kept (a GET of one it did not keep makes the loop fall back)

CHUNK_WANT = {"cls": CHUNK_CLS, "k_offsets": "offsets", "offsets_fn": tuple, "k_sizes": "sizes", "sizes_fn": tuple}
TENSOR_BOUND_WANT = {"tsm": TSM, "k_properties": ANY_KEY, "props_cls": PROPS, "k_size": ANY_KEY, "tsize_fn": tuple,
                     "k_chunks": ANY_KEY, "dtype": ANY_VALUE, "layout": ANY_VALUE, "memory_format": ANY_VALUE}
PLAN_BOUND_WANT = {"k_sd": ANY_KEY, "k_pd": ANY_KEY, "k_usable": ANY_KEY, "saveplan": SAVE_PLAN,
                   "k_items": ANY_KEY}
_INDEX_WANT = {"k_fqn": "fqn", "k_offset_a": "offset", "offset_a_fn": tuple, "k_index_a": "index",
               "k_offset_b": "offset", "offset_b_fn": tuple, "k_index_b": "index"}
STORAGE_WANT = {"mi": INDEX, **_INDEX_WANT, "si": STORAGE_INFO, "k_path": "relative_path", "k_pos": "offset",
                 "k_len": "length"}
PLAN_WANT = {"wi": WRITE_ITEM, "k_index": ANY_KEY, "mi": ANY_CLASS,
              "k_fqn": ANY_KEY, "k_offset_a": ANY_KEY, "offset_a_fn": tuple, "k_index_a": ANY_KEY,
              "k_offset_b": ANY_KEY, "offset_b_fn": tuple, "k_index_b": ANY_KEY,
              "k_type": ANY_KEY, "type_fn": int, "k_bytes": ANY_KEY, "k_tensor": ANY_KEY, "twd": ANY_CLASS,
              "k_chunk": ANY_KEY, "chunk_cls": CHUNK_CLS, "k_c_offsets": "offsets", "c_offsets_fn": tuple,
              "k_c_sizes": "sizes", "c_sizes_fn": tuple, "k_props": ANY_KEY, "props": ANY_CLASS, "k_size": ANY_KEY, "size_fn": tuple}

