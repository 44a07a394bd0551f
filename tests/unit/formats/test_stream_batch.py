"""The batch decoders of the streaming `.metadata` reader (`vm_batch.py`, `vm_fast.py`).

The batch paths must build exactly the table the opcode-by-opcode walk builds (and the reference unpickler's model):
checked on every real `.metadata` in `sample_ckpts/` with the batch paths switched on from the first memo slot
(normally they start at slot 65,536, which no sample reaches), on `Metadata` objects of torch's own classes pickled
by `pickle.dumps` with shapes the samples lack (4-d tensors, offsets needing LONG1, shared name strings, byte items,
plans), and on edited records (names swapped, a GET of a slot not filled yet) that the batch must leave to the loop.
The int decoders are compared with `int.from_bytes` on both their small (Python) and large (numpy) forms.
"""

from __future__ import annotations

import io
import pickle
import random
import re
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.errors import ReadError
from ckptinspect.formats.dcp.vm_eval import Fallback
from ckptinspect.formats.dcp.metadata import read_dcp_metadata
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.formats.dcp import vm_batch as B
from ckptinspect.formats.dcp import vm_fast
from ckptinspect.formats.dcp.vm_stats import ReadStats
from ckptinspect.formats.dcp.vm_patterns import _TUP, CHUNK, CHUNK_REC
from conftest import SAMPLES

SAMPLE_METADATA = sorted(SAMPLES.glob("**/.metadata"))


def _token(v: int, rng: random.Random) -> bytes:
    """One int opcode for `v` as a pickler may write it (BININT1/2 only for what they can hold)."""
    forms = []
    if 0 <= v < 256:
        forms.append(b"K" + bytes([v]))
    if 0 <= v < 65536:
        forms.append(b"M" + v.to_bytes(2, "little"))
    if -2**31 <= v < 2**31:
        forms.append(b"J" + v.to_bytes(4, "little", signed=True))
    for k in range(1, 9):
        if -2**(8 * k - 1) <= v < 2**(8 * k - 1):
            forms.append(b"\x8a" + bytes([k]) + v.to_bytes(k, "little", signed=True))
    return rng.choice(forms)


@pytest.mark.parametrize("n", [5, B.SMALL + 50])  # the Python form and the numpy form
def test_decode_ints_equals_int_from_bytes(n: int) -> None:
    rng = random.Random(n)
    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, -2**31, -1, 2**62, -2**63, 2**63 - 1, 2**40 + 3]
    values = [rng.choice(edges) if i % 3 else rng.randint(-2**63, 2**63 - 1) for i in range(n)]
    tokens = [_token(v, rng) for v in values]
    assert B.decode_ints(tokens).tolist() == values


@pytest.mark.parametrize("n", [4, B.SMALL + 10])
def test_tuples_arity_and_values(n: int) -> None:
    rng = random.Random(n)
    col, want_vals, want_ar = [], [], []
    for i in range(n):
        if i % 7 == 3:
            col.append(b"")  # absent (offset None)
            want_ar.append(-1)
            continue
        k = rng.choice([1, 2, 3, 4, 5])
        vals = [rng.randint(0, 2**40) for _ in range(k)]
        toks = b"".join(_token(v, rng) for v in vals)
        col.append(toks + {1: b"\x85", 2: b"\x86", 3: b"\x87"}[k] if k <= 3 else b"(" + toks + b"t")
        want_vals += vals
        want_ar.append(k)
    values, arity = B.tuples(col)
    assert values.tolist() == want_vals
    assert arity.tolist() == want_ar


def test_one_tuple_decodes_as_a_column_of_one() -> None:
    """`tuple_ints` (a tensor boundary's torch.Size) agrees with `tuples` on every tuple the pattern admits, and
    refuses every other: a wrong arity, MARK TUPLE without ints, a bad opcode, an argument running past the end."""
    rng = random.Random(7)
    cases = [b"", b"(t", b"K\x01\x86", b"K\x01K\x02\x85", b"M\x01t", b"(M\x01t", b"(Mt",
             b"\x8a\x09" + bytes(9) + b"\x85", b"\x8a\x00\x85", b"X\x01\x85", b"(K\x01"]
    for _ in range(300):
        k = rng.choice([1, 2, 3, 4, 6])
        vals = [rng.choice([0, 255, 256, 65535, 65536, -1, 2**31, -2**63, 2**63 - 1, rng.randint(0, 2**40)])
                for _ in range(k)]
        toks = b"".join(_token(v, rng) for v in vals)
        raw = toks + {1: b"\x85", 2: b"\x86", 3: b"\x87"}[k] if k <= 3 and rng.random() < 0.7 else b"(" + toks + b"t"
        cases.append(raw)
        cases.append(raw[:-1] + rng.choice([b"\x85", b"\x86", b"\x87", b"t"]))  # the terminator swapped
    tup = re.compile(_TUP, re.DOTALL)
    refused = 0
    for raw in cases:
        try:
            got: list[int] | None = B.tuple_ints(raw)
        except Fallback:
            got = None
        if tup.fullmatch(raw):  # what the pattern hands it: as the column decoder reads it
            assert got == B.tuples([raw])[0].tolist(), raw
        else:
            assert got is None, raw
            refused += 1
    assert 10 < refused < len(cases) - 100


