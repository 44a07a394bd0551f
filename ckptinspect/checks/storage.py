"""Storage: every stored item lies in an existing file (CK201, CK202), items do not overlap (CK203), no stale data
files (CK204); with `--deep`, every item is a valid torch archive whose payload is prod(sizes) × dtype (CK205).

The deep read is streamed item by item (one archive's central directory and `data.pkl` at a time: bounded memory)
and needs no torch. Megatron and torch write items back to back (reference §6), so a gap between items is fine
but an overlap is not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from ckptinspect.checks import CheckContext
from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats._files import read_item_archive
from ckptinspect.model import Checkpoint, Format, StoredItem, dtype_size

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
    sizes = {f.name: f.size for f in ckpt.files}
    by_file: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for subject, item, _, _ in _items(ckpt):
        by_file[item.file].append((item.offset, item.end, subject))
    for name in sorted(by_file):
        spans = by_file[name]
        size = sizes.get(name)
        if size is None:
            size = _size_outside_listing(Path(ckpt.path), name)
        if size is None:
            yield Finding("CK201", f"{name}: named by .metadata for {len(spans)} item(s) but does not exist",
                          name, ckpt.path, {"items": len(spans), "example": spans[0][2]})
            continue
        past = [s for s in spans if s[1] > size or s[0] < 0]
        if past:
            worst = max(s[1] for s in past)
            yield Finding(
                "CK202",
                f"{name}: {len(past)} item(s) extend past the end of the file ({size} bytes; items reach {worst}),"
                f" e.g. {past[0][2]} — truncated",
                name, ckpt.path, {"file_size": size, "items": len(past), "max_end": worst,
                                  "examples": [s[2] for s in past[:MAX_LISTED]]},
            )
        spans.sort()
        overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
        if overlaps:
            a, b = overlaps[0]
            yield Finding(
                "CK203", f"{name}: {len(overlaps)} overlapping stored item pair(s), e.g. {a[2]} [{a[0]}, {a[1]}) and"
                f" {b[2]} [{b[0]}, {b[1]})", name, ckpt.path, {"pairs": len(overlaps)},
            )
    referenced = set(by_file)
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
    root = Path(ckpt.path)
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
