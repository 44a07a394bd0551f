"""Never crash, hang or balloon (issue 18 §2-§4): bounds on everything a file can claim, work proportional to the
verdict, output that cannot be spoofed. Every read command must exit 0/1 with valid JSON; numbers, nesting, shared
references, offsets and names are taken from crafted but real-format files (torch.save archives, DCP `.metadata`
rewritten through torch's own classes, copies of the bundled samples).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.commands.audit.audit import audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.checks.coverage import tensor_coverage
from ckptinspect.cli.app import app
from ckptinspect.findings import Status
from ckptinspect.model import Chunk, StoredItem
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.pickling.walk import walk_pickle, walk_stream
from hostile_samples import relay_item, torch_save_bytes, write_zip, zip_entries

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_ckpts"
FULLY = SAMPLES / "torch_dist_fully" / "iter_0000001"
READ_COMMANDS = (["sniff"], ["ls"], ["info"], ["audit"], ["coverage"], ["scan"])


@dataclass
class Ran:
    returncode: int
    stdout: bytes
    stderr: bytes


def cli(*args: str, env: dict[str, str] | None = None) -> Ran:
    """Run the CLI in-process (CliRunner; exit codes as the shell sees them), or in a subprocess when `env` is
    given (an interpreter started with that environment, e.g. PYTHONIOENCODING)."""
    if env is None:
        r = CliRunner().invoke(app, list(args), env={"CKPTINSPECT_WIDTH": "200"})
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            return Ran(3, r.stdout_bytes, repr(r.exception).encode())
        return Ran(r.exit_code, r.stdout_bytes, b"")
    p = subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, timeout=300,
                       env={**os.environ, "CKPTINSPECT_WIDTH": "200", **env})
    return Ran(p.returncode, p.stdout, p.stderr)


def assert_clean_json_runs(path: Path, commands: tuple[list[str], ...] = READ_COMMANDS,
                           env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every read command exits 0/1 and prints valid (UTF-8) JSON."""
    docs = {}
    for cmd in commands:
        r = cli(*cmd, str(path), "-o", "json", env=env)
        assert r.returncode in (0, 1), (cmd, r.returncode, r.stderr[-2000:])
        docs[cmd[0]] = json.loads(r.stdout.decode("utf-8"))
    return docs


