"""The chunk table: every chunk of every DCP tensor as columns (numpy arrays), not one Python object per chunk.

A fully sharded checkpoint has millions of chunks (a 70B model on 1,024 GPUs: ~2M; a large MoE: tens of millions).
As `Chunk`/`StoredItem` objects they cost ~0.5 KB each; as columns a few dozen bytes. `ChunkTable` is additive to the
neutral model: readers that stream `.metadata` (`formats/dcp/stream.py`) build it, checks read its arrays, and
`tensor_chunks(t)` / `to_tensors()` give the per-tensor objects where a caller really wants them (small tensors,
tests comparing with the reference reader).

Layout (N chunks, T tensors, all arrays int64 unless said otherwise):
- tensor t owns chunk rows ``tensor_start[t]:tensor_start[t+1]`` (T+1 entries), in `.metadata` order;
- chunk row i has ``coord_start[i+1] - coord_start[i]`` axes; its offsets are ``offsets[coord_start[i]:coord_start[i+1]]``
  and its sizes the same slice of `sizes` (a chunk's offsets and sizes always have the same length here);
- its stored bytes: ``file_id[i]`` (int32, index into `files`; -1 = no storage entry, CK304), ``byte_offset[i]``,
  ``byte_length[i]``; `transforms` maps the few rows with DCP stream transforms to them;
- tensor columns: `keys`, `dtypes`, `shape_start` (T+1) into `shapes`, `orig_shapes` (Megatron `mcore_data`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ckptinspect.model import Chunk, StoredItem, Tensor


@dataclass(frozen=True, slots=True, eq=False)
class ChunkTable:
    """Chunks of all tensors as columns (see the module docstring for the layout)."""

    keys: tuple[str, ...]
    dtypes: tuple[str, ...]
    shape_start: Any  # np.ndarray[int64], T+1
    shapes: Any  # np.ndarray[int64]
    tensor_start: Any  # np.ndarray[int64], T+1
    coord_start: Any  # np.ndarray[int64], N+1
    offsets: Any  # np.ndarray[int64]
    sizes: Any  # np.ndarray[int64]
    file_id: Any  # np.ndarray[int32], N; -1 = no storage entry
    byte_offset: Any  # np.ndarray[int64], N
    byte_length: Any  # np.ndarray[int64], N
    files: tuple[str, ...]
    transforms: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    orig_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def n_tensors(self) -> int:
        return len(self.keys)

    @property
    def n_chunks(self) -> int:
        return int(len(self.file_id))

    @property
    def nbytes(self) -> int:
        """Bytes the arrays occupy (the table's own memory, strings not counted)."""
        return sum(int(a.nbytes) for a in (self.shape_start, self.shapes, self.tensor_start, self.coord_start,
                                           self.offsets, self.sizes, self.file_id, self.byte_offset,
                                           self.byte_length))

    def shape(self, t: int) -> tuple[int, ...]:
        return tuple(int(x) for x in self.shapes[self.shape_start[t]:self.shape_start[t + 1]])

    def chunk_rows(self, t: int) -> range:
        return range(int(self.tensor_start[t]), int(self.tensor_start[t + 1]))

    def chunk(self, i: int) -> Chunk:
        """Row `i` as a model `Chunk` (for display and for small tensors; checks use the arrays)."""
        a, b = int(self.coord_start[i]), int(self.coord_start[i + 1])
        offs = tuple(int(x) for x in self.offsets[a:b])
        sizes = tuple(int(x) for x in self.sizes[a:b])
        fid = int(self.file_id[i])
        item = None
        if fid >= 0:
            item = StoredItem(self.files[fid], int(self.byte_offset[i]), int(self.byte_length[i]),
                              self.transforms.get(i, ()))
        return Chunk(offs, sizes, item)

    def tensor_chunks(self, t: int) -> tuple[Chunk, ...]:
        return tuple(self.chunk(i) for i in self.chunk_rows(t))

    def tensor(self, t: int) -> Tensor:
        key = self.keys[t]
        return Tensor(key, self.shape(t), self.dtypes[t], self.tensor_chunks(t), None, self.orig_shapes.get(key))

    def tensor_views(self) -> tuple[Tensor, ...]:
        """Every tensor, its chunks a `TableChunks` view (one small object per tensor, none per chunk)."""
        return tuple(Tensor(k, self.shape(t), self.dtypes[t], TableChunks(self, t), None, self.orig_shapes.get(k))
                     for t, k in enumerate(self.keys))

    def to_tensors(self) -> tuple[Tensor, ...]:
        """Every tensor as model objects: what the reference reader builds (tests compare the two)."""
        return tuple(self.tensor(t) for t in range(self.n_tensors))


class TableChunks(Sequence[Chunk]):
    """The chunks of tensor `t` of a `ChunkTable` as a read-only sequence: `Chunk` objects are made on access, so
    code that only counts (`len`) or that reads the table's arrays costs nothing per chunk. Equal to any sequence
    of the same chunks."""

    __slots__ = ("_table", "_start", "_stop")

    def __init__(self, table: ChunkTable, t: int) -> None:
        self._table = table
        self._start = int(table.tensor_start[t])
        self._stop = int(table.tensor_start[t + 1])

    @property
    def rows(self) -> range:
        return range(self._start, self._stop)

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, i: int) -> Chunk: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Chunk, ...]: ...

    def __getitem__(self, i: int | slice) -> Chunk | tuple[Chunk, ...]:
        if isinstance(i, slice):
            return tuple(self._table.chunk(r) for r in self.rows[i])
        return self._table.chunk(self.rows[i])

    def __iter__(self) -> Iterator[Chunk]:
        chunk = self._table.chunk
        for r in range(self._start, self._stop):
            yield chunk(r)

    def geometry(self) -> bytes | None:
        """The chunks' (offsets, sizes) as canonical bytes (rows sorted): equal iff the two chunk sets are equal
        (as sorted lists of (offsets, sizes)); None when chunks have different numbers of axes."""
        import numpy as np

        t = self._table
        cs = t.coord_start[self._start:self._stop + 1]
        nd = np.diff(cs)
        if len(nd) and (nd != nd[0]).any():
            return None
        k = int(nd[0]) if len(nd) else 0
        idx = (cs[:-1, None] + np.arange(k)[None, :]).astype(np.int64)
        m = np.concatenate((t.offsets[idx], t.sizes[idx]), axis=1) if k else np.zeros((len(nd), 0), dtype=np.int64)
        if len(m) and k:
            m = m[np.lexsort(m.T[::-1])]
        return k.to_bytes(2, "little") + len(nd).to_bytes(8, "little") + np.ascontiguousarray(m).tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<TableChunks rows {self._start}:{self._stop}>"
