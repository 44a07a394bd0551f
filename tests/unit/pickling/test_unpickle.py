"""Tests of the allowlisting unpickler (`pickling/unpickle.py`) and the opcode walker (`pickling/walk.py`).

Both read the same corpus of hostile pickles — every protocol, GLOBAL / STACK_GLOBAL fed from the memo / INST /
OBJ / EXT, nested in containers, concatenated, inside a torch zip archive — and must (1) never run anything (a
marker file the payload would create stays absent), (2) name the dangerous global. Resource attacks (100 GB length
claims, 100,000-deep nesting, zip bombs, a giant memo index) must end as `ReadError` / `LimitExceeded` or a bounded
walk, never `MemoryError`, `RecursionError` or a blown-up process. Last, importing the package and running the CLI
must leave `torch` out of `sys.modules`.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptinspect.errors import LimitExceeded, ReadError
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.walk import DYNAMIC_GLOBAL, walk_pickle
from ckptinspect.pickling.plain import to_plain
from ckptinspect.pickling.unpickle import MAX_NESTING, Opaque, PickleReport, load_pickle
from ckptinspect.pickling.torch_archive import read_torch_archive
from ckptinspect.formats.dcp.metadata import read_dcp_metadata

REPO = Path(__file__).resolve().parents[3]
SAMPLES = Path(os.environ.get("CKPTINSPECT_SAMPLES", REPO / "sample_ckpts"))
FIXTURE_0192 = SAMPLES / "mcore_0_19_2"


# --- the hostile corpus ----------------------------------------------------------------------------------------------


class Reduce:
    """An object whose unpickling calls `fn(*args)`: the classic pickle payload."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def _u(s: str) -> bytes:
    """SHORT_BINUNICODE of `s`."""
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def hostile_corpus(marker: Path) -> dict[str, tuple[bytes, str]]:
    """name → (pickle bytes, a dangerous global it references). Unpickled for real, each would create `marker`."""
    touch = f"touch {marker}"
    py = f"open({str(marker)!r}, 'w').close()"
    cases: dict[str, tuple[bytes, str]] = {}
    for proto in range(6):
        cases[f"os.system/p{proto}"] = (pickle.dumps(Reduce(os.system, (touch,)), protocol=proto), "posix.system")
        cases[f"subprocess.Popen/p{proto}"] = (
            pickle.dumps(Reduce(subprocess.Popen, (["touch", str(marker)],)), protocol=proto),
            "subprocess.Popen" if proto >= 3 else "commands.Popen",  # pickle writes Python 2 names below 3
        )
        eval_name = "builtins.eval" if proto >= 3 else "__builtin__.eval"
        exec_name = "builtins.exec" if proto >= 3 else "__builtin__.exec"
        cases[f"eval/p{proto}"] = (pickle.dumps(Reduce(eval, (py,)), protocol=proto), eval_name)
        cases[f"exec/p{proto}"] = (pickle.dumps(Reduce(exec, (py,)), protocol=proto), exec_name)
        nested = {"model": [1, 2, {"layers": (Reduce(os.system, (touch,)), "x")}], "iteration": 7}
        cases[f"nested-in-dict-list-tuple/p{proto}"] = (pickle.dumps(nested, protocol=proto), "posix.system")
    # getattr(__import__('os'), 'system')('touch ...'): a chain of calls, protocol 2 GLOBAL opcodes.
    cases["getattr-chain"] = (
        b"\x80\x02cbuiltins\ngetattr\n(cbuiltins\n__import__\n(X\x02\x00\x00\x00ostRX\x06\x00\x00\x00systemtR("
        + b"X" + struct.pack("<I", len(touch)) + touch.encode() + b"tR.",
        "builtins.getattr",
    )
    # STACK_GLOBAL whose module and name come back from the memo (BINGET), after a decoy STACK_GLOBAL.
    cases["stack-global-from-memo"] = (
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00" + _u("posix") + b"\x94" + _u("system") + b"\x94"
        + _u("collections") + _u("OrderedDict") + b"\x93\x94)R\x94" + b"0"  # decoy, popped
        + b"h\x00h\x01\x93" + _u(touch) + b"\x85R.",
        "posix.system",
    )
    # LONG_BINGET / BINPUT variants and DUP: module and name pushed once, duplicated from the memo.
    cases["stack-global-long-binget"] = (
        b"\x80\x04" + _u("os") + b"r\x05\x00\x00\x00" + b"0" + b"j\x05\x00\x00\x00" + _u("system") + b"\x93"
        + _u(touch) + b"\x85R.",
        "os.system",
    )
    # MEMOIZE stores at the count of filled memo slots, not at the count of MEMOIZEs: after one BINPUT to slot 10,
    # a walker that counted MEMOIZEs would read `torch.Size` where the unpickler resolves `posix.system`.
    cases["memo-count-evasion"] = (
        b"\x80\x04(" + _u("t0") + b"\x94" + _u("x") + b"q\x0a" + _u("posix") + b"\x94" + _u("torch") + b"\x94"
        + _u("system") + b"\x94" + _u("Size") + b"\x94" + b"1" + b"h\x02h\x04\x93" + _u(touch) + b"\x85R.",
        "posix.system",
    )
    cases["inst-protocol0"] = (b"(S'" + touch.encode() + b"'\nios\nsystem\n.", "os.system")
    cases["obj-protocol1"] = (b"(cos\nsystem\nS'" + touch.encode() + b"'\no.", "os.system")
    cases["py2-builtin-protocol0"] = (b"c__builtin__\nexec\n(S'" + py.encode() + b"'\ntR.", "__builtin__.exec")
    cases["runpy-run-path"] = (pickle.dumps(Reduce(__import__("runpy").run_path, (str(marker),)), protocol=4),
                               "runpy.run_path")
    cases["getattr-attribute-name"] = (b"\x80\x04" + _u("builtins") + _u("getattr") + b"\x93" + _u("os") + b".",
                                       "builtins.getattr")
    return cases


