"""Storage: every stored item lies in an existing file (CK201, CK202) that this user can open (CK209, through
`io.local.probe_readable`), items do not overlap (CK203), no stale data files (CK204); with `--deep`, every item is a
valid torch archive whose payload is prod(sizes) × dtype (CK205).

The deep read is streamed item by item (one archive's central directory and `data.pkl` at a time: bounded memory),
file by file in offset order through one open handle per file, and needs no torch. The item arrays come from the
chunk table's columns: no object per chunk. Megatron and torch write items back to back (reference §6), so a gap
between items is fine but an overlap is not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ckptinspect.checks import CheckContext
from ckptinspect.errors import UNREAD_CODE, LimitExceeded, ReadError
from ckptinspect.findings import Finding
from ckptinspect.checks.columns import chunk_tensor_ids
from ckptinspect.formats.files import ItemFiles
from ckptinspect.formats.transforms import MAX_DECODED_BYTES, Undecodable, tensor_bound
from ckptinspect.io import location
from ckptinspect.model import Checkpoint, Format, ShardedBackend, StoredItem, dtype_size
from ckptinspect.model.chunk_table import ChunkTable
from ckptinspect.io.local import leaves_dir, probe_readable

MAX_LISTED = 5


def _items(ckpt: Checkpoint) -> Iterator[tuple[str, StoredItem, str | None, int | None]]:
    """(subject, item, dtype, expected payload bytes) for every stored item of a DCP checkpoint: the chunk table's
    rows in order (one object at a time), then the byte items."""
    table = ckpt.table
    for t, key in enumerate(table.keys):
        dtype = table.dtypes[t]
        size = dtype_size(dtype)
        for r in table.chunk_rows(t):
            item = table.stored(r)
            if item is not None:
                yield key, item, dtype, (_numel(table, r) * size if size is not None else None)
    for o in ckpt.objects:
        if o.storage is not None:
            yield o.key, o.storage, None, None


def _numel(table: ChunkTable, r: int) -> int:
    """Elements of chunk row `r` (exact: Python ints)."""
    return math.prod(table.sizes[table.coord_start[r]:table.coord_start[r + 1]].tolist())


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.format in (None, Format.TORCH, Format.NVRX_LOCAL):
        return  # per-rank torch.save files: the reader read every one whole (its records checked there)
    if not ckpt.tensors and not ckpt.objects:
        return  # no readable .metadata: the format findings say why
    import numpy as np  # lazily: a million stored items are checked as arrays, not Python tuples

    sizes = {f.name: f.size for f in ckpt.files}
    names, f_arr, s_arr, e_arr, subject = _arrays(ckpt)
    counts = np.bincount(f_arr, minlength=len(names)) if len(names) else np.zeros(0, dtype=np.int64)
    file_size = np.full(len(names), -1, dtype=np.int64)
    root = location(ckpt.data_dir)
    for i, name in enumerate(names):
        size = sizes.get(name)
        if size is None:
            size = _size_outside_listing(root, name)
        if size is not None and not leaves_dir(name):
            # complete means readable: a data file this user may not open is noted for CK209 (one open, no read)
            probe_readable(root / name)
        if size is None:
            first = int(np.argmax(f_arr == i))
            yield Finding("CK201", f"{name}: named by .metadata for {int(counts[i])} item(s) but does not exist",
                          name, ckpt.path, {"items": int(counts[i]), "example": subject(first)})
        else:
            file_size[i] = size
    present = file_size[f_arr] >= 0 if len(f_arr) else np.zeros(0, dtype=bool)
    if ckpt.format is Format.SAFETENSORS:
        present[:] = False  # spans past the file or overlapping: the reader's CK146 / CK147 name each tensor
    past = present & ((e_arr > file_size[f_arr]) | (s_arr < 0))
    for i in np.unique(f_arr[past]):
        idx = np.flatnonzero(past & (f_arr == i))
        worst = int(e_arr[idx].max())
        yield Finding(
            "CK202",
            f"{names[i]}: {len(idx)} item(s) extend past the end of the file ({int(file_size[i])} bytes; items reach"
            f" {worst}), e.g. {subject(int(idx[0]))} — truncated",
            names[i], ckpt.path, {"file_size": int(file_size[i]), "items": int(len(idx)), "max_end": worst,
                                  "examples": [subject(int(j)) for j in idx[:MAX_LISTED]]},
        )
    if len(f_arr) > 1 and ckpt.format is not Format.SAFETENSORS:
        order = np.lexsort((s_arr, f_arr))
        fs, ss, es = f_arr[order], s_arr[order], e_arr[order]
        # an item overlaps the one before it in its file (sorted by offset): the next starts before this one ends
        bad = np.flatnonzero((fs[1:] == fs[:-1]) & (ss[1:] < es[:-1]))
        for i in np.unique(fs[bad]):
            pairs = bad[fs[bad] == i]
            a, b = int(order[pairs[0]]), int(order[pairs[0] + 1])
            yield Finding(
                "CK203", f"{names[i]}: {len(pairs)} overlapping stored item pair(s), e.g. {subject(a)}"
                f" [{int(s_arr[a])}, {int(e_arr[a])}) and {subject(b)} [{int(s_arr[b])}, {int(e_arr[b])})", names[i],
                ckpt.path,
                {"pairs": int(len(pairs))},
            )
    for name in names:
        if leaves_dir(name):
            i = names.index(name)
            yield Finding("CK207", f"{name}: .metadata places {int(counts[i])} stored item(s) outside the checkpoint "
                          "dir; DCP would read (and unpickle) them from there", name, ckpt.path,
                          {"items": int(counts[i])})
    referenced = set(names)
    unreferenced = [f for f in ckpt.files if f.name.endswith(".distcp") and f.name not in referenced]
    empty_end = bool(unreferenced) and _has_zero_size_chunk(ckpt)
    for f in unreferenced:
        if empty_end and _WRITER_NAME.fullmatch(f.name) and _holds_only_an_empty_tensor(ckpt, f.name, f.size):
            yield Finding("CK210", f"{f.name}: data file not referenced by .metadata, the writer's own: it holds one "
                          "zero-element tensor, a rank's empty shard that DCP's plan merge folded into another rank's",
                          f.name, ckpt.path, {"bytes": f.size})
            continue
        yield Finding("CK204", f"{f.name}: data file not referenced by .metadata (stale leftover?)", f.name,
                      ckpt.path, {"bytes": f.size})
    if ctx.deep:
        yield from _deep(ckpt, ctx, sizes)


# `FileSystemWriter`'s data file names (`__{rank}_{n}.distcp`, torch/distributed/checkpoint/filesystem.py)
_WRITER_NAME = re.compile(r"__\d+_\d+\.distcp")


def _has_zero_size_chunk(ckpt: Checkpoint) -> bool:
    """A chunk of no element: several ranks' empty shards at one offset (Megatron's uneven 1-D sharding gives the last
    ranks empty shards at the end) have one `MetadataIndex` (fqn, offset), so the global plan keeps one of them, and
    the other ranks' data files, written in the same save, are named by nothing."""
    return bool((ckpt.table.sizes == 0).any())


