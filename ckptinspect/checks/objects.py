"""Sharded-object families: each `key/shard_<offsets>_<shape>` family fills its grid exactly once (CK305, CK306).

`rng_state` is the (PP, TP) grid (written by DP rank 0 of each model-parallel group), `rerun_state_machine_state`
the world, `…_extra_state` the layer axis, `common_state` a 1-cell grid (Megatron `validation.py` `_validate_objects
_for_key`: duplicates are an error, and `len(unique) != prod(global_shape)` means objects are missing).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator

from ckptinspect.checks import CheckContext
from ckptinspect.findings import Finding
from ckptinspect.model import Checkpoint, ObjectItem

MAX_LISTED = 8


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    families: dict[str, list[ObjectItem]] = defaultdict(list)
    for o in ckpt.objects:
        if o.grid is not None and o.offset is not None:
            families[o.family].append(o)
    for family in sorted(families):
        yield from _family(family, families[family], ckpt.path)


def _family(family: str, items: list[ObjectItem], path: str) -> Iterator[Finding]:
    grids = {o.grid for o in items if o.grid is not None}
    if len(grids) > 1:
        yield Finding("CK306", f"{family}: inconsistent global shapes {sorted(grids)}", family, path,
                      {"shapes": [list(g) for g in sorted(grids) if g]})
        return
    grid = next(iter(grids))
    if any(d < 0 for d in grid):
        return  # old keys without a full shape (`empty_from_unique_key` appends -1): nothing to fill
    seen: dict[tuple[int, ...], int] = defaultdict(int)
    outside = []
    for o in items:
        assert o.offset is not None
        if len(o.offset) != len(grid) or any(not 0 <= x < d for x, d in zip(o.offset, grid)):
            outside.append(o.key)
        else:
            seen[o.offset] += 1
    dups = sorted(k for k, n in seen.items() if n > 1)
    if dups or outside:
        yield Finding("CK306", f"{family}: {len(dups)} duplicate cell(s) {dups[:MAX_LISTED]}"
                      + (f", {len(outside)} cell(s) outside the {grid} grid" if outside else ""),
                      family, path, {"duplicates": [list(d) for d in dups[:MAX_LISTED]], "outside": outside[:8]})
    cells = math.prod(grid)
    if len(seen) < cells:
        if cells <= 1_000_000:
            missing = [c for c in itertools.product(*(range(d) for d in grid)) if c not in seen]
        else:
            missing = []
        shown = ", ".join(".".join(map(str, m)) for m in missing[:MAX_LISTED])
        yield Finding("CK305", f"{family}: {cells - len(seen)} of {cells} grid cell(s) missing"
                      + (f" (shard {shown}{', ...' if len(missing) > MAX_LISTED else ''})" if shown else ""),
                      family, path, {"grid": list(grid), "missing": [list(m) for m in missing[:MAX_LISTED]],
                                     "missing_count": cells - len(seen)})
