"""Stream a DCP ``.metadata`` pickle opcode by opcode, for checkpoints too large to build as torch objects.

`pickle.dump(Metadata)` needs every ``ChunkStorageMetadata``, ``MetadataIndex``, ``_StorageInfo`` and ``WriteItem``
alive at once (~1.5 KB per chunk with torch's classes: a 10M-chunk checkpoint does not fit in 24 GB). This module
writes the same protocol-4 opcodes pickle writes for those classes (torch 2.13 ``metadata.py``, ``planner.py``,
``filesystem.py``: NEWOBJ + dict state + BUILD, ``TensorProperties``' tuple state, ``torch.Size`` as REDUCE, enums
as REDUCE of their value, MEMOIZE after every object, batched APPENDS / SETITEMS of at most 1000, 64 KiB frames),
section by section, keeping only memo indices of the objects later sections refer back to (chunk objects, tensor
keys, each tensor's properties and size). torch's ``FileSystemReader.read_metadata`` loads the result (tested).
"""

from __future__ import annotations

import pickle
from typing import IO, Any

FRAME_TARGET = 64 * 1024
BATCH = 1000  # pickle's _BATCHSIZE
MD = "torch.distributed.checkpoint.metadata"
PLANNER = "torch.distributed.checkpoint.planner"
FS = "torch.distributed.checkpoint.filesystem"


_TUPLE_CODE = {1: b"\x85", 2: b"\x86", 3: b"\x87"}


def int_bytes(x: int) -> bytes:
    """pickle's save_long."""
    if 0 <= x <= 0xFF:
        return bytes((0x4B, x))
    if 0 <= x <= 0xFFFF:
        return b"M" + x.to_bytes(2, "little")
    if -0x80000000 <= x <= 0x7FFFFFFF:
        return b"J" + x.to_bytes(4, "little", signed=True)
    enc = pickle.encode_long(x)  # type: ignore[attr-defined]
    return b"\x8a" + bytes((len(enc),)) + enc


def tuple_bytes(t: tuple[int, ...]) -> tuple[bytes, int]:
    """A tuple of ints as pickle writes it, and its MEMOIZE count (an empty tuple is not memoized)."""
    if not t:
        return b")", 0
    body = b"".join(map(int_bytes, t))
    if len(t) > 3:
        return b"(" + body + b"t\x94", 1
    return body + _TUPLE_CODE[len(t)] + b"\x94", 1


def get_bytes(idx: int) -> bytes:
    return bytes((0x68, idx)) if idx < 256 else b"j" + idx.to_bytes(4, "little")


