"""The streaming `.metadata` reader (`formats/dcp/stream.py`) against the reference unpickler (`metadata.py`).

Same model (every field of `DcpMetadata`, the chunk table materialised), same globals reported, same error codes,
on every sample, on every `.metadata` of the acceptance corpus, on hostile edits (a dangerous global inside
`all_local_plans`), and on a synthetic checkpoint written by the streaming generator that is large enough for the
regex fast paths to run (past the first 65,536 memo slots) — where the test also asserts they did.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.errors import ReadError
from ckptinspect.formats.dcp import vm_fast as _stream_fast
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.formats.dcp.metadata import read_dcp_metadata
from ckptinspect.formats.dcp.stream import read_metadata
from conftest import SAMPLES
from corpus import CASES, Ctx, Harmless, Hostile, copy_source, edit_metadata, missing_source

REPO = Path(__file__).resolve().parents[3]
SAMPLE_METADATA = sorted(SAMPLES.glob("**/.metadata"))


def outcome(data: bytes, streaming: bool) -> tuple[str, Any, dict[str, GlobalClass]]:
    """("ok", DcpMetadata, globals) or ("error", (code, message), globals) of one reader."""
    report = PickleReport()
    try:
        if streaming:
            md = read_metadata(io.BytesIO(data), report)
        else:
            md = read_dcp_metadata(io.BytesIO(data), report)
    except ReadError as e:
        return "error", (e.code, str(e)), dict(report.globals)
    return "ok", md, dict(report.globals)


def assert_same(data: bytes) -> None:
    ref, stream = outcome(data, False), outcome(data, True)
    assert stream[0] == ref[0], (stream[1], ref[1])
    assert stream[2] == ref[2]
    assert stream[1] == ref[1]


@pytest.mark.parametrize("path", SAMPLE_METADATA, ids=[str(p.relative_to(SAMPLES)) for p in SAMPLE_METADATA])
def test_samples_stream_without_fallback_and_match_the_reference(path: Path) -> None:
    data = path.read_bytes()
    s = read_metadata(io.BytesIO(data))
    assert s.fallback is None
    assert s == read_dcp_metadata(data)
    md = read_dcp_metadata(data)
    assert s.table.n_chunks == sum(len(t.chunks) for t in md.tensors)
    assert s.table.n_chunks > 0 or (not md.tensors and md.objects)  # a flatten_state_dict=False save: objects only


@pytest.mark.slow
def test_every_acceptance_metadata_matches_the_reference(tmp_path: Path) -> None:
    """Every `.metadata` any acceptance case builds (damaged, hostile, truncated, edited with torch)."""
    seen = 0
    for i, case in enumerate(CASES):
        if any(missing_source(s) for s in case.sources):
            continue
        work = tmp_path / f"c{i}"
        work.mkdir()
        root = case.build(Ctx(work, tmp_path / f"marker{i}"))
        files = [root] if root.is_file() else list(root.rglob(".metadata"))
        for md in files:
            if md.name == ".metadata" and md.is_file():
                assert_same(md.read_bytes())
                seen += 1
        assert not (tmp_path / f"marker{i}").exists()
    assert seen >= 30


def _with_plan_item(tmp_path: Path, payload: Any) -> bytes:
    ckpt = copy_source(Ctx(tmp_path, tmp_path / "marker"), "torch_dist") / "iter_0000002"
    with edit_metadata(ckpt) as md:
        md.all_local_plans[-1].items.append(payload)  # deep inside the plans, after every chunk record
    return (ckpt / ".metadata").read_bytes()


@pytest.mark.skipif(missing_source("torch_dist") is not None, reason="sample absent")
def test_a_dangerous_global_in_the_plans_is_reported_not_run(tmp_path: Path) -> None:
    data = _with_plan_item(tmp_path, Hostile(tmp_path / "marker"))
    report = PickleReport()
    s = read_metadata(io.BytesIO(data), report)
    assert report.dangerous == ["os.system"] or report.dangerous == ["posix.system"]
    assert s.fallback is not None and "dangerous" in s.fallback  # judged by the walk, read by the reference
    assert not (tmp_path / "marker").exists()
    assert_same(data)


@pytest.mark.skipif(missing_source("torch_dist") is not None, reason="sample absent")
def test_an_unknown_global_in_the_plans_is_reported(tmp_path: Path) -> None:
    data = _with_plan_item(tmp_path, Harmless())
    report = PickleReport()
    read_metadata(io.BytesIO(data), report)
    assert report.unknown == [f"{Harmless.__module__}.Harmless"]  # corpus_kit since the corpus split
    assert_same(data)


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, 0.999])
def test_truncated_metadata_fails_like_the_reference(cut: float) -> None:
    data = SAMPLE_METADATA[-1].read_bytes()
    assert_same(data[: int(len(data) * cut)])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~12k chunks (~360k memo slots) written by the streaming generator: the fast paths run past slot 65,536."""
    out = tmp_path_factory.mktemp("synthetic") / "iter_0000001"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_ckpt.py"), str(out), "--chunks", "12000",
                    "--checkpoint-id", "synthetic"], check=True, capture_output=True, cwd=REPO)
    return out