def torch_zip(data_pkl: bytes, prefix: str = "archive", compress: int = zipfile.ZIP_STORED) -> bytes:
    """A `torch.save`-shaped zip archive (torch 2.x member layout) around `data_pkl`, built without torch."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compress) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        z.writestr(f"{prefix}/.format_version", "1")
        z.writestr(f"{prefix}/.storage_alignment", "64")
        z.writestr(f"{prefix}/byteorder", "little")
        z.writestr(f"{prefix}/version", "3\n")
        z.writestr(f"{prefix}/.data/serialization_id", "0123456789")
    return buf.getvalue()


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    m = tmp_path / "PWNED"
    yield m
    assert not m.exists(), "a hostile pickle was executed"


# --- real checkpoints parse -------------------------------------------------------------------------------------


REAL_METADATA = [
    SAMPLES / "torch_dist" / "iter_0000001" / ".metadata",
    SAMPLES / "torch_dist_fully" / "iter_0000001" / ".metadata",
    SAMPLES / "dcp" / "step-10" / ".metadata",
    FIXTURE_0192 / "iter_0000400" / ".metadata",
]


@pytest.mark.parametrize("path", REAL_METADATA, ids=lambda p: f"{p.parents[1].name}/{p.parent.name}")
def test_real_metadata_parses_with_allowlisted_globals_only(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path} not available")
    data = path.read_bytes()
    report = PickleReport()
    md = read_dcp_metadata(data, report)
    assert md.tensors and md.objects
    assert all(c.storage is not None for t in md.tensors for c in t.chunks)
    assert report.globals and not report.dangerous and not report.unknown
    walk = walk_pickle(data)
    assert walk.complete and walk.segments == 1
    assert set(walk.globals) == set(report.globals)
    assert all(v is GlobalClass.ALLOWED for v in walk.globals.values())


def test_real_common_pt_and_legacy_files_read_without_torch_globals_outside_the_allowlist() -> None:
    files = [SAMPLES / "torch_dist" / "iter_0000001" / "common.pt",
             *sorted((SAMPLES / "legacy").glob("iter_*/mp_rank_*/*.pt"))]
    files = [f for f in files if f.is_file()]
    if not files:
        pytest.skip("samples not available")
    for f in files:
        with open(f, "rb") as fh:
            archive = read_torch_archive(fh)
        assert not archive.report.dangerous and not archive.report.unknown, f
        assert isinstance(to_plain(archive.obj), dict)


# --- hostile pickles: never executed, always named ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(hostile_corpus(Path("/x"))))
def test_hostile_pickle_is_not_executed_and_flagged(name: str, marker: Path) -> None:
    data, dangerous = hostile_corpus(marker)[name]
    report = PickleReport()
    try:
        obj = load_pickle(data, report)
    except ReadError:
        obj = None  # refusing is fine; running is not
    assert not marker.exists()
    assert report.globals.get(dangerous) is GlobalClass.DANGEROUS, report.globals
    if obj is not None:
        to_plain(obj)  # converting the stand-ins runs nothing either
    assert not marker.exists()
    walk = walk_pickle(data)
    assert walk.complete, walk.error or walk.limit
    assert walk.globals.get(dangerous) is GlobalClass.DANGEROUS, walk.globals


def test_calling_a_placeholder_records_instead_of_running(marker: Path) -> None:
    data, _ = hostile_corpus(marker)["os.system/p4"]
    obj = load_pickle(data, PickleReport())
    assert isinstance(obj, Opaque) and obj.verdict is GlobalClass.DANGEROUS
    assert obj.get("_args") == (f"touch {marker}",)


@pytest.mark.parametrize("name", ["os.system/p2", "stack-global-from-memo", "inst-protocol0", "nested-in-dict-list-tuple/p5"])
def test_hostile_data_pkl_inside_a_torch_archive(name: str, marker: Path, tmp_path: Path) -> None:
    data, dangerous = hostile_corpus(marker)[name]
    for compress in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        blob = torch_zip(data, compress=compress)
        archive = read_torch_archive(io.BytesIO(blob))
        assert dangerous in archive.report.dangerous
        # the same archive as a stored item in the middle of a data file
        f = tmp_path / "item.distcp"
        f.write_bytes(b"\0" * 100 + blob + b"\0" * 50)
        with open(f, "rb") as fh:
            archive = read_torch_archive(fh, 100, len(blob))
        assert dangerous in archive.report.dangerous


def test_hostile_torch_save_archive_written_by_torch(marker: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "common.pt"
    torch.save({"args": Reduce(os.system, (f"touch {marker}",)), "iteration": 3}, path)
    with open(path, "rb") as fh:
        archive = read_torch_archive(fh)
    assert archive.report.dangerous == ["posix.system"]
    assert not marker.exists()


def test_concatenated_pickles_the_walker_sees_the_hidden_second_one(marker: Path) -> None:
    data = pickle.dumps({"iteration": 1}, protocol=4) + hostile_corpus(marker)["os.system/p4"][0]
    walk = walk_pickle(data)
    assert walk.segments == 2 and walk.dangerous == ["posix.system"]
    # Protocol-0 pickles after a protocol-4 one, and trailing bytes that are no pickle.
    data = pickle.dumps([1], protocol=4) + hostile_corpus(marker)["inst-protocol0"][0] + b"\x00\xffjunk"
    walk = walk_pickle(data)
    assert walk.segments == 2 and walk.dangerous == ["os.system"] and walk.trailing == 6
    # Bytes after a complete pickle that start like one but do not walk to a STOP (raw storages after the pickles of
    # a pre-1.6 torch.save): trailing data, not a broken pickle.
    walk = walk_pickle(pickle.dumps([1], protocol=2) + b"(K\x07\xff\xff\x00\x00")
    assert walk.complete and walk.segments == 1 and walk.trailing == 7 and walk.trailing_problem is not None


def test_dynamic_stack_global_and_unregistered_extension_codes() -> None:
    # STACK_GLOBAL fed by a call result (`str('os')`): the name is computed at load time, no allowlist can judge it.
    data = b"\x80\x04" + _u("builtins") + _u("str") + b"\x93" + _u("os") + b"\x85R" + _u("system") + b"\x93)R."
    walk = walk_pickle(data)
    assert walk.globals[DYNAMIC_GLOBAL] is GlobalClass.DANGEROUS
    report = PickleReport()
    load_pickle(data, report)  # the unpickler resolves it to os.system, still a placeholder
    # The report carries the walk's verdict too (audit and scan judge the same bytes alike).
    assert report.dangerous == [DYNAMIC_GLOBAL, "os.system"]
    # EXT codes resolve through the copyreg extension registry: unknown unless registered.
    walk = walk_pickle(b"\x80\x02\x82\x07)R.")
    assert walk.globals == {"copyreg.extension[7]": GlobalClass.UNKNOWN}
    assert "copyreg.extension[7]" in walk.called  # REDUCE on it: the registry entry would be called
    with pytest.raises(ReadError):
        load_pickle(b"\x80\x02\x82\x07)R.", PickleReport())


def test_python2_names_are_judged_as_the_unpickler_maps_them() -> None:
    # protocol < 3: `__builtin__.reduce` is imported as `functools.reduce` (fix_imports)
    walk = walk_pickle(b"c__builtin__\nreduce\n.")
    assert walk.globals == {"__builtin__.reduce": GlobalClass.DANGEROUS}
    # protocol 3+: no mapping, the name is judged as written
    assert walk_pickle(b"\x80\x03c__builtin__\nset\n.").globals == {"__builtin__.set": GlobalClass.ALLOWED}


# --- resource attacks ------------------------------------------------------------------------------------------------


HUGE = 100 << 30  # 100 GiB


@pytest.mark.parametrize("opcode", [b"\x8d", b"\x8e", b"\x96"], ids=["BINUNICODE8", "BINBYTES8", "BYTEARRAY8"])
def test_a_100_gb_length_claim_is_a_bounded_error(opcode: bytes) -> None:
    data = b"\x80\x05" + opcode + HUGE.to_bytes(8, "little") + b"abc."
    with pytest.raises(ReadError):
        load_pickle(data, PickleReport())
    walk = walk_pickle(data)
    assert walk.limit is not None and "claims" in walk.limit
    # a length a little beyond the data: plain truncation (a cut file), not a resource attack
    walk = walk_pickle(b"\x80\x04X\x64\x00\x00\x00" + b"a" * 20 + b".")
    assert walk.error is not None and walk.error.startswith("truncated")
    # a FRAME that claims more than there is
    assert walk_pickle(b"\x80\x04\x95" + HUGE.to_bytes(8, "little") + b"K\x01.").limit is not None


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("opcode", [b"\x8d", b"\x8e", b"\x96"], ids=["BINUNICODE8", "BINBYTES8", "BYTEARRAY8"])
def test_a_100_gb_length_claim_in_a_streamed_metadata_file_is_quiet(opcode: bytes, tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """`.metadata` is streamed from its file: an allocation the claim makes fail must end as a finding, with no
    exception escaping into the interpreter's unraisable hook (CPython's BYTEARRAY8 path leaves a bytearray with an
    exported buffer behind: "SystemError: deallocated bytearray object has exported buffers" on stderr)."""
    from ckptinspect.formats.dcp.reader import read_dcp_dir

    (tmp_path / ".metadata").write_bytes(b"\x80\x05" + opcode + HUGE.to_bytes(8, "little") + b"abc.")
    d = read_dcp_dir(tmp_path, "ck")
    assert d.metadata is None and [f.code for f in d.findings] in (["CK603"], ["CK106"])
    del d
    gc.collect()
    err = capfd.readouterr().err
    assert "Error" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("shape", ["marks", "lists", "tuples", "dicts"])
def test_100000_deep_nesting_is_no_recursion_error(shape: str) -> None:
    n = 100_000
    if shape == "marks":
        data = b"\x80\x02" + b"(" * n + b"l" * n + b"."  # MARK ... LIST, nested
    elif shape == "lists":
        data = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    elif shape == "tuples":
        data = b"\x80\x02)" + b"\x85" * n + b"."
    else:
        data = b"\x80\x02}" + b"(K\x01}" * n + b"u" * n + b"."
    walk = walk_pickle(data)
    # The walk bounds nesting whatever opcode builds it (issue 18: the C unpickler hashes deep tuples in C).
    assert walk.limit is not None and "nesting deeper than" in walk.limit
    try:
        obj = load_pickle(data, PickleReport())
    except ReadError:
        return  # refusing is fine
    with pytest.raises(LimitExceeded):
        to_plain(obj)
    assert MAX_NESTING < n


def test_walker_bounds_ops_and_stack() -> None:
    data = b"\x80\x04" + b"N" * 5000 + b"."
    assert walk_pickle(data, max_ops=100).limit == "more than 100 opcodes"
    assert "stack entries" in (walk_pickle(data, max_stack=100).limit or "")


def test_giant_memo_index_does_not_blow_up_the_walker_and_is_reported() -> None:
    walk = walk_pickle(b"\x80\x04K\x01r\xff\xff\xff\x7fj\xff\xff\xff\x7f\x86.")
    assert walk.error is None and walk.max_memo_index == 0x7FFF_FFFF
    assert walk.limit is not None and "memo index" in walk.limit
    ok = walk_pickle(pickle.dumps([str(i) for i in range(300)] * 2, protocol=2))  # BINPUT/LONG_BINPUT up to 300
    assert ok.complete and 255 < ok.max_memo_index < ok.ops


def test_giant_memo_index_does_not_blow_up_the_unpickler() -> None:
    """A 14-byte pickle `BININT1 1; LONG_BINPUT 0x02000000; STOP` must not make the unpickler allocate and zero a
    memo table of 2 × 2^25 pointers (the C unpickler resizes its memo array to twice the index): ~512 MiB for this
    index, 32 GiB for 0x7fffffff. Run in a subprocess to measure its peak memory."""
    code = textwrap.dedent("""
        import resource, sys
        from ckptinspect.errors import ReadError
        from ckptinspect.pickling.unpickle import PickleReport, load_pickle
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_pickle(b"\\x80\\x04K\\x01r\\x00\\x00\\x00\\x02.", PickleReport())
        except ReadError:
            pass
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        print(grown)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    grown_mb = int(out.stdout.strip())
    assert grown_mb < 128, f"unpickling a 14-byte pickle grew the process by {grown_mb} MiB"


