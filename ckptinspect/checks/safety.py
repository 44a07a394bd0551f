"""Pickle safety of the byte items inside `.distcp` files (rng state, extra state, optimizer misc, common state).

The readers already report what `.metadata`, `common.pt`, the common-state item and legacy `.pt` files reference
(CK601 / CK602). This check unpickles every other byte item through the allowlisting unpickler — nothing is
executed — and reports the same codes. Byte items are small, but a giant checkpoint can hold tens of thousands of
them: without `--deep` only the first `MAX_ITEMS` are read (the rest are covered by `scan` and `audit --deep`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ckptinspect.checks import CheckContext
from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats._files import pickle_findings, read_item_archive, regular_size
from ckptinspect.formats.torch_dist import COMMON_STATE_KEY
from ckptinspect.model import Checkpoint

MAX_ITEMS = 2000


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    root = Path(ckpt.path)
    items = [o for o in ckpt.objects if o.storage is not None and o.key != COMMON_STATE_KEY]
    if not ctx.deep:
        items = items[:MAX_ITEMS]
    sizes: dict[str, int | None] = {}
    for o in items:
        assert o.storage is not None
        name = o.storage.file
        if name not in sizes:
            sizes[name] = regular_size(root / name)
        size = sizes[name]
        if size is None or o.storage.end > size:
            continue  # CK201 / CK202 say why it cannot be read
        try:
            archive = read_item_archive(root, o.storage)
        except ReadError:
            continue  # not an archive: CK205 under --deep
        yield from pickle_findings(archive.report, o.key, ckpt.path)