@pytest.mark.slow
def test_synthetic_reads_through_the_fast_paths(synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {"chunks": 0, "storage": 0, "plans": 0}
    for name in runs:
        real = getattr(_stream_fast, f"_{name}")

        def counted(*a: Any, _real: Any = real, _name: str = name) -> int:
            p = _real(*a)
            runs[_name] += p >= 0
            return int(p)

        monkeypatch.setattr(_stream_fast, f"_{name}", counted)
    data = (synthetic / ".metadata").read_bytes()
    s = read_metadata(io.BytesIO(data))
    assert s.fallback is None
    assert all(runs.values()), runs
    ref = read_dcp_metadata(data)
    assert s == ref
    assert sum(s.rank_items) == sum(len(t.chunks) for t in ref.tensors) + len(ref.objects)


@pytest.mark.slow
def test_synthetic_without_fast_paths_gives_the_same_table(synthetic: Path) -> None:
    data = (synthetic / ".metadata").read_bytes()
    a = read_metadata(io.BytesIO(data))
    b = read_metadata(io.BytesIO(data), fast=False)
    assert a.fallback is None and b.fallback is None
    assert a == b


@pytest.mark.slow
def test_chunk_table_is_columns(synthetic: Path) -> None:
    s = read_metadata(io.BytesIO((synthetic / ".metadata").read_bytes()))
    t = s.table
    assert t.n_chunks > 10000
    assert t.nbytes / t.n_chunks < 80  # bytes per chunk of the arrays themselves
    assert (t.file_id >= 0).all()  # every chunk has its storage entry
    assert int(t.tensor_start[-1]) == t.n_chunks


@pytest.mark.slow
def test_streamed_generator_equals_pickle_dump_of_torch_objects(tmp_path: Path) -> None:
    """The streamed `.metadata` loads in torch and equals what `pickle.dump` of torch's objects writes."""
    import torch.distributed.checkpoint as dcp

    outs = {}
    for mode in ("stream", "objects"):
        out = tmp_path / mode / "iter_0000001"
        flags = ["--objects"] if mode == "objects" else []
        subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_ckpt.py"), str(out), "--preset",
                        "tiny", "--checkpoint-id", "x", *flags], check=True, capture_output=True, cwd=REPO)
        md = dcp.FileSystemReader(str(out)).read_metadata()
        md.storage_meta.load_id = None  # set by read_metadata itself
        outs[mode] = md
    assert outs["stream"] == outs["objects"]
    assert outs["stream"].all_local_plans == outs["objects"].all_local_plans


# ~200k chunks when asked (CKPTINSPECT_SCALE_CHUNKS=200000: ~2 min on 2 idle cores); CI runs the cheaper 20k form.
SCALE_CHUNKS = int(os.environ.get("CKPTINSPECT_SCALE_CHUNKS", "20000"))


@pytest.mark.slow
def test_streamed_generator_loads_in_torch(tmp_path: Path) -> None:
    """torch's `read_metadata` loads the streamed file and the generator's torch-side validation passes (`--check`:
    torch's own `_validate_global_plan`, storage entries tiling every file, plans matching storage)."""
    out = tmp_path / "iter_0000001"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_ckpt.py"), str(out), "--chunks",
                        str(SCALE_CHUNKS), "--check"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "check OK" in r.stdout
    assert os.path.getsize(out / ".metadata") > SCALE_CHUNKS * 200


def test_pickle_protocols_2_to_5_of_a_sample(tmp_path: Path) -> None:
    """The same Metadata re-pickled with every binary protocol (protocol 2/3: BINPUT instead of MEMOIZE)."""
    import torch.distributed.checkpoint as dcp

    md = dcp.FileSystemReader(str(SAMPLE_METADATA[-1].parent)).read_metadata()
    for proto in (2, 3, 4, 5):
        assert_same(pickle.dumps(md, protocol=proto))