def text_bytes(s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return (b"\x8c" + bytes((len(b),)) if len(b) < 256 else b"X" + len(b).to_bytes(4, "little")) + b + b"\x94"


class Emitter:
    """Opcode writer with pickle's framing and a memo counter; constants (class globals, field names) are memoized
    once and referred to by GET, as pickle does for the same objects."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.buf = bytearray()
        self.n = 0  # memo slots used
        self.consts: dict[Any, int] = {}
        self._heads: dict[str, bytes] = {}  # record prefixes, once their globals and field names exist
        self.pending = 0  # open batches that may still lose their MARK (frames are cut only when none is)
        f.write(b"\x80\x04")

    # -- framing -------------------------------------------------------------------------------------------------
    def boundary(self) -> None:
        if len(self.buf) >= FRAME_TARGET and not self.pending:
            self._frame()

    def _frame(self) -> None:
        self.f.write(b"\x95" + len(self.buf).to_bytes(8, "little"))
        self.f.write(self.buf)
        self.buf = bytearray()

    def stop(self) -> None:
        self.buf += b"."
        self._frame()

    # -- values --------------------------------------------------------------------------------------------------
    def memoize(self) -> int:
        self.buf.append(0x94)
        self.n += 1
        return self.n - 1

    def get(self, idx: int) -> None:
        self.buf += bytes((0x68, idx)) if idx < 256 else b"j" + idx.to_bytes(4, "little")

    def text(self, s: str) -> int:
        """A new str object (literal + MEMOIZE)."""
        b = s.encode("utf-8", "surrogatepass")
        self.buf += (b"\x8c" + bytes((len(b),)) if len(b) < 256 else b"X" + len(b).to_bytes(4, "little")) + b
        return self.memoize()

    def const(self, s: str) -> None:
        """A shared string (field names, module names): literal the first time, GET after."""
        idx = self.consts.get(("s", s))
        if idx is None:
            self.consts[("s", s)] = self.text(s)
        else:
            self.get(idx)

    def glob(self, module: str, name: str) -> None:
        idx = self.consts.get(("g", module, name))
        if idx is None:
            self.const(module)
            self.const(name)
            self.buf.append(0x93)
            self.consts[("g", module, name)] = self.memoize()
        else:
            self.get(idx)

    def int_(self, x: int) -> None:
        self.buf += int_bytes(x)

    def g(self, *key: Any) -> bytes:
        """GET bytes of a constant already written (KeyError if it was not: callers write it first)."""
        return get_bytes(self.consts[key])

    def size_bytes(self, t: tuple[int, ...]) -> tuple[bytes, int]:
        """torch.Size(t) once torch.Size is a known global: (bytes, MEMOIZE count); the Size is the last slot."""
        tb, k = tuple_bytes(t)
        return self.g("g", "torch", "Size") + tb + b"\x85\x94R\x94", k + 2

    def ints(self, t: tuple[int, ...]) -> None:
        if not t:
            self.buf += b")"
            return
        if len(t) > 3:
            self.buf += b"("
        for x in t:
            self.int_(x)
        self.buf += b"t" if len(t) > 3 else bytes((0x84 + len(t),))
        self.memoize()

    def size(self, t: tuple[int, ...]) -> int:
        """torch.Size(t): REDUCE(torch.Size, (tuple(t),))."""
        self.glob("torch", "Size")
        self.ints(t)
        self.buf += b"\x85"
        self.memoize()
        self.buf += b"R"
        return self.memoize()

    def enum(self, module: str, name: str, value: int) -> None:
        """An enum member (shared object): REDUCE(cls, (value,)) the first time, GET after."""
        key = ("e", module, name, value)
        idx = self.consts.get(key)
        if idx is not None:
            self.get(idx)
            return
        self.glob(module, name)
        self.int_(value)
        self.buf += b"\x85"
        self.memoize()
        self.buf += b"R"
        self.consts[key] = self.memoize()

    def new(self, module: str, name: str) -> int:
        """``cls.__new__(cls)`` (NEWOBJ); returns the object's memo slot."""
        self.glob(module, name)
        self.buf += b")\x81"
        return self.memoize()

    def begin_state(self) -> None:
        """A dict state of more than one item: EMPTY_DICT MEMOIZE MARK."""
        self.buf += b"}"
        self.memoize()
        self.buf += b"("

    def end_state(self) -> None:
        self.buf += b"ub"

    # -- records -------------------------------------------------------------------------------------------------
    def chunk(self, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int:
        head = self._heads.get("chunk")
        if head is not None:
            ob, ok = self.size_bytes(offsets)
            sb, sk = self.size_bytes(sizes)
            idx = self.n
            self.buf += head + ob + self._heads["chunk_sizes"] + sb + b"ub"
            self.n += 2 + ok + sk
            return idx
        idx = self.new(MD, "ChunkStorageMetadata")
        self.begin_state()
        self.const("offsets")
        self.size(offsets)
        self.const("sizes")
        self.size(sizes)
        self.end_state()
        self._heads["chunk"] = self.g("g", MD, "ChunkStorageMetadata") + b")\x81\x94}\x94(" + self.g("s", "offsets")
        self._heads["chunk_sizes"] = self.g("s", "sizes")
        return idx

    def properties(self, dtype: str) -> int:
        """TensorProperties(dtype): its tuple state (dtype, layout, requires_grad, memory format, pin_memory)."""
        idx = self.new(MD, "TensorProperties")
        self.buf += b"("
        self.glob("torch", dtype)
        key = ("layout",)
        if key in self.consts:
            self.get(self.consts[key])
        else:
            self.glob("torch.serialization", "_get_layout")
            self.text("torch.strided")
            self.buf += b"\x85"
            self.memoize()
            self.buf += b"R"
            self.consts[key] = self.memoize()
        self.buf += b"\x89"
        self.enum(MD, "_MEM_FORMAT_ENCODING", 0)
        self.buf += b"\x89t"
        self.memoize()
        self.buf += b"b"
        self._heads["props"] = self.g("g", MD, "TensorProperties") + b")\x81\x94("
        self._heads["props_tail"] = self.g("layout") + b"\x89" + self.g("e", MD, "_MEM_FORMAT_ENCODING", 0) + b"\x89t\x94b"
        return idx

    def index(self, fqn_literal: str | None, fqn_get: int | None, offsets: tuple[int, ...] | None,
              hint: int | None) -> int | None:
        """MetadataIndex(fqn, offsets, index): state dict in torch's order (fqn, index, offset if not None).
        Returns the memo slot of a literal fqn (None when it was a GET)."""
        head = self._heads.get("index")
        if head is not None and (offsets is None or "offset" in self._heads):
            n0 = self.n + 2
            parts = [head]
            lit = None
            if fqn_get is not None:
                parts.append(get_bytes(fqn_get))
            else:
                parts.append(text_bytes(fqn_literal or ""))
                lit = n0
                n0 += 1
            parts.append(self._heads["index_k"])
            parts.append(b"N" if hint is None else int_bytes(hint))
            if offsets is not None:
                sb, sk = self.size_bytes(offsets)
                parts.append(self._heads["offset"] + sb)
                n0 += sk
            parts.append(b"ub")
            self.buf += b"".join(parts)
            self.n = n0
            return lit
        self.new(MD, "MetadataIndex")
        self.begin_state()
        self.const("fqn")
        lit = None
        if fqn_get is not None:
            self.get(fqn_get)
        else:
            assert fqn_literal is not None
            lit = self.text(fqn_literal)
        self.const("index")
        if hint is None:
            self.buf += b"N"
        else:
            self.int_(hint)
        if offsets is not None:
            self.const("offset")
            self.size(offsets)
            self._heads["offset"] = self.g("s", "offset")
        self.end_state()
        self._heads["index"] = self.g("g", MD, "MetadataIndex") + b")\x81\x94}\x94(" + self.g("s", "fqn")
        self._heads["index_k"] = self.g("s", "index")
        return lit

    def storage_info(self, path_literal: str | None, path_get: int | None, offset: int, length: int) -> int | None:
        """_StorageInfo(relative_path, offset, length): `__getstate__` drops None transform_descriptors."""
        head = self._heads.get("sinfo")
        if head is not None:
            lit = None
            if path_get is not None:
                pb = get_bytes(path_get)
            else:
                pb = text_bytes(path_literal or "")
                lit = self.n + 2
            self.buf += head + pb + self._heads["sinfo_off"] + int_bytes(offset) + self._heads["sinfo_len"] \
                + int_bytes(length) + b"ub"
            self.n += 3 if lit is not None else 2
            return lit
        self.new(FS, "_StorageInfo")
        self.begin_state()
        self.const("relative_path")
        lit = None
        if path_get is not None:
            self.get(path_get)
        else:
            assert path_literal is not None
            lit = self.text(path_literal)
        self.const("offset")
        self.int_(offset)
        self.const("length")
        self.int_(length)
        self.end_state()
        self._heads["sinfo"] = self.g("g", FS, "_StorageInfo") + b")\x81\x94}\x94(" + self.g("s", "relative_path")
        self._heads["sinfo_off"] = self.g("s", "offset")
        self._heads["sinfo_len"] = self.g("s", "length")
        return lit


    def write_item(self, fqn_literal: str | None, fqn_get: int | None, offsets: tuple[int, ...] | None,
                   hint: int | None, item_type: int, chunk: int | None, props: int | None, size: int | None,
                   dtype: str, gshape: tuple[int, ...]) -> int | None:
        """A plan's WriteItem(index, type, bytes_io_data=None, tensor_data): for a tensor item (`chunk` not None)
        TensorWriteData(chunk, properties, size), whose chunk is the metadata's object (GET) and whose properties /
        size are the metadata's objects when `props` / `size` are given, new objects otherwise."""
        head = self._heads.get("wi")
        fast = head is not None and ("e", PLANNER, "WriteItemType", item_type) in self.consts and (
            chunk is None or "twd" in self._heads)
        if not fast:
            self.new(PLANNER, "WriteItem")
            self.begin_state()
            self.const("index")
        else:
            self.buf += head
            self.n += 2
        lit = self.index(fqn_literal, fqn_get, offsets, hint)
        if not fast:
            self.const("type")
            self.enum(PLANNER, "WriteItemType", item_type)
            self.const("bytes_io_data")
            self.buf += b"N"
            self.const("tensor_data")
        else:
            self.buf += self._heads["wi_type"] + self.g("e", PLANNER, "WriteItemType", item_type) + self._heads["wi_rest"]
        if chunk is None:
            self.buf += b"N"
        elif "twd" in self._heads and (props is not None or "props" in self._heads):
            self.buf += self._heads["twd"] + get_bytes(chunk) + self._heads["twd_props"]
            self.n += 2
            if props is not None:
                self.buf += get_bytes(props)
            else:
                self.buf += self._heads["props"] + self.g("g", "torch", dtype) + self._heads["props_tail"]
                self.n += 2
            self.buf += self._heads["twd_size"]
            if size is not None:
                self.buf += get_bytes(size)
            else:
                sb, sk = self.size_bytes(gshape)
                self.buf += sb
                self.n += sk
            self.buf += b"ub"
        else:
            self.new(PLANNER, "TensorWriteData")
            self.begin_state()
            self.const("chunk")
            self.get(chunk)
            self.const("properties")
            if props is not None:
                self.get(props)
            else:
                self.properties(dtype)
            self.const("size")
            if size is not None:
                self.get(size)
            else:
                self.size(gshape)
            self.end_state()
            self._heads["twd"] = self.g("g", PLANNER, "TensorWriteData") + b")\x81\x94}\x94(" + self.g("s", "chunk")
            self._heads["twd_props"] = self.g("s", "properties")
            self._heads["twd_size"] = self.g("s", "size")
        self.end_state()
        if head is None:
            self._heads["wi"] = self.g("g", PLANNER, "WriteItem") + b")\x81\x94}\x94(" + self.g("s", "index")
            self._heads["wi_type"] = self.g("s", "type")
            self._heads["wi_rest"] = self.g("s", "bytes_io_data") + b"N" + self.g("s", "tensor_data")
        return lit


class Batches:
    """pickle's batched APPENDS / SETITEMS for a container whose length is not known up front: items are written
    as they come; every BATCH items close a batch. A batch of one item is written with APPEND / SETITEM."""

    def __init__(self, e: Emitter, setitems: bool) -> None:
        self.e = e
        self.single, self.many = (b"s", b"u") if setitems else (b"a", b"e")
        self.k = 0
        self.mark_at = -1

    def before_item(self) -> None:
        """Call before writing an item: opens a batch with MARK (removed again if the batch stays single)."""
        if self.k == 0:
            self.mark_at = len(self.e.buf)
            self.e.buf += b"("
            self.e.pending += 1

    def after_item(self) -> None:
        self.k += 1
        if self.k == 2:
            self.e.pending -= 1
        if self.k == BATCH:
            self.e.buf += self.many
            self.k = 0
            self.e.boundary()

    def close(self) -> None:
        if self.k == 1:
            del self.e.buf[self.mark_at]  # a one-item batch: no MARK, APPEND / SETITEM
            self.e.buf += self.single
            self.e.pending -= 1
        elif self.k > 1:
            self.e.buf += self.many
        self.k = 0
