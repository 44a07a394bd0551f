"""The chunk table: the one store of every chunk of every tensor of a checkpoint, as columns (numpy arrays).

A fully sharded checkpoint has millions of chunks (a 70B model on 1,024 GPUs: ~2M; a large MoE: tens of millions).
As `Chunk`/`StoredItem` objects they cost ~0.5 KB each; as columns a few dozen bytes. Every reader fills one
(`formats/dcp/table.py` straight from the streaming `.metadata` walk; the other readers through
`ChunkTable.of`: the reference DCP reader, zarr, legacy per-rank files with one row per tensor, the Hugging Face
storage writer, merged per-rank metadata), every check reads its arrays, and `Checkpoint.tensors` are its
`tensors`: one small `Tensor` per tensor whose `chunks` is a `TableChunks` view of its rows (`Chunk`s made on
access, for display and for the few places that want objects).

Layout (N chunks, T tensors, all arrays int64 unless said otherwise):
- tensor t owns chunk rows ``tensor_start[t]:tensor_start[t+1]`` (T+1 entries), in the reader's order;
- chunk row i has ``coord_start[i+1] - coord_start[i]`` axes; its offsets are ``offsets[coord_start[i]:coord_start[i+1]]``
  and its sizes the same slice of `sizes` (a chunk's offsets and sizes always have the same length here);
- its stored bytes: ``file_id[i]`` (int32, index into `files`; -1 = no storage entry, CK304), ``byte_offset[i]``,
  ``byte_length[i]``; `transforms` maps the few rows with DCP stream transforms to them;
- tensor columns: `keys`, `dtypes`, `shape_start` (T+1) into `shapes`, `orig_shapes` (Megatron `mcore_data`),
  `shards` (legacy: the ``mp_rank_*`` dir of each tensor; empty for global formats).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

from ckptinspect.model import Chunk, StoredItem, Tensor


class TensorEntry(NamedTuple):
    """One tensor as a reader hands it to `ChunkTable.of` (its chunks as objects: formats with few of them).

    Fields as `Tensor`'s; `chunks` become the table's rows, in this order."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    chunks: Sequence[Chunk]
    shard: str | None = None
    orig_shape: tuple[int, ...] | None = None


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
    shards: tuple[str | None, ...] = ()  # per tensor, or () when no tensor has one
    _tensors: tuple[Tensor, ...] | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, entries: Iterable[TensorEntry | Tensor]) -> ChunkTable:
        """The table of `entries`: readers whose chunks come as objects, or tensors of another table (a subset, or
        changed with `dataclasses.replace`). Raises `ValueError` for a chunk whose offsets and sizes differ in length
        (no DCP, zarr or torch writer makes one)."""
        import numpy as np

        I64 = np.int64
        files: dict[str, int] = {}
        keys: list[str] = []
        dtypes: list[str] = []
        shards: list[str | None] = []
        orig: dict[str, tuple[int, ...]] = {}
        t_nd: list[int] = []
        shapes: list[int] = []
        lens: list[int] = []
        c_nd: list[int] = []
        offs: list[int] = []
        sizes: list[int] = []
        fid: list[int] = []
        pos: list[int] = []
        length: list[int] = []
        transforms: dict[int, tuple[str, ...]] = {}
        for e in entries:
            keys.append(e.key)
            dtypes.append(e.dtype)
            shards.append(e.shard)
            if e.orig_shape is not None:
                orig[e.key] = e.orig_shape
            t_nd.append(len(e.shape))
            shapes.extend(e.shape)
            lens.append(len(e.chunks))
            for c in e.chunks:
                if len(c.offsets) != len(c.sizes):
                    raise ValueError("chunk offsets and sizes differ in length")
                c_nd.append(len(c.offsets))
                offs.extend(c.offsets)
                sizes.extend(c.sizes)
                st = c.storage
                if st is None:
                    fid.append(-1)
                    pos.append(0)
                    length.append(0)
                else:
                    fid.append(files.setdefault(st.file, len(files)))
                    pos.append(st.offset)
                    length.append(st.length)
                    if st.transforms:
                        transforms[len(fid) - 1] = st.transforms
        return cls(
            tuple(keys), tuple(dtypes), starts(np.array(t_nd, dtype=I64)), np.array(shapes, dtype=I64),
            starts(np.array(lens, dtype=I64)), starts(np.array(c_nd, dtype=I64)), np.array(offs, dtype=I64),
            np.array(sizes, dtype=I64), np.array(fid, dtype=np.int32), np.array(pos, dtype=I64),
            np.array(length, dtype=I64), tuple(files), transforms, orig,
            tuple(shards) if any(x is not None for x in shards) else (),
        )

    @classmethod
    def empty(cls) -> ChunkTable:
        """No tensor (formats without tensors, unreadable metadata)."""
        return cls.of(())

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

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor, its chunks a `TableChunks` view of its rows (one small object per tensor, none per chunk);
        made once. The views hold the chunk columns, not the table: the model stays free of reference cycles, which
        matters because the `.metadata` readers `gc.freeze()` what they built (`pickling.unpickle.no_gc`) and
        only reference counting frees it then."""
        got = self._tensors
        if got is None:
            cols = _Columns(self.coord_start, self.offsets, self.sizes, self.file_id, self.byte_offset,
                            self.byte_length, self.files, self.transforms)
            shards = self.shards or (None,) * self.n_tensors
            ends = self.tensor_start.tolist()
            # shapes from lists, not per-tensor numpy slices (a real `dcp.save` of 100k one-chunk tensors: issue 31)
            dims, starts = self.shapes.tolist(), self.shape_start.tolist()
            got = tuple(Tensor(k, tuple(dims[starts[t]:starts[t + 1]]), self.dtypes[t],
                               TableChunks(cols, ends[t], ends[t + 1]), shards[t], self.orig_shapes.get(k))
                        for t, k in enumerate(self.keys))
            object.__setattr__(self, "_tensors", got)
        return got

    def shape(self, t: int) -> tuple[int, ...]:
        return tuple(int(x) for x in self.shapes[self.shape_start[t]:self.shape_start[t + 1]])

    def chunk_rows(self, t: int) -> range:
        return range(int(self.tensor_start[t]), int(self.tensor_start[t + 1]))

    def chunk(self, i: int) -> Chunk:
        """Row `i` as a model `Chunk` (for display and for small tensors; checks use the arrays)."""
        return _chunk(self, i)

    def stored(self, i: int) -> StoredItem | None:
        """Row `i`'s stored item, or None without a storage entry."""
        return _stored(self, i)

    def replicas_once(self) -> ChunkTable:
        """This table with the chunks that several ranks wrote at the same place counted once (DCP per-rank
        metadata, `Checkpoint.rank_metadata`: each rank loads its own copy); a copy without a storage entry is kept
        apart, so CK304 still sees it. Chunks that only partly overlap stay. The first copy of each is kept, in
        order; the table itself when no chunk is repeated."""
        keep: list[int] = []
        lens: list[int] = []
        for t in range(self.n_tensors):
            seen: set[tuple[tuple[int, ...], tuple[int, ...], bool]] = set()
            rows = self.chunk_rows(t)
            for r in rows:
                c = self.chunk(r)
                key = (c.offsets, c.sizes, c.storage is None)
                if key not in seen:
                    seen.add(key)
                    keep.append(r)
            lens.append(len(seen))
        if len(keep) == self.n_chunks:
            return self
        return self.take_rows(keep, lens)

    def take_rows(self, rows: Sequence[int], lens: Sequence[int]) -> ChunkTable:
        """A table of the same tensors holding only chunk `rows` (in order; `lens[t]` of them are tensor t's)."""
        import numpy as np

        I64 = np.int64
        r = np.array(rows, dtype=I64)
        nd = (self.coord_start[1:] - self.coord_start[:-1])[r] if len(r) else np.zeros(0, dtype=I64)
        coord_start = starts(nd)
        idx = (np.repeat(self.coord_start[:-1][r] - coord_start[:-1], nd) + np.arange(int(coord_start[-1]),
               dtype=I64)) if len(r) else np.zeros(0, dtype=I64)
        transforms = {j: self.transforms[int(i)] for j, i in enumerate(r.tolist()) if int(i) in self.transforms}
        return ChunkTable(self.keys, self.dtypes, self.shape_start, self.shapes, starts(np.array(lens, dtype=I64)),
                          coord_start, self.offsets[idx], self.sizes[idx], self.file_id[r], self.byte_offset[r],
                          self.byte_length[r], self.files, transforms, self.orig_shapes, self.shards)