def test_flags_is_present_of_one_byte_groups() -> None:
    """`flags` (a C join) gives `present` on every column of one-byte-or-empty values, and on anything else (a 0
    byte, longer values) too, through `present` itself."""
    rng = random.Random(5)
    for n in (0, 1, 2, 7, B.SMALL + 3):
        for _ in range(50):
            col = tuple(rng.choice([b"", b"K", b"(", b")", b"\x85", b"u"]) for _ in range(n))
            assert B.flags(col).tolist() == B.present(col).tolist()
    for col in [(b"\x00", b""), (b"ab", b""), (b"", b"\x00\x00"), (b"K", b"\x00")]:
        assert B.flags(col).tolist() == [bool(c) for c in col]


def test_get_slots() -> None:
    col = [b"h\x05", b"", b"j\x01\x02\x03\x04", b"h\xff", b"j\xff\xff\xff\x7f"]
    assert B.get_slots(col).tolist() == [5, -1, 0x04030201, 255, 2**31 - 1]
    assert [B.slot(c) for c in col] == B.get_slots(col).tolist()


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    runs = {"chunks": 0, "storage": 0, "plans": 0}
    for name in runs:
        real = getattr(vm_fast, f"_{name}")

        def counted(*a: Any, _real: Any = real, _name: str = name) -> int:
            p = int(_real(*a))
            runs[_name] += p >= 0
            return p

        monkeypatch.setattr(vm_fast, f"_{name}", counted)
    return runs


def outcome(data: bytes, **kw: Any) -> tuple[str, Any]:
    """("ok", model) or ("error", code) of the streaming reader (batch paths from slot 0 unless told)."""
    try:
        if kw.pop("reference", False):
            return "ok", read_dcp_metadata(io.BytesIO(data))
        s = read_metadata(io.BytesIO(data), **kw)
    except ReadError as e:
        return "error", e.code
    return "ok", s


def assert_batch_equals_loop(data: bytes) -> None:
    fast = outcome(data, fast_from=0)
    assert fast == outcome(data, fast=False)
    ref = outcome(data, reference=True)
    assert fast[0] == ref[0]
    if fast[0] == "ok":
        assert fast[1] == ref[1]


