"""The batch paths on a writer that shares objects otherwise than the project's generator (issue 31).

`tools/make_other_sharing_ckpt.py` pickles torch's own DCP classes with plain `pickle.dump` at protocols 2-5, with
Megatron-style `all_local_plans` whose WriteItems carry their OWN ChunkStorageMetadata (not memo references to the
`state_dict_metadata` chunks), and key strings either one object everywhere or a new one at every use. On such files
the streaming reader must build exactly the loop's and the reference's model (as `test_stream_batch.py` checks on
the samples and on torch objects), count the pickle's memo slots as the loop does, and leave to the loop fewer than
1 % of each kind of record (`ReadStats`) at protocols 4 and 5. Protocols 2 and 3 write BINPUT, not MEMOIZE: no
record pattern matches there, the loop reads them all (and must still agree).
"""

from __future__ import annotations

import importlib.util
import io
import pickle
from pathlib import Path

import pytest

from ckptinspect.formats.dcp.metadata import read_dcp_metadata
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.dcp.vm_stats import KINDS, ReadStats

REPO = Path(__file__).resolve().parents[3]
GENERATOR = REPO / "tools" / "make_other_sharing_ckpt.py"
CASES = [(proto, strings) for proto in (2, 3, 4, 5) for strings in ("one", "fresh")]


@pytest.fixture(scope="module")
def other() -> dict[tuple[int, str], bytes]:
    """~2k chunks, each string sharing pickled at each protocol: the generator's own `build`, `pickle.dumps` as
    its `main` does (in this process: one torch import, not one per file)."""
    spec = importlib.util.spec_from_file_location("make_other_sharing_ckpt", GENERATOR)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = {}
    for strings in ("one", "fresh"):
        md, _ = gen.build(2000, 8, strings, 0, "other")
        for proto in (2, 3, 4, 5):
            out[(proto, strings)] = pickle.dumps(md, protocol=proto)
    return out


def _read(data: bytes, **kw: object) -> tuple[object, ReadStats]:
    stats = ReadStats()
    md = read_metadata(io.BytesIO(data), stats=stats, **kw)  # type: ignore[arg-type]
    return md, stats


@pytest.mark.parametrize("proto,strings", CASES, ids=[f"p{p}-{s}" for p, s in CASES])
def test_batch_equals_loop_equals_reference(other: dict[tuple[int, str], bytes], proto: int, strings: str) -> None:
    data = other[(proto, strings)]
    batch, b_stats = _read(data, fast_from=0)  # the batch paths from the first memo slot
    loop, l_stats = _read(data, fast=False)
    ref = read_dcp_metadata(data)
    assert b_stats.fallback is None and l_stats.fallback is None
    assert batch == loop
    assert batch == ref
    assert len(ref.tensors) > 20 and sum(len(t.chunks) for t in ref.tensors) >= 2000
    assert sum(batch.rank_items) == len(ref.objects) + sum(len(t.chunks) for t in ref.tensors)  # type: ignore
    # the model holds only the plans' item counts: a walk that miscounts the memo inside the plans would still
    # build it, so the count itself is compared
    assert b_stats.memo_slots == l_stats.memo_slots == _memo_ops(data)
    assert sum(l_stats.batch.values()) == 0


def _memo_ops(data: bytes) -> int:
    """The pickle's memo stores (MEMOIZE, or BINPUT / LONG_BINPUT at protocols 2-3, each of a new slot here)."""
    import pickletools

    return sum(1 for op, _, _ in pickletools.genops(data) if op.name in ("MEMOIZE", "BINPUT", "LONG_BINPUT"))


@pytest.mark.parametrize("proto,strings", [c for c in CASES if c[0] >= 4], ids=lambda c: str(c))
def test_few_records_fall_to_the_loop(other: dict[tuple[int, str], bytes], proto: int, strings: str) -> None:
    """Every kind of record through the batch paths but for < 1 % (a FRAME opcode inside a record, every 64 KiB,
    and the first record of a kind, which names its globals, are the loop's). Before the plan pattern knew a plan
    item's own chunk object, 99 % of the plan records fell to the loop here."""
    _, stats = _read(other[(proto, strings)], fast_from=0)
    for kind in KINDS:
        assert stats.batch[kind] + stats.loop[kind] >= 2000, (kind, stats)
        assert stats.share(kind) < 0.01, (kind, stats)


def test_protocols_2_and_3_are_the_loops(other: dict[tuple[int, str], bytes]) -> None:
    """BINPUT instead of MEMOIZE: no batch pattern matches; every record is counted as the loop's."""
    _, stats = _read(other[(2, "one")], fast_from=0)
    assert sum(stats.batch.values()) == 0
    assert stats.share("plan") == 1.0
