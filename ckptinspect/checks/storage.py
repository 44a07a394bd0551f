"""Storage: every stored item lies in an existing file (CK201, CK202), items do not overlap (CK203), no stale data
files (CK204); with `--deep`, every item is a valid torch archive whose payload is prod(sizes) × dtype (CK205).

The deep read is streamed item by item (one archive's central directory and `data.pkl` at a time: bounded memory)
and needs no torch. Megatron and torch write items back to back (reference §6), so a gap between items is fine
but an overlap is not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from ckptinspect.checks import CheckContext
from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats._files import read_item_archive
from ckptinspect.storage import location
from ckptinspect.model import Checkpoint, Format, StoredItem, dtype_size
from ckptinspect.safeio import leaves_dir

MAX_LISTED = 5


def _items(ckpt: Checkpoint) -> Iterator[tuple[str, StoredItem, str | None, int | None]]:
    """(subject, item, dtype, expected payload bytes) for every stored item of a DCP checkpoint."""
    for t in ckpt.tensors:
        size = dtype_size(t.dtype)
        for c in t.chunks:
            if c.storage is not None:
                yield t.key, c.storage, t.dtype, (math.prod(c.sizes) * size if size is not None else None)
    for o in ckpt.objects:
        if o.storage is not None:
            yield o.key, o.storage, None, None


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.format in (None, Format.TORCH):
        return
    if not ckpt.tensors and not ckpt.objects:
        return  # no readable .metadata: the format findings say why
    import numpy as np  # lazily: a million stored items are checked as arrays, not Python tuples

    sizes = {f.name: f.size for f in ckpt.files}
    file_ids: dict[str, int] = {}
    fid: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    subjects: list[str] = []
    for subject, item, _, _ in _items(ckpt):
        fid.append(file_ids.setdefault(item.file, len(file_ids)))
        starts.append(item.offset)
        ends.append(item.end)
        subjects.append(subject)
    names = list(file_ids)
    f_arr = np.array(fid, dtype=np.int64)
    s_arr = np.array(starts, dtype=np.int64)
    e_arr = np.array(ends, dtype=np.int64)
    counts = np.bincount(f_arr, minlength=len(names)) if len(names) else np.zeros(0, dtype=np.int64)
    file_size = np.full(len(names), -1, dtype=np.int64)
    for i, name in enumerate(names):
        size = sizes.get(name)
        if size is None:
            size = _size_outside_listing(location(ckpt.path), name)
        if size is None:
            first = int(np.argmax(f_arr == i))
            yield Finding("CK201", f"{name}: named by .metadata for {int(counts[i])} item(s) but does not exist",
                          name, ckpt.path, {"items": int(counts[i]), "example": subjects[first]})
        else:
            file_size[i] = size
    present = file_size[f_arr] >= 0 if len(f_arr) else np.zeros(0, dtype=bool)
    past = present & ((e_arr > file_size[f_arr]) | (s_arr < 0))
    for i in np.unique(f_arr[past]):
        idx = np.flatnonzero(past & (f_arr == i))
        worst = int(e_arr[idx].max())
        yield Finding(
            "CK202",
            f"{names[i]}: {len(idx)} item(s) extend past the end of the file ({int(file_size[i])} bytes; items reach"
            f" {worst}), e.g. {subjects[idx[0]]} — truncated",
            names[i], ckpt.path, {"file_size": int(file_size[i]), "items": int(len(idx)), "max_end": worst,
                                  "examples": [subjects[j] for j in idx[:MAX_LISTED]]},
        )
    if len(f_arr) > 1:
        order = np.lexsort((s_arr, f_arr))
        fs, ss, es = f_arr[order], s_arr[order], e_arr[order]
        # an item overlaps the one before it in its file (sorted by offset): the next starts before this one ends
        bad = np.flatnonzero((fs[1:] == fs[:-1]) & (ss[1:] < es[:-1]))
        for i in np.unique(fs[bad]):
            pairs = bad[fs[bad] == i]
            a, b = int(order[pairs[0]]), int(order[pairs[0] + 1])
            yield Finding(
                "CK203", f"{names[i]}: {len(pairs)} overlapping stored item pair(s), e.g. {subjects[a]}"
                f" [{starts[a]}, {ends[a]}) and {subjects[b]} [{starts[b]}, {ends[b]})", names[i], ckpt.path,
                {"pairs": int(len(pairs))},
            )
    for name in names:
        if leaves_dir(name):
            i = names.index(name)
            yield Finding("CK207", f"{name}: .metadata places {int(counts[i])} stored item(s) outside the checkpoint "
                          "dir; DCP would read (and unpickle) them from there", name, ckpt.path,
                          {"items": int(counts[i])})
    referenced = set(file_ids)
    for f in ckpt.files:
        if f.name.endswith(".distcp") and f.name not in referenced:
            yield Finding("CK204", f"{f.name}: data file not referenced by .metadata (stale leftover?)", f.name,
                          ckpt.path, {"bytes": f.size})
    if ctx.deep:
        yield from _deep(ckpt, ctx, sizes)


def _size_outside_listing(root: Path, name: str) -> int | None:
    from ckptinspect.formats._files import regular_size

    return regular_size(root / name) if "/" in name else None


def _deep(ckpt: Checkpoint, ctx: CheckContext, sizes: dict[str, int | None]) -> Iterator[Finding]:
    root = location(ckpt.path)
    items = [x for x in _items(ckpt) if sizes.get(x[1].file) is not None and x[1].end <= (sizes[x[1].file] or 0)]
    total = sum(i[1].length for i in items)
    bad = 0
    for subject, item, dtype, expected in items:
        problem = _deep_one(root, item, dtype, expected)
        if ctx.progress is not None:
            ctx.progress(item.length, total, "deep read")
        if problem is not None:
            bad += 1
            if bad <= 50:
                yield Finding("CK205", f"{subject}: stored item in {item.file} at {item.offset}: {problem}",
                              subject, ckpt.path, {"file": item.file, "offset": item.offset, "length": item.length})
    if bad > 50:
        yield Finding("CK205", f"{bad - 50} more stored item(s) are invalid", None, ckpt.path, {"more": bad - 50})


def _deep_one(root: Path, item: StoredItem, dtype: str | None, expected: int | None) -> str | None:
    try:
        archive = read_item_archive(root, item)
    except ReadError as e:
        return f"not a valid archive ({e})"
    if dtype is None:
        return None  # a byte item: a readable archive is all we can ask
    data = [r for name, r in archive.records.items() if name.startswith("data/")]
    payload = sum(r.size for r in data)
    if expected is not None and payload != expected and not (expected == 0 and not data):
        return f"payload is {payload} bytes, expected {expected} (prod(sizes) × {dtype})"
    return None