class _Columns(NamedTuple):
    """The chunk columns of a `ChunkTable` (the same arrays), for its views."""

    coord_start: Any
    offsets: Any
    sizes: Any
    file_id: Any
    byte_offset: Any
    byte_length: Any
    files: tuple[str, ...]
    transforms: Mapping[int, tuple[str, ...]]


def _chunk(cols: ChunkTable | _Columns, i: int) -> Chunk:
    a, b = int(cols.coord_start[i]), int(cols.coord_start[i + 1])
    return Chunk(tuple(cols.offsets[a:b].tolist()), tuple(cols.sizes[a:b].tolist()), _stored(cols, i))


def _stored(cols: ChunkTable | _Columns, i: int) -> StoredItem | None:
    fid = int(cols.file_id[i])
    if fid < 0:
        return None
    return StoredItem(cols.files[fid], int(cols.byte_offset[i]), int(cols.byte_length[i]), cols.transforms.get(i, ()))


def starts(lens: Any) -> Any:
    """Start indices from lengths: ``[0, cumsum(lens)...]`` (len(lens) + 1 entries, int64)."""
    import numpy as np

    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


class TableChunks(Sequence[Chunk]):
    """The chunks of one tensor of a `ChunkTable` (rows `start:stop` of its columns) as a read-only sequence: `Chunk` objects are made on access, so
    code that only counts (`len`) or that reads the table's arrays costs nothing per chunk. Equal to any sequence
    of the same chunks."""

    __slots__ = ("_cols", "_start", "_stop")

    def __init__(self, columns: _Columns, start: int, stop: int) -> None:
        self._cols = columns
        self._start = start
        self._stop = stop

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
            return tuple(_chunk(self._cols, r) for r in self.rows[i])
        return _chunk(self._cols, self.rows[i])

    def __iter__(self) -> Iterator[Chunk]:
        # the tensor's columns as Python lists once (not two numpy slices per chunk)
        t, s, e = self._cols, self._start, self._stop
        if s == e:
            return
        cs = t.coord_start[s:e + 1].tolist()
        base = cs[0]
        offs = t.offsets[base:cs[-1]].tolist()
        sizes = t.sizes[base:cs[-1]].tolist()
        fid = t.file_id[s:e].tolist()
        pos = t.byte_offset[s:e].tolist()
        length = t.byte_length[s:e].tolist()
        files, transforms = t.files, t.transforms
        for k in range(e - s):
            a, b = cs[k] - base, cs[k + 1] - base
            f = fid[k]
            item = None if f < 0 else StoredItem(files[f], pos[k], length[k], transforms.get(s + k, ()))
            yield Chunk(tuple(offs[a:b]), tuple(sizes[a:b]), item)

    def stored_bytes(self) -> int:
        """Bytes the chunks' stored items occupy (chunks without a storage entry count 0)."""
        t = self._cols
        rows = slice(self._start, self._stop)
        return sum(t.byte_length[rows][t.file_id[rows] >= 0].tolist())

    def geometry(self) -> bytes | None:
        """The chunks' (offsets, sizes) as canonical bytes (rows sorted): equal iff the two chunk sets are equal
        (as sorted lists of (offsets, sizes)); None when chunks have different numbers of axes."""
        import numpy as np

        t = self._cols
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