_EMPTY_FILE_BOUND = 1 << 20


def _holds_only_an_empty_tensor(ckpt: Checkpoint, name: str, size: int | None) -> bool:
    """The data file is one torch archive (a DCP item) whose object is a tensor of no element."""
    from ckptinspect.pickling.builders import TensorRef

    if size is None or size > _EMPTY_FILE_BOUND:
        return False
    try:
        with ItemFiles(location(ckpt.data_dir)) as files:
            archive = files.archive(StoredItem(name, 0, size))
    except (OSError, ReadError):
        return False
    return not archive.report.unsafe and isinstance(archive.obj, TensorRef) and archive.obj.numel == 0


def _arrays(ckpt: Checkpoint) -> tuple[list[str], Any, Any, Any, Callable[[int], str]]:
    """(file names in first-use order, file index / start / end of every stored item, subject of item i): the chunk
    table's columns (no object per chunk), then the byte items."""
    import numpy as np

    table = ckpt.table
    rows = np.flatnonzero(table.file_id >= 0)
    tid = chunk_tensor_ids(table)[rows]
    f = table.file_id[rows].astype(np.int64)
    uniq, first = np.unique(f, return_index=True)
    used = uniq[np.argsort(first, kind="stable")]
    remap = np.full(len(table.files), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    names = [table.files[i] for i in used.tolist()]
    file_ids = {n: i for i, n in enumerate(names)}
    o_f, o_s, o_e, o_subj = [], [], [], []
    for o in ckpt.objects:
        if o.storage is not None:
            o_f.append(file_ids.setdefault(o.storage.file, len(file_ids)))
            o_s.append(o.storage.offset)
            o_e.append(o.storage.end)
            o_subj.append(o.key)
    names = list(file_ids)
    n = len(rows)
    f_arr = np.concatenate((remap[f], np.array(o_f, dtype=np.int64)))
    s_arr = np.concatenate((table.byte_offset[rows], np.array(o_s, dtype=np.int64)))
    e_arr = np.concatenate((table.byte_offset[rows] + table.byte_length[rows], np.array(o_e, dtype=np.int64)))

    def subject(i: int) -> str:
        return table.keys[int(tid[i])] if i < n else o_subj[i - n]

    return names, f_arr, s_arr, e_arr, subject


def _size_outside_listing(root: Path, name: str) -> int | None:
    from ckptinspect.formats.files import regular_size

    return regular_size(root / name) if "/" in name else None


def _deep(ckpt: Checkpoint, ctx: CheckContext, sizes: dict[str, int | None]) -> Iterator[Finding]:
    """Read every stored item, file by file in offset order: one open handle per `.distcp` file, sequential reads.
    zarr chunk files are raw array bytes, not torch archives: only their length is checked (CK201/CK202 above)."""
    zarr = ckpt.sharded_backend is ShardedBackend.ZARR or ckpt.raw_tensor_items  # safetensors data: raw too

    def readable(item: StoredItem, dtype: str | None) -> bool:
        size = sizes.get(item.file)
        return size is not None and item.end <= size and not (zarr and dtype is not None)

    total = sum(item.length for _, item, dtype, _ in _items(ckpt) if readable(item, dtype))
    bad = 0
    with ItemFiles(location(ckpt.data_dir)) as files:
        for subject, item, dtype, expected in _items_by_position(ckpt):
            if not readable(item, dtype):
                continue
            problem = _deep_one(files, item, dtype, expected)
            if ctx.progress is not None:
                ctx.progress(item.length, total, "deep read")
            if problem is not None:
                bad += 1
                if bad <= 50:
                    yield Finding("CK205", f"{subject}: stored item in {item.file} at {item.offset}: {problem}",
                                  subject, ckpt.path, {"file": item.file, "offset": item.offset,
                                                       "length": item.length})
    if bad > 50:
        yield Finding("CK205", f"{bad - 50} more stored item(s) are invalid", None, ckpt.path, {"more": bad - 50})


def _items_by_position(ckpt: Checkpoint) -> Iterator[tuple[str, StoredItem, str | None, int | None]]:
    """`_items` ordered by (file, offset): the chunk table's rows sorted as arrays, made into objects one at a time.
    Files in the table's order (the order `.metadata` names them), then the files only byte items are in."""
    import numpy as np

    table = ckpt.table
    rows = np.flatnonzero(table.file_id >= 0)
    objs = [o for o in ckpt.objects if o.storage is not None]
    fids = {name: i for i, name in enumerate(table.files)}
    o_file = np.array([fids.setdefault(o.storage.file, len(fids)) for o in objs if o.storage], dtype=np.int64)
    o_pos = np.array([o.storage.offset for o in objs if o.storage], dtype=np.int64)
    f_all = np.concatenate((table.file_id[rows].astype(np.int64), o_file))
    p_all = np.concatenate((table.byte_offset[rows], o_pos))
    tid = chunk_tensor_ids(table)
    n = len(rows)
    for j in np.lexsort((p_all, f_all)).tolist():
        if j >= n:
            o = objs[j - n]
            assert o.storage is not None
            yield o.key, o.storage, None, None
            continue
        r = int(rows[j])
        t = int(tid[r])
        item = table.stored(r)
        dtype = table.dtypes[t]
        size = dtype_size(dtype)
        assert item is not None
        yield table.keys[t], item, dtype, (_numel(table, r) * size if size is not None else None)


def _deep_one(files: ItemFiles, item: StoredItem, dtype: str | None, expected: int | None) -> str | None:
    # A stream-transformed item is decoded up to what its tensor needs (any byte item: a fixed bound), through a
    # spooled file (`formats/transforms.py`): memory stays bounded whatever the tensor's size.
    bound = tensor_bound(expected) if expected is not None else MAX_DECODED_BYTES
    try:
        archive = files.archive(item, bound)
    except ReadError as e:
        if item.transforms and (isinstance(e, (Undecodable, LimitExceeded))):
            return None  # the safety check, which decodes the same item, reports CK208 / CK603 once
        if e.code == UNREAD_CODE:
            return None  # a file this user may not read: CK209 (noted by `io.local`), never "not a valid archive"
        return f"not a valid archive ({e})"
    if dtype is None:
        return None  # a byte item: a readable archive is all we can ask
    data = [r for name, r in archive.records.items() if name.startswith("data/")]
    payload = sum(r.size for r in data)
    if expected is not None and payload != expected and not (expected == 0 and not data):
        return f"payload is {payload} bytes, expected {expected} (prod(sizes) × {dtype})"
    return None
