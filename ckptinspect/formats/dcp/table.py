"""Turning the streaming walk's columns into a `ChunkTable`: tensor order, chunk order, storage join — vectorised.

The reference reader looks each chunk's stored item up in a dict keyed by ``(fqn, offsets)``; here the same join is
a sort: storage keys and chunk keys become fixed-width rows of int64 (key id, offsets...) per number of axes, the
storage side is de-duplicated keeping the last entry (what assigning into the dict keeps), and `searchsorted`
finds each chunk's entry. Cost O(n log n) in numpy, no Python object per chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptinspect.model.chunk_table import ChunkTable
from ckptinspect.formats.dcp.vm_eval import Sink
from ckptinspect.model import StoredItem

# numpy is imported where a table is built, not with the package (sniff / ls / --version stay quick).


def _arr(a: Any, dtype: Any) -> Any:
    import numpy as np

    I64 = np.int64
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


def gather_ranges(starts: Any, lens: Any) -> Any:
    """Indices ``starts[0]..starts[0]+lens[0]-1, starts[1]..`` as one array (no Python loop)."""
    import numpy as np

    I64 = np.int64
    lens = np.asarray(lens, dtype=I64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=I64)
    ends = np.cumsum(lens)
    base = np.repeat(np.asarray(starts, dtype=I64) - (ends - lens), lens)
    return base + np.arange(total, dtype=I64)


def _starts(lens: Any) -> Any:
    import numpy as np

    I64 = np.int64
    out = np.zeros(len(lens) + 1, dtype=I64)
    np.cumsum(lens, out=out[1:])
    return out


def _matrix(kids: Any, nd: int, flat: Any, cstart: Any) -> Any:
    """Rows (key id, coord_0..coord_{nd-1}) as a contiguous int64 matrix viewed as one void value per row."""
    import numpy as np

    I64 = np.int64
    m = np.empty((len(kids), max(nd, 0) + 1), dtype=I64)
    m[:, 0] = kids
    for j in range(max(nd, 0)):
        m[:, j + 1] = flat[cstart + j]
    return np.ascontiguousarray(m).view(np.dtype((np.void, m.shape[1] * 8))).ravel()


def build_table(
    sink: Sink, tensor_rows: Sequence[tuple[str, int]], object_keys: Sequence[str],
    orig_shapes: Mapping[str, tuple[int, ...]],
) -> tuple[ChunkTable, list[StoredItem | None], int]:
    """(table, each object's stored item, number of storage keys whose fqn has no metadata entry)."""
    import numpy as np

    I64 = np.int64
    keys = tuple(k for k, _ in tensor_rows)
    order = np.fromiter((r for _, r in tensor_rows), dtype=I64, count=len(tensor_rows))
    # tensors: shapes and dtypes in state_dict_metadata order
    t_nd = _arr(sink.t_nd, np.int8).astype(I64)
    t_ss = _starts(t_nd)
    shapes = _arr(sink.t_shape, I64)[gather_ranges(t_ss[order], t_nd[order])]
    dtypes = tuple(sink.t_dtype[r] for r in order.tolist())
    ends = _arr(sink.t_rows_end, I64)
    begins = np.concatenate(([0], ends[:-1])).astype(I64) if len(ends) else ends
    lens = (ends - begins)[order]
    rows = _arr(sink.t_rows, I64)
    if _in_stream_order(order, rows, len(t_nd), len(sink.c_nd)):
        # every tensor once, its chunks in the order they were read (what a writer produces): the sink's columns
        # are the table's, no copy
        nd = _arr(sink.c_nd, np.int8)
        offsets = _arr(sink.c_off, I64)
        sizes = _arr(sink.c_size, I64)
    else:
        perm = rows[gather_ranges(begins[order], lens)]
        c_nd = _arr(sink.c_nd, np.int8).astype(I64)
        c_cs = _starts(c_nd)
        nd = c_nd[perm]
        cidx = gather_ranges(c_cs[perm], nd)
        del perm, c_nd, c_cs
        offsets = _arr(sink.c_off, I64)[cidx]
        sizes = _arr(sink.c_size, I64)[cidx]
        del cidx
    del rows
    coord_start = _starts(nd)
    n = len(nd)
    # key ids: tensors 0..T-1, objects T.., fqns of neither after them (in order of first use)
    kid: dict[str, int] = {k: i for i, k in enumerate(keys)}
    for k in object_keys:
        kid.setdefault(k, len(kid))
    known = len(kid)
    for k in dict.fromkeys(sink.s_fqn):
        kid.setdefault(k, len(kid))
    s_kid: Any = np.fromiter(map(kid.__getitem__, sink.s_fqn), dtype=np.int32 if len(kid) < 2**31 else I64,
                        count=len(sink.s_fqn))
    s_nd = _arr(sink.s_nd, np.int8)
    s_cs = _starts(np.maximum(s_nd, 0))
    s_flat = _arr(sink.s_off, I64)
    s_file = _arr(sink.s_file, np.int32)
    s_pos = _arr(sink.s_pos, I64)
    s_len = _arr(sink.s_len, I64)
    match = np.full(n, -1, dtype=I64)  # chunk row -> storage row
    obj_match = np.full(len(object_keys), -1, dtype=I64)
    orphans = 0
    t_end = np.cumsum(lens)  # end row (exclusive) of each tensor's chunks
    for d in sorted(set(np.unique(s_nd).tolist()) | set(np.unique(nd).tolist())):
        srows = np.flatnonzero(s_nd == d)
        if not len(srows):
            continue
        if d < 0:
            skeys = _matrix(s_kid[srows], d, s_flat, s_cs[srows])
            uniq, first_rev = np.unique(skeys[::-1], return_index=True)
            last = srows[::-1][first_rev]
            orphans += int(np.count_nonzero(s_kid[last] >= known))
            okeys = np.array([kid[k] for k in object_keys], dtype=I64)
            qkeys = _matrix(okeys, -1, s_flat, np.zeros(len(okeys), dtype=I64))
            obj_match = _lookup(uniq, last, qkeys)
            continue
        crows = np.flatnonzero(nd == d)
        last, hits = _join(len(kid), d, s_kid[srows], s_flat, s_cs[srows], srows, t_end, crows, offsets,
                           coord_start)
        orphans += int(np.count_nonzero(s_kid[last] >= known))
        if len(crows):
            match[crows] = hits
        del crows, last, hits
    has = match >= 0
    at = np.maximum(match, 0)
    file_id = np.where(has, s_file[at] if len(s_file) else -1, -1).astype(np.int32, copy=False)
    byte_offset = np.where(has, s_pos[at] if len(s_pos) else 0, 0).astype(I64, copy=False)
    byte_length = np.where(has, s_len[at] if len(s_len) else 0, 0).astype(I64, copy=False)
    del at, has
    transforms: dict[int, tuple[str, ...]] = {}
    if sink.s_transforms:
        for row in np.flatnonzero(np.isin(match, np.fromiter(sink.s_transforms, dtype=I64))).tolist():
            transforms[row] = sink.s_transforms[int(match[row])]
    files = tuple(sink.file_ids)
    objects: list[StoredItem | None] = []
    for j in obj_match.tolist():
        objects.append(None if j < 0 else StoredItem(files[int(s_file[j])], int(s_pos[j]), int(s_len[j]),
                                                     sink.s_transforms.get(j, ())))
    table = ChunkTable(keys, dtypes, _starts(t_nd[order]), shapes, _starts(lens), coord_start, offsets, sizes,
                       file_id, byte_offset, byte_length, files, transforms,
                       {k: v for k, v in orig_shapes.items() if k in kid and kid[k] < len(keys)})
    return table, objects, orphans


def _in_stream_order(order: Any, rows: Any, n_tensors: int, n_chunks: int) -> bool:
    """Whether the table's tensor order is the build order and its chunk order the read order (each row once)."""
    import numpy as np

    if len(order) != n_tensors or len(rows) != n_chunks:
        return False
    if n_tensors and not bool((order == np.arange(n_tensors)).all()):
        return False
    return not n_chunks or (int(rows[0]) == 0 and bool((rows[1:] - rows[:-1] == 1).all()))


def _join(n_keys: int, d: int, s_kid: Any, s_flat: Any, s_cs: Any, srows: Any, t_end: Any, crows: Any,
          c_flat: Any, coord_start: Any) -> tuple[Any, Any]:
    """The storage join for keys with `d` axes: (the storage row each distinct key keeps — the last one, as a dict
    assignment keeps it — and each chunk's storage row, -1 when absent). Keys are (key id, offsets...): packed into
    one int64 (mixed radix from the columns' maxima) when that fits, else compared as rows of bytes. The callers
    pass temporaries: each is dropped here as soon as it is used (peak memory at millions of chunks)."""
    import numpy as np

    c_cs = coord_start[crows]
    radix = [n_keys]
    for j in range(d):
        hi = max(int(s_flat[s_cs + j].max(initial=0)), int(c_flat[c_cs + j].max(initial=0)) if len(c_cs) else 0)
        radix.append(hi + 1)
    del c_cs
    total = 1
    for r in radix:
        total *= r
    fits = total < 2**62
    skeys = _packed(s_kid, d, s_flat, s_cs, radix) if fits else _matrix(s_kid, d, s_flat, s_cs)
    del s_kid, s_cs
    uniq, first_rev = np.unique(skeys[::-1], return_index=True)
    del skeys
    last = srows[::-1][first_rev]
    del first_rev
    c_kid = np.searchsorted(t_end, crows, side="right")  # each chunk row's tensor
    c_cs = coord_start[crows]
    qkeys = _packed(c_kid, d, c_flat, c_cs, radix) if fits else _matrix(c_kid, d, c_flat, c_cs)
    del c_kid, c_cs
    return last, _lookup(uniq, last, qkeys)


def _packed(kids: Any, d: int, flat: Any, cstart: Any, radix: list[int]) -> Any:
    import numpy as np

    k = np.array(kids, dtype=np.int64)
    for j in range(d):
        k *= radix[j + 1]
        k += flat[cstart + j]
    return k


def _lookup(uniq: Any, last: Any, q: Any) -> Any:
    """Storage row of each query key (-1 when absent)."""
    import numpy as np

    I64 = np.int64
    if not len(q) or not len(uniq):
        return np.full(len(q), -1, dtype=I64)
    pos = np.searchsorted(uniq, q)
    np.minimum(pos, len(uniq) - 1, out=pos)
    miss = uniq[pos] != q
    out = last[pos].astype(I64, copy=False)
    del pos
    out[miss] = -1
    return out
