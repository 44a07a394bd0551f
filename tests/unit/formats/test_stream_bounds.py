"""Runs of the streaming `.metadata` reader that cross list, object and batch boundaries (`vm_bounds.py`),
and the storage join of `formats/dcp/table.py`.

A run of chunks goes on over the end of a tensor's chunk list into the next `state_dict_metadata` entry, a run of
storage entries over the SETITEMS batches of `storage_data`, a run of WriteItems over the end of a `SavePlan` into
the next one, and every run over the APPENDS batches (1,000 items) of a long list. Those boundaries are replayed with
the walker's own steps; the result must be the opcode loop's and the reference unpickler's, on `Metadata` objects of
torch's own classes pickled by `pickle.dumps` (protocols 4 and 5), with the replays counted so that a test cannot pass
without them. A stack the loop refuses at a replayed step must end the walk as the loop's refusal does, and a
dangerous global in a SavePlan between two runs must still be reported.
"""

from __future__ import annotations

import io
import os
import pickle
import random
from typing import Any

import numpy as np
import pytest

from ckptinspect.formats.dcp import table as dcp_table
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.dcp import vm_fast
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.formats.dcp.vm_eval import Fallback
from ckptinspect.pickling.unpickle import PickleReport
from test_stream_batch import assert_batch_equals_loop, outcome


def _metadata(planner_data: Any = None, huge: bool = False, shared: bool = False) -> Any:
    """torch `Metadata`: 30 tensors (one of 2,500 chunks: three APPENDS batches), byte items between them, ~3,300
    storage entries (four SETITEMS batches), four SavePlans (one of 2,100 items). `planner_data`: the second plan's
    (anything picklable); `huge`: one 2-d tensor with chunk offsets near 2**31 x 2**30 (the join's key no longer
    packs into one int64); `shared`: two keys name the same TensorStorageMetadata object."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    rng = random.Random(7)
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    plans: list[list[Any]] = [[] for _ in range(4)]
    pos = [0] * 4
    for t in range(30):
        n_chunks = 2500 if t == 3 else rng.choice([1, 2, 5, 17])
        nd = 2 if t % 4 == 0 else 1
        step = 2**30 if huge and t == 8 else 64
        shape = [n_chunks * step] + [rng.choice([8, 4096])] * (nd - 1)
        props = TensorProperties(dtype=rng.choice([torch.float32, torch.bfloat16]))
        chunks = []
        fqn = f"layers.{t}.weight"
        for c in range(n_chunks):
            offs = torch.Size([c * step] + [0] * (nd - 1))
            if huge and t == 8:
                offs = torch.Size([c * step, 2**30 if nd > 1 else 0][:nd])
                shape = [n_chunks * step, 2**30 + 8][:nd]
            sizes = torch.Size([step] + shape[1:]) if not (huge and t == 8) else torch.Size([step, 8][:nd])
            chunk = ChunkStorageMetadata(offsets=offs, sizes=sizes)
            chunks.append(chunk)
            rank = 1 if t == 3 else rng.randrange(4)
            storage[MetadataIndex(fqn, offs)] = _StorageInfo(f"__{rank}_0.distcp", pos[rank], 100)
            pos[rank] += 100
            plans[rank].append(WriteItem(MetadataIndex(fqn, offs), WriteItemType.SHARD,
                                         tensor_data=TensorWriteData(chunk, props, torch.Size(shape))))
        sdm[fqn] = TensorStorageMetadata(props, torch.Size(shape), chunks)
        if t % 6 == 5:
            key = f"extra_state.{t}"
            sdm[key] = BytesStorageMetadata()
            storage[MetadataIndex(key)] = _StorageInfo("__0_0.distcp", pos[0], 10)
            pos[0] += 10
            plans[0].append(WriteItem(MetadataIndex(key), WriteItemType.BYTE_IO))
        if shared and t == 10:
            sdm["alias.of.layers.10"] = sdm[fqn]
    md = Metadata(sdm, storage_data=storage)
    saved = [SavePlan(items) for items in plans]
    if planner_data is not None:
        saved[1] = SavePlan(plans[1], planner_data=planner_data)
    md.all_local_plans = saved  # type: ignore[attr-defined]
    return md


def _replays(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Boundaries replayed per kind (the rows that end with one)."""
    seen = {"tensor": 0, "storage": 0, "plan": 0}
    for kind in seen:
        real = getattr(vm_fast, f"{kind}_segments")

        def counted(*a: Any, _real: Any = real, _kind: str = kind) -> None:
            seen[_kind] += len(a[2] if _kind == "storage" else a[3])
            _real(*a)

        monkeypatch.setattr(vm_fast, f"{kind}_segments", counted)
    return seen


