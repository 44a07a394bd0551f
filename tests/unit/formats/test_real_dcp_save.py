"""The batch paths on torch's own `dcp.save` encoding (issue 31 (d)): `tests/data/dcp_real_300/.metadata`.

A real `dcp.save` pickles every plain tensor's chunk list as a list of ONE chunk, which CPython's picklers write
without MARK (`]` MEMOIZE, the chunk, APPEND), where the project's generators write MARK ... APPENDS. The chunk runs
must cross such lists (one run per few hundred tensors, not one per tensor: `ReadStats.runs`) and build exactly the
loop's and the reference's model, counting the memo slots as the loop does.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ckptinspect.formats.dcp.metadata import read_dcp_metadata
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.dcp.vm_stats import ReadStats

REAL = Path(__file__).resolve().parents[2] / "data" / "dcp_real_300" / ".metadata"


def _read(data: bytes, **kw: object) -> tuple[object, ReadStats]:
    stats = ReadStats()
    md = read_metadata(io.BytesIO(data), stats=stats, **kw)  # type: ignore[arg-type]
    return md, stats


@pytest.fixture(scope="module")
def data() -> bytes:
    return REAL.read_bytes()


def test_batch_equals_loop_equals_reference(data: bytes) -> None:
    batch, b_stats = _read(data, fast_from=0)
    loop, l_stats = _read(data, fast=False)
    ref = read_dcp_metadata(data)
    assert b_stats.fallback is None and l_stats.fallback is None
    assert batch == loop == ref
    assert len(ref.tensors) == 300 and sum(len(t.chunks) for t in ref.tensors) == 400
    assert b_stats.memo_slots == l_stats.memo_slots


def test_one_chunk_lists_do_not_end_the_run(data: bytes) -> None:
    """Nearly every chunk and storage entry through the batch paths, in a few runs: before the chunk runs knew
    APPEND, every one-chunk tensor was a run of its own (300 runs)."""
    _, stats = _read(data, fast_from=0)
    for kind in ("chunk", "storage"):
        assert stats.batch[kind] + stats.loop[kind] >= 400
        assert stats.share(kind) < 0.01, (kind, stats)
    assert stats.runs["chunk"] <= 10, stats


def test_two_chunks_without_mark_are_not_a_one_chunk_list(data: bytes) -> None:
    """A DTensor's list of two chunks (`]` MEMOIZE MARK c1 c2 APPENDS) edited to `]` MEMOIZE c1 c2 APPEND (no memo
    slot moves): APPEND takes c2 only and c1 stays on the stack, which the loop and the reference refuse. The
    batch run must be cut there, not take the two rows as the list's one item (a model of two chunks the reference
    never builds)."""
    import re

    from ckptinspect.errors import ReadError
    from ckptinspect.formats.dcp.vm_patterns import CHUNK

    chunk = re.compile(b"".join(CHUNK.parts[:-1]), re.DOTALL)  # one chunk record, without its boundary group
    pairs = []
    for m in re.finditer(rb"\]\x94\(", data):
        c1 = chunk.match(data, m.end())
        c2 = chunk.match(data, c1.end()) if c1 is not None else None
        if c2 is not None and data[c2.end():c2.end() + 1] == b"e":
            pairs.append((m.end() - 1, c2.end()))
    assert len(pairs) >= 90  # the 100 DTensors (a FRAME may sit inside one)
    mark, end = pairs[50]
    edited = data[:mark] + data[mark + 1:end] + b"a" + data[end + 1:]
    errors = []
    for kw in ({"fast_from": 0}, {"fast": False}):
        with pytest.raises(ReadError) as e:
            _read(edited, **kw)
        errors.append(str(e.value))
    with pytest.raises(ReadError) as ref:
        read_dcp_metadata(edited)
    assert errors == [str(ref.value)] * 2