def _forge_member_size(blob: bytes, name: str, size: int) -> bytes:
    """Rewrite the uncompressed size of member `name` in its local header and central directory entry."""
    out = bytearray(blob)
    enc = name.encode()
    i = out.find(b"PK\x03\x04" + b"")
    while i >= 0:
        if out[i + 30 : i + 30 + len(enc)] == enc:
            out[i + 22 : i + 26] = struct.pack("<I", size)
        i = out.find(b"PK\x03\x04", i + 4)
    j = out.find(b"PK\x01\x02")
    while j >= 0:
        if out[j + 46 : j + 46 + len(enc)] == enc:
            out[j + 24 : j + 28] = struct.pack("<I", size)
        j = out.find(b"PK\x01\x02", j + 4)
    return bytes(out)


def _deflated_zeros(n: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = b"\0" * (1 << 20)
    parts = [c.compress(block) for _ in range(n >> 20)]
    return b"".join(parts) + c.flush()


def test_zip_bomb_data_pkl_is_limit_exceeded() -> None:
    # data.pkl declares 4 GiB uncompressed: refused before inflating anything
    blob = _forge_member_size(torch_zip(pickle.dumps([0] * 1000, protocol=2), compress=zipfile.ZIP_DEFLATED),
                              "archive/data.pkl", 0xFFFF_FFF0)
    with pytest.raises(LimitExceeded):
        read_torch_archive(io.BytesIO(blob))


@pytest.mark.slow
def test_zip_bomb_that_lies_small_is_bounded() -> None:
    # 64 MiB of zeros deflated to ~64 KiB, declared as 1000 bytes: inflation stops at the declared size (CRC error)
    blob = torch_zip(b"placeholder", compress=zipfile.ZIP_DEFLATED)
    zf = zipfile.ZipFile(io.BytesIO(blob))
    info = zf.getinfo("archive/data.pkl")
    bomb = _deflated_zeros(64 << 20)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        zi = zipfile.ZipInfo("archive/data.pkl", date_time=info.date_time)
        zi.compress_type = zipfile.ZIP_STORED
        z.writestr(zi, bomb)  # raw deflate bytes stored; re-labelled as deflated below
        z.writestr("archive/version", "3\n")
    raw = bytearray(buf.getvalue())
    for sig, method_at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        k = raw.find(sig)
        raw[k + method_at : k + method_at + 2] = struct.pack("<H", zipfile.ZIP_DEFLATED)
    blob2 = _forge_member_size(bytes(raw), "archive/data.pkl", 1000)
    with pytest.raises(ReadError):
        read_torch_archive(io.BytesIO(blob2))


@pytest.mark.parametrize("blob", [b"", b"PK\x03\x04", b"PK\x03\x04" + b"\0" * 100, b"\x80\x02K\x01.", b"hello"],
                         ids=["empty", "header-only", "zeros", "raw-pickle", "text"])
def test_not_an_archive_is_a_read_error(blob: bytes) -> None:
    with pytest.raises(ReadError):
        read_torch_archive(io.BytesIO(blob))


# --- differential: the walker sees every global the unpickler would resolve ------------------------------------


class _Recorder(pickle.Unpickler):
    """Records find_class calls and returns an inert callable: the reference for what a pickle imports."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.seen: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        self.seen.append(f"{module}.{name}")
        return _inert

    def persistent_load(self, pid: Any) -> Any:
        return None


def _inert(*args: Any, **kwargs: Any) -> None:
    return None


_leaves = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20),
                    st.booleans(), st.none())
_values = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.tuples(inner, inner), st.dictionaries(st.text(max_size=8), inner, max_size=5),
    st.frozensets(st.integers(), max_size=4), st.builds(lambda v: Reduce(os.system, (str(v),)), inner),
    st.builds(lambda v: Reduce(subprocess.Popen, (v,)), inner)), max_leaves=25)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(value=_values, proto=st.integers(0, 5))
def test_walker_finds_every_global_the_unpickler_resolves(value: Any, proto: int) -> None:
    data = pickle.dumps(value, protocol=proto)
    rec = _Recorder(data)
    rec.load()
    walk = walk_pickle(data)
    assert walk.complete
    assert set(rec.seen) <= set(walk.globals)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(value=_values, proto=st.integers(0, 5), cuts=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                              max_size=6), cut=st.integers(0, 10_000))
def test_walker_and_unpickler_never_crash_on_mutated_pickles(value: Any, proto: int, cuts: list[tuple[int, int]],
                                                             cut: int) -> None:
    data = bytearray(pickle.dumps(value, protocol=proto))
    for pos, byte in cuts:
        data[pos % len(data)] = byte
    mutated = bytes(data[: max(1, cut % (len(data) + 1))])
    walk = walk_pickle(mutated)  # never raises
    assert walk.ops <= len(mutated)
    report = PickleReport()
    try:
        obj = load_pickle(mutated, report)
        to_plain(obj)
    except ReadError:
        pass
    # Whatever the unpickler resolved, the walker saw too: when it walked the whole stream, and no name was computed
    # at load time (a call result fed to STACK_GLOBAL, which the walker reports as such instead).
    if walk.complete and DYNAMIC_GLOBAL not in walk.globals:
        assert set(report.globals) <= set(walk.globals)


# --- torch stays out of the process ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_and_cli_runs_leave_torch_unimported(tmp_path: Path) -> None:
    if not (SAMPLES / "torch_dist").is_dir():
        pytest.skip("samples not available")
    code = textwrap.dedent(f"""
        import sys
        import ckptinspect
        assert "torch" not in sys.modules, "import ckptinspect imported torch"
        import typer
        from typer.testing import CliRunner
        from ckptinspect.cli.app import app
        from ckptinspect.cli.scan_cmd import register
        runner = CliRunner()
        samples = {str(SAMPLES)!r}
        runs = [["info", samples + "/torch_dist", "-o", "json"], ["info", samples + "/legacy"],
                ["audit", samples + "/torch_dist", "--deep", "--all", "-o", "json"], ["audit", samples + "/legacy"],
                ["audit", samples + "/dcp", "--deep"], ["sniff", samples + "/torch_dist_fully"],
                ["estimate", "--from", samples + "/torch_dist", "-o", "json"],
                ["audit", samples + "/torch_dist_not_fully", "-o", "json"]]
        for args in runs:
            r = runner.invoke(app, args)
            assert r.exit_code in (0, 1), (args, r.exit_code, r.output[-2000:])
        scan_app = typer.Typer()
        scan_app.callback()(lambda: None)
        register(scan_app)
        r = runner.invoke(scan_app, ["scan", samples, "-o", "json"])
        assert r.exit_code == 0, r.output[-2000:]
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]
    plain = subprocess.run([sys.executable, "-c", "import sys, ckptinspect; assert 'torch' not in sys.modules"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr


def test_walking_the_same_bytes_again_gives_an_equal_independent_result() -> None:
    """`walk_pickle` answers bytes it walked before from a cache (audit and scan walk the same pickles): the answer
    equals a fresh walk, is the caller's own copy, and one changed byte is a different pickle."""
    import ckptinspect.pickling.walk as walk_mod

    evil = b"\x80\x02cposix\nsystem\nX\x01\x00\x00\x00xR."
    first = walk_pickle(evil)
    first.called.clear()
    first.refs.clear()
    second = walk_pickle(evil)
    assert second.called and second.globals == {"posix.system": GlobalClass.DANGEROUS}
    assert second == walk_mod._walk(walk_mod.Source(evil), walk_mod.MAX_OPS, walk_mod.MAX_STACK)
    benign = evil.replace(b"posix\nsystem", b"posix\nsystex")
    assert walk_pickle(benign).globals == {"posix.systex": GlobalClass.DANGEROUS}
    assert walk_pickle(evil, max_ops=2).limit is not None  # other bounds: walked again, not taken from the cache