@pytest.mark.parametrize("proto", [4, 5])
def test_runs_cross_boundaries_and_build_the_loops_table(proto: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pickle.dumps(_metadata(), protocol=proto)
    seen = _replays(monkeypatch)
    assert_batch_equals_loop(data)
    # 30 tensors and 2 more APPENDS batches of tensor 3; 3,300 entries in batches of 1,000; 3 SavePlan ends and
    # 2 more batches of plan 1 (each count: the boundaries some run crossed; the loop reads the others)
    assert seen["tensor"] >= 10 and seen["storage"] >= 2 and seen["plan"] >= 3, seen


def test_a_step_the_loop_refuses_inside_a_replay_ends_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor 3's state is a list, not a dict: the loop refuses its SETITEMS; in a batch run (its 2,500 chunks and
    the boundary after them) that SETITEMS is replayed, and its refusal must end the walk (the reference decides),
    not hand the half-changed walk back to the loop."""
    data = pickle.dumps(_metadata(), protocol=4)
    key = data.index(b"layers.3.weight")
    head = data.index(b")\x81\x94}\x94(", key)  # its EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT
    edited = data[:head + 3] + b"]" + data[head + 4:]
    seen = _replays(monkeypatch)
    assert_batch_equals_loop(edited)
    assert seen["tensor"] >= 1  # the replay ran into it
    s = read_metadata(io.BytesIO(edited), fast_from=0) if outcome(edited)[0] == "ok" else None
    assert s is None or s.fallback is not None


def test_a_fallback_after_a_replay_changed_the_walk_is_not_handed_back_to_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that has changed the walk's state and then meets a step the loop refuses: the reader must fall back
    with that reason (the reference reads this valid file), not let the loop go on from the changed state."""
    def replay_then_refuse(ctx: Any, *a: Any) -> None:
        ctx.dirty = True
        ctx.w.stack.append("half a replay")
        raise Fallback("refused inside a replay")

    monkeypatch.setattr(vm_fast, "tensor_segments", replay_then_refuse)
    data = pickle.dumps(_metadata(), protocol=4)
    s = read_metadata(io.BytesIO(data), fast_from=0)
    assert s.fallback == "refused inside a replay"
    assert s == outcome(data, reference=True)[1]


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_a_dangerous_global_in_a_saveplan_between_runs_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    data = pickle.dumps(_metadata(planner_data={"x": _Evil()}), protocol=4)
    seen = _replays(monkeypatch)
    report = PickleReport()
    try:
        read_metadata(io.BytesIO(data), report, fast_from=0)
    except Exception:  # noqa: BLE001 - only the verdict matters here
        pass
    assert seen["plan"] >= 1  # plan runs crossed SavePlan boundaries before and after it
    assert any(v is not GlobalClass.ALLOWED for q, v in report.globals.items() if q.endswith("system")), \
        report.globals


def test_join_when_keys_do_not_pack_and_when_tensors_are_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk offsets near 2**31 x 2**30 (the (key, offsets) rows are compared as bytes), and two keys naming one
    TensorStorageMetadata (the table is not in read order): the batch paths and the loop against the reference."""
    calls = {"packed": 0}
    real = dcp_table._packed

    def counted(*a: Any) -> Any:
        calls["packed"] += 1
        return real(*a)

    monkeypatch.setattr(dcp_table, "_packed", counted)
    huge = pickle.dumps(_metadata(huge=True), protocol=4)
    assert_batch_equals_loop(huge)
    assert calls["packed"]  # the other dims did pack
    shared = pickle.dumps(_metadata(shared=True), protocol=4)
    fast, loop = outcome(shared, fast_from=0), outcome(shared, fast=False)
    assert fast == loop and fast[0] == "ok"
    # what torch loads: the alias has the chunks of the tensor it names, and no stored items (storage_data is keyed
    # by the other name). (The reference unpickler gives it no chunks: it empties a TensorStorageMetadata's chunk
    # list once read; a known divergence on a shape no DCP writer produces.)
    by_key = {t.key: t for t in fast[1].tensors}
    alias, named = by_key["alias.of.layers.10"].chunks, by_key["layers.10.weight"].chunks
    assert len(named) >= 1 and all(c.storage is not None for c in named)
    assert [(c.offsets, c.sizes) for c in alias] == [(c.offsets, c.sizes) for c in named]
    assert all(c.storage is None for c in alias)


@pytest.mark.parametrize("d", [0, 1, 3])
def test_packed_and_row_keys_join_alike(d: int) -> None:
    """`_join` with keys packed into one int64 and with the same keys as rows of bytes (forced by a key count that
    makes the radix product overflow): same rows kept (the last of duplicates), same match per chunk."""
    rng = np.random.default_rng(d)
    n_s, n_c, n_keys = 500, 400, 6
    s_kid = rng.integers(0, n_keys - 1, n_s)  # the last tensor has no storage entry
    s_flat = rng.integers(0, 4, n_s * d)
    s_cs = np.arange(n_s) * d
    lens = np.full(n_keys, n_c // n_keys)
    lens[-1] += n_c - int(lens.sum())
    c_flat = rng.integers(0, 4, n_c * d)
    coord_start = np.arange(n_c + 1) * d
    srows = np.arange(n_s)
    crows = np.arange(n_c)
    t_end = np.cumsum(lens)
    a = dcp_table._join(n_keys, d, s_kid, s_flat, s_cs, srows, t_end, crows, c_flat, coord_start)
    b = dcp_table._join(2**62, d, s_kid, s_flat, s_cs, srows, t_end, crows, c_flat, coord_start)
    assert (a[1] >= 0).any() and (a[1] < 0).any()
    assert np.array_equal(a[1], b[1])
    assert sorted(a[0].tolist()) == sorted(b[0].tolist())