@pytest.mark.parametrize("path", SAMPLE_METADATA, ids=[str(p.relative_to(SAMPLES)) for p in SAMPLE_METADATA])
def test_batch_paths_on_real_metadata_build_the_loops_table(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = path.read_bytes()
    runs = _counting(monkeypatch)
    s = read_metadata(io.BytesIO(data), fast_from=0)
    assert s.fallback is None
    # every sample with tensors goes through the chunk batch path; a flatten_state_dict=False save holds objects only
    assert runs["chunks"] or not read_dcp_metadata(data).tensors, runs
    # the storage batch pattern knows `_StorageInfo(relative_path, offset, length)`; entries that also carry
    # `transform_descriptors` (a compressed save, `dcp_zstd`) go through the loop, with the same table (below)
    assert runs["storage"] or b"transform_descriptors" in data, runs
    assert s == read_metadata(io.BytesIO(data), fast=False)
    assert s == read_dcp_metadata(data)


def _torch_metadata(seed: int, oversize: bool = False, unicode: bool = False) -> Any:
    """A `Metadata` of torch's classes with what the samples lack: 4-d tensors (MARK ... TUPLE), offsets beyond
    2**31 (LONG1), name strings shared between metadata, storage and plans (GETs instead of names), byte items
    (offset None), several files, and Megatron's `all_local_plans`. `oversize`: one tensor of more than 2**62
    elements (each coordinate in range), which the reference refuses. `unicode`: names beyond ASCII, one whose
    UTF-8 holds a 0x94 byte (MEMOIZE's), one with a lone surrogate (pickled with 'surrogatepass')."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    rng = random.Random(seed)
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    plans: list[list[Any]] = [[] for _ in range(4)]
    pos = [0] * 4
    for t in range(40):
        fqn = f"layers.{t}.weight" if t % 5 else f"optimizer.state.{t}.exp_avg"
        if unicode and t % 4:
            fqn = {1: f"层.{t}.wéight", 2: f"layers.{t}\u2014weight", 3: f"layers.{t}.\udcff"}[t % 4]
        nd = rng.choice([1, 2, 4])
        big = 2**33 if t % 7 == 0 and nd < 4 else 1
        shape = [rng.choice([3, 300, 5000]) * (big if d == 0 else 1) for d in range(nd)]
        if oversize and t == 11:
            shape = [2**40, 2**30]
        props = TensorProperties(dtype=rng.choice([torch.float32, torch.bfloat16]))
        chunks = []
        for c in range(rng.choice([1, 3, 6])):
            offs = torch.Size([c * shape[0] // 6] + [0] * (nd - 1))
            sizes = torch.Size([max(1, shape[0] // 6)] + shape[1:])
            chunk = ChunkStorageMetadata(offsets=offs, sizes=sizes)
            chunks.append(chunk)
            rank = rng.randrange(4)
            length = rng.randint(1, 2**20)
            # unicode: a name object of its own, spelled again as Megatron's storage entries spell theirs
            key_fqn = (fqn + ".")[:-1] if unicode else fqn
            storage[MetadataIndex(key_fqn, offs)] = _StorageInfo(f"__{rank}_0.distcp", pos[rank], length)
            pos[rank] += length
            plans[rank].append(WriteItem(MetadataIndex(fqn, offs), WriteItemType.SHARD,
                                         tensor_data=TensorWriteData(chunk, props, torch.Size(shape))))
        sdm[fqn] = TensorStorageMetadata(props, torch.Size(shape), chunks)
    for k in range(5):
        key = f"common.{k}"
        sdm[key] = BytesStorageMetadata()
        storage[MetadataIndex(key)] = _StorageInfo("__0_0.distcp", pos[0], 100 + k)
        pos[0] += 100 + k
        plans[0].append(WriteItem(MetadataIndex(key), WriteItemType.BYTE_IO))
    md = Metadata(sdm, storage_data=storage)
    md.all_local_plans = [SavePlan(items) for items in plans]  # type: ignore[attr-defined]
    return md


@pytest.mark.parametrize("proto", [2, 4, 5])
@pytest.mark.parametrize("seed", [1, 2])
def test_batch_paths_on_torch_objects_with_other_shapes(proto: int, seed: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = pickle.dumps(_torch_metadata(seed), protocol=proto)
    runs = _counting(monkeypatch)
    assert_batch_equals_loop(data)
    # the plans reach the model only as item counts: the memo slots counted are compared too
    slots = []
    for kw in ({"fast_from": 0}, {"fast": False}):
        stats = ReadStats()
        read_metadata(io.BytesIO(data), stats=stats, **kw)  # type: ignore[arg-type]
        slots.append(stats.memo_slots)
    assert slots[0] == slots[1] > 0
    if proto >= 4:  # protocols 2-3 write BINPUT, not MEMOIZE: no record pattern matches, the loop reads it all
        assert runs["chunks"] and runs["storage"] and runs["plans"], runs


def test_names_beyond_ascii_are_read_as_the_loop_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with a 0x94 byte inside a character (U+2014 is e2 80 94) ends the greedy name early: its declared
    length does not match, so that record is the loop's; other non-ASCII names go through the batch paths."""
    assert "\u2014".encode() == b"\xe2\x80\x94"
    data = pickle.dumps(_torch_metadata(3, unicode=True), protocol=4)
    runs = _counting(monkeypatch)
    assert_batch_equals_loop(data)
    assert runs["chunks"] and runs["storage"] and runs["plans"], runs
    streamed = read_metadata(io.BytesIO(data), fast_from=0)
    assert streamed.fallback is None  # the batch paths decode as the loop does: no error sends it to the reference
    keys = {t.key for t in streamed.tensors}
    assert {"层.1.wéight", "layers.2\u2014weight", "layers.3.\udcff"} <= keys


def test_a_shape_of_more_than_2_62_elements_is_refused_as_by_the_reference() -> None:
    """Each coordinate in [0, 2**62] but their product not: the reference refuses the `.metadata` (CK106); so must
    the streaming reader, whichever path read the records (it used to accept it)."""
    data = pickle.dumps(_torch_metadata(1, oversize=True), protocol=4)
    assert outcome(data, reference=True) == ("error", "CK106")
    assert_batch_equals_loop(data)
    assert outcome(data) == ("error", "CK106")


def _chunk_records(data: bytes) -> list[re.Match[bytes]]:
    out, p = [], 0
    while (p := data.find(b")\x81\x94}\x94(", p + 1)) > 0:
        for back in (2, 5):
            m = CHUNK_REC.match(data, p - back)
            if m:
                out.append(m)
    return out


def test_records_the_batch_must_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Field names swapped in one chunk record (the stand-ins would hold them swapped), and a GET of a memo slot
    that is only filled later (the reference fails): the batch stops at such a record, the loop decides."""
    data = pickle.dumps(_torch_metadata(3), protocol=4)
    records = _chunk_records(data)
    assert len(records) > 10
    m = records[len(records) // 2]
    a, b = m.span(CHUNK.index["k_offsets"] + 1), m.span(CHUNK.index["k_sizes"] + 1)
    ka, kb = data[a[0]:a[1]], data[b[0]:b[1]]
    assert len(ka) == len(kb) and ka != kb
    swapped = data[:a[0]] + kb + data[a[1]:b[0]] + ka + data[b[1]:]
    assert_batch_equals_loop(swapped)
    assert outcome(swapped, fast=False) != outcome(data, fast=False)  # the edit changed the model

    first = records[0]
    g = first.span(CHUNK.index["k_sizes"] + 1)
    late = b"h\xfe" if g[1] - g[0] == 2 else b"j\xff\xff\xff\x00"
    unfilled = data[:g[0]] + late + data[g[1]:]
    assert_batch_equals_loop(unfilled)
    assert outcome(unfilled, fast=False)[0] == "error"