def bytes_read() -> int:
    """Bytes this process (all its threads) has read through read(2) so far: Linux `/proc/self/io` `rchar`.
    Work is measured in bytes, not seconds: a 2-core CI machine is noisy, byte counts are not."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def common_with(ckpt: Path, state: Any) -> None:
    """Replace `common.pt` by a real torch.save of `state` (plain Python data only: loadable by torch too)."""
    (ckpt / "common.pt").write_bytes(torch_save_bytes(state))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    dst = tmp_path / "iter_0000001"
    shutil.copytree(FULLY, dst)
    return dst


# --- numbers ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [10**5000, -(10**6000), {10**4400: 1}, [10**4500] * 3],
                         ids=["huge-int", "huge-negative", "huge-key", "huge-list"])
def test_integers_beyond_the_4300_digit_limit_in_args(value: Any, ckpt: Path) -> None:
    import torch

    state = torch.load(FULLY / "common.pt", weights_only=False)  # the sample is trusted
    state["args"].seq_length = value
    state["iteration"] = value if isinstance(value, int) else 1
    common_with(ckpt, state)
    assert_clean_json_runs(ckpt)


@pytest.mark.parametrize("field,value", [("offset", float("inf")), ("offset", 1 << 63), ("length", -5),
                                         ("length", 10**5000)],
                         ids=["offset-inf", "offset-2**63", "length-negative", "length-5000-digits"])
def test_absurd_offsets_and_lengths_in_metadata(field: str, value: Any, ckpt: Path) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    idx = next(iter(md.storage_data))
    info = md.storage_data[idx]
    kw = {"relative_path": info.relative_path, "offset": info.offset, "length": info.length, field: value}
    md.storage_data[idx] = _StorageInfo(**kw)
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    docs = assert_clean_json_runs(ckpt)
    assert docs["audit"]["status"] in ("corrupt", "unsafe")


@pytest.mark.parametrize("shape", [(2,) * 80, (1 << 40, 1 << 40, 1 << 40), (10**30,)],
                         ids=["80-dims", "numel-2**120", "dim-10**30"])
def test_absurd_tensor_shapes_in_metadata(shape: tuple[int, ...], ckpt: Path) -> None:
    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(k for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks"))
    md.state_dict_metadata[key].size = __import__("torch").Size(shape)
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    docs = assert_clean_json_runs(ckpt)
    assert docs["audit"]["status"] == "corrupt"


def test_chunk_offsets_and_sizes_of_different_lengths(ckpt: Path) -> None:
    # torch's ChunkStorageMetadata with one more size than offsets: the streaming reader falls back to the reference
    # reader, whose chunks go into the chunk table (one row = one number of axes): a malformed .metadata (CK106),
    # not a traceback.
    import torch

    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(k for k, v in md.state_dict_metadata.items() if getattr(v, "chunks", None))
    chunk = md.state_dict_metadata[key].chunks[0]
    chunk.sizes = torch.Size([*chunk.sizes, 1])
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    docs = assert_clean_json_runs(ckpt)
    assert docs["audit"]["status"] == "corrupt"
    assert any(f["code"] == "CK106" for f in docs["audit"]["findings"])


def test_coverage_sums_never_wrap_int64() -> None:
    # An irregular 2-D grid (fallback path) of a 2**62-element tensor with only HALF of it stored: four chunks of
    # 2**60 elements whose int64 volume sum would wrap to zero difference.
    dim = 1 << 31
    chunks = [Chunk((0, i * (dim // 4)), (dim, dim // 4), StoredItem("f", 0, 1)) for i in range(2)]
    t = ChunkTable.of([TensorEntry("w", (dim, dim), "float32", chunks)]).tensors[0]
    cov = tensor_coverage(t)
    assert cov.gap == dim * dim // 2 and not cov.ok


def test_irregular_grid_fallback_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # 30,000 staggered chunks overlapping on axis 0: pairwise comparison would be ~450M pairs. The sweep's pair
    # comparisons are counted (each one is a call of `all` in the coverage module, as is each chunk's bounds check),
    # not timed: they must stop at the cap (plus at most one chunk's worth of open chunks), and the result must say
    # it is inexact.
    import ckptinspect.checks.coverage as coverage

    n = 30_000
    cap = 20_000
    compared = 0

    def counting_all(it: Any) -> bool:
        nonlocal compared
        compared += 1
        if compared > cap + 2 * n:  # n bounds checks + the capped sweep + one chunk's open set
            raise AssertionError(f"the irregular-grid sweep compared more than {cap + n} chunk pairs")
        return all(it)

    monkeypatch.setattr(coverage, "MAX_PAIR_CHECKS", cap)
    monkeypatch.setattr(coverage, "all", counting_all, raising=False)
    chunks = [Chunk((i, (i * 7919) % 1000), (n, 1), None) for i in range(n)]
    t = ChunkTable.of([TensorEntry("w", (2 * n, 1000), "float32", chunks)]).tensors[0]
    cov = tensor_coverage(t, check_storage=False)
    assert compared > cap + n  # the grid really needs more than the cap: the bound is what stopped it
    assert not cov.exact


# --- nesting and sharing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("builder", ["tuple-dict-key", "frozenset", "set-member", "reduce-chain"])
def test_deep_nesting_is_bounded_whatever_opcode_builds_it(builder: str, ckpt: Path) -> None:
    n = 100_000
    if builder == "tuple-dict-key":  # the C unpickler hashes the key recursively: C stack overflow
        body = b"}" + b")" + b"\x85" * n + b"K\x01s"
    elif builder == "frozenset":
        body = b"(" + b")" + b"\x85" * n + b"\x91"
    elif builder == "set-member":
        body = b"\x8f(" + b")" + b"\x85" * n + b"\x90"
    else:
        body = b"cbuiltins\ntuple\n" + b")" + b"\x85" * n + b"\x85R"
    data = b"\x80\x04" + body + b"."
    walk = walk_pickle(data)
    assert walk.limit is not None and "nesting" in walk.limit
    entries = zip_entries((ckpt / "common.pt").read_bytes())
    (ckpt / "common.pt").write_bytes(write_zip([(n_, data if n_.endswith("data.pkl") else d) for n_, d in entries]))
    docs = assert_clean_json_runs(ckpt, (["audit"], ["scan"], ["info"]))
    # judged to its end (nothing dangerous in it), too deep to unpickle: the reader's bound, CK603
    assert not walk.unjudged and walk.segments == 1
    assert docs["audit"]["status"] == "corrupt"


@pytest.mark.slow
def test_billion_laughs_is_bounded(ckpt: Path) -> None:
    # 40 levels, each a list holding the level below twice: 2**40 paths through 40 objects.
    obj: Any = []
    for _ in range(40):
        obj = [obj, obj]
    data = pickle.dumps({"args": None, "iteration": 1, "x": obj}, protocol=2)
    assert len(data) < 2000
    entries = zip_entries((ckpt / "common.pt").read_bytes())
    (ckpt / "common.pt").write_bytes(write_zip([(n, data if n.endswith("data.pkl") else d) for n, d in entries]))
    # in a subprocess: its 300-s timeout is a hang guard (2**40 expansions would never end), not a speed claim
    docs = assert_clean_json_runs(ckpt, (["audit"], ["info"]), env={})
    assert docs["audit"]["status"] == "corrupt"


def test_a_big_pickle_is_prewalked_by_streaming(tmp_path: Path) -> None:
    # > 16 MiB, with a memo index no pickler writes at the very end: the streamed walk must see it.
    big = b"\x80\x04" + (b"\x8e" + (8 << 20).to_bytes(8, "little") + b"\0" * (8 << 20) + b"0") * 3
    data = big + b"N" + b"r" + (0x7FFFFFF0).to_bytes(4, "little") + b"."
    p = tmp_path / "big.pkl"
    p.write_bytes(data)
    with open(p, "rb") as f:
        walk = walk_stream(f, len(data))
    assert walk.limit is not None and "memo index" in walk.limit and walk.unjudged
    r = cli("scan", str(p), "-o", "json")
    # the walk stopped at the memo bound before the end of the pickle: fail closed
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "unsafe"


@pytest.mark.parametrize("how", ["deflate", "lzma", "bzip2"])
def test_corrupt_compressed_members_are_findings(how: str, ckpt: Path) -> None:
    method = {"deflate": zipfile.ZIP_DEFLATED, "lzma": zipfile.ZIP_LZMA, "bzip2": zipfile.ZIP_BZIP2}[how]
    entries = zip_entries((ckpt / "common.pt").read_bytes())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        for n, d in entries:
            z.writestr(n, d)
    blob = bytearray(buf.getvalue())
    at = blob.find(b"data.pkl") + len(b"data.pkl") + 12
    blob[at : at + 40] = b"\xff" * 40
    (ckpt / "common.pt").write_bytes(bytes(blob))
    docs = assert_clean_json_runs(ckpt, (["audit"], ["scan"], ["info"]))
    assert docs["audit"]["status"] in ("corrupt", "unsafe")


# --- names and output ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_lone_surrogates_and_non_utf8_names_give_valid_json(ckpt: Path, tmp_path: Path) -> None:
    import torch

    state = torch.load(FULLY / "common.pt", weights_only=False)
    state["\udcff\ud800key"] = "value\udfff"
    common_with(ckpt, state)
    os.close(os.open(bytes(ckpt) + b"/stray-\xff\xfe.distcp", os.O_CREAT | os.O_WRONLY))
    assert_clean_json_runs(ckpt, (["audit"], ["info"], ["scan"], ["ls"]))
    for enc in ("ascii", "latin-1"):  # a fresh interpreter per encoding
        assert_clean_json_runs(ckpt, (["info"],), env={"PYTHONIOENCODING": enc})


def test_text_output_escapes_control_characters(ckpt: Path) -> None:
    import torch

    state = torch.load(FULLY / "common.pt", weights_only=False)
    evil = "\x1b[2J\x1b[1;1Hstatus: complete\x1b[8m"
    state[evil] = {"args": evil}
    state["content_metadata"] = {"distrib_optim_sharding_type": evil}
    common_with(ckpt, state)
    (ckpt / f"x{evil}.distcp").write_bytes(b"junk")
    for cmd in (["audit"], ["info"], ["scan"], ["ls"]):
        r = cli(*cmd, str(ckpt))
        assert r.returncode in (0, 1), r.stderr[-1000:]
        assert b"\x1b[2J" not in r.stdout and b"\x1b[8m" not in r.stdout and b"\x9b" not in r.stdout


def test_info_csv_neutralises_formulas(ckpt: Path, tmp_path: Path) -> None:
    from ckptinspect.render.frames import inert_cell

    assert [inert_cell(x) for x in ("=1+1", "+A1", "-2", "@SUM(A1)", "\t=x", "ok", "")] == [
        "'=1+1", "'+A1", "'-2", "'@SUM(A1)", "'\t=x", "ok", ""]
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(app, ["info", str(ckpt), "--csv", str(out)])
    assert r.exit_code == 0 and out.read_text().count("\n") > 1


# --- work proportional to the verdict -------------------------------------------------------------------------------


def test_plain_audit_does_not_hash_a_huge_listed_file(ckpt: Path) -> None:
    from ckptinspect.commands.manifest.manifest import write_manifest

    write_manifest(ckpt)
    huge = ckpt / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GiB that would take minutes to hash
    manifest = json.loads((ckpt / "integrity.json").read_text())
    manifest.setdefault("files", manifest)["huge.bin"] = "0" * 64 if "files" in manifest else "0" * 64
    (ckpt / "integrity.json").write_text(json.dumps(manifest))
    before = bytes_read()
    report = audit(ckpt)
    assert bytes_read() - before < (64 << 20)  # metadata-level: far from the 64 GiB a hash would read
    assert "CK401" not in {f.code for f in report.findings}
    (ckpt / "huge.bin").unlink()
    flipped = ckpt / "__0_0.distcp"
    data = bytearray(flipped.read_bytes())
    data[-100] ^= 1
    flipped.write_bytes(bytes(data))
    from ckptinspect.commands.audit.audit import AuditOptions

    assert "CK401" not in {f.code for f in audit(ckpt).findings}
    assert "CK401" in {f.code for f in audit(ckpt, AuditOptions(hash=True)).findings}


def test_scan_reads_no_unreferenced_data_file_end_to_end(ckpt: Path) -> None:
    stale = ckpt / "__9_0.distcp"
    blob = (ckpt / "__0_0.distcp").read_bytes()
    with open(stale, "wb") as f:
        f.write(blob)
        f.truncate(len(blob) + (64 << 30))  # 64 GiB of sparse zeros after real archives
    before = bytes_read()
    report = scan_path(ckpt, "s")
    assert bytes_read() - before < (64 << 20)  # archive headers only, never the 64 GiB end to end
    assert "CK204" in {f.code for f in report.findings}
    assert report.status is Status.COMPLETE


@pytest.mark.parametrize("vocab", [10**15, (1 << 40) * 6, 10**5000, -7], ids=["1e15", "2**40x6", "5000-digits",
                                                                              "negative"])
def test_resume_with_an_absurd_padded_vocab_size_is_closed_form(vocab: int, ckpt: Path) -> None:
    import torch

    state = torch.load(FULLY / "common.pt", weights_only=False)
    state["args"].padded_vocab_size = vocab
    common_with(ckpt, state)
    # in a subprocess: its timeout is a hang guard (a loop over the value would never end), not a speed claim
    r = cli("resume", str(ckpt), "--tp", "2", "--pp", "1", "-o", "json", env={})
    assert r.returncode in (0, 1), r.stderr
    json.loads(r.stdout)


def test_a_chunk_whose_offsets_and_sizes_differ_in_length_is_corrupt(ckpt: Path) -> None:
    """A ChunkStorageMetadata with 2 offsets and 3 sizes: the streaming reader hands it to the reference, which
    must refuse it as malformed (CK106), not build a model the chunk table cannot hold (that was exit 3)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    import torch

    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(k for k, v in md.state_dict_metadata.items() if getattr(v, "chunks", None) and len(v.size) == 2)
    chunk = md.state_dict_metadata[key].chunks[0]
    md.state_dict_metadata[key].chunks[0] = ChunkStorageMetadata(chunk.offsets, torch.Size([*chunk.sizes, 1]))
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    docs = assert_clean_json_runs(ckpt)
    assert docs["audit"]["status"] == "corrupt"
    assert any(f["code"] == "CK106" and "differ in length" in f["message"] for f in docs["audit"]["findings"])
