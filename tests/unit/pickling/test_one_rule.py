"""One rule decides every global: the opcode walker (the verdict `scan` gives), the safe unpickler (`audit`'s readers)
and the streaming `.metadata` reader judge every pickle alike — same verdict, same globals, same findings.

The targeted tests first: the drifts found between them (each failed before its fix). Then the property
(`judge_alike`) over every pickle the suite knows, each source one test: the samples (`sample_ckpts/`), the acceptance
corpus (every case of `corpus*.py` built), the hostile samples (`hostile_samples.py`) with the drift gadgets, the
allowlist witnesses (`test_allowlist_entries.py`) and, marked `fuzz`, seeded cases of the fuzz suite's mutations
(`CKPTINSPECT_ONE_RULE_FUZZ_CASES`, default 60). A pickle is every one `scan` finds (whole files, stored items,
archive members) and the pickles / archives held as byte strings inside them. Run with `-s` to see how many each
source gave.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import shutil
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.errors import ReadError
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.report import VERDICT_RANK, PickleReport, safety_findings
from ckptinspect.formats.dcp.vm_eval import Fallback, Sink
from ckptinspect.formats.dcp.vm_walk import Walker
from ckptinspect.formats.dcp.vm_walk import walk as swalk
from ckptinspect.pickling.unpickle import SafeUnpickler, load_pickle
from ckptinspect.pickling.walk import PickleWalk, walk_pickle
from conftest import SAMPLES

# A `.metadata` written by torch DCP (torchtitan's writer), read by all three interpreters.
DCP_METADATA = SAMPLES / "dcp" / "step-10" / ".metadata"


def _u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _ref(module: str, name: str) -> bytes:
    """STACK_GLOBAL module name, then POP: a reference that leaves the stack as it was."""
    return _u(module) + _u(name) + b"\x930"


def _before_stop(metadata: bytes, extra: bytes) -> bytes:
    """A real `.metadata` with `extra` opcodes run just before its final STOP (the root is left as the result)."""
    assert metadata.endswith(b".")
    return metadata[:-1] + extra + b"."


def _findings(report: PickleReport) -> list[dict[str, object]]:
    return [f.to_dict() for f in safety_findings(report.globals, report.called, ".metadata", "ckpt", "x")]


def _stream(data: bytes) -> tuple[PickleReport, str | None]:
    report = PickleReport()
    try:
        fallback = read_metadata(io.BytesIO(data), report).fallback
    except ReadError as e:
        fallback = f"error {e.code}"
    return report, fallback


# `megatron.core` + `os.system` is dangerous (the attribute chain passes through `os`); `megatron.core.os` +
# `system` is allowed by the module prefix (and fails to import). Both are `megatron.core.os.system` in a report.
ALLOWED_SPELLING = ("megatron.core.os", "system")
DANGEROUS_SPELLING = ("megatron.core", "os.system")
QUAL = "megatron.core.os.system"


def test_the_spellings_judge_apart() -> None:
    from ckptinspect.pickling.policy import resolve

    assert resolve(*ALLOWED_SPELLING).verdict is GlobalClass.ALLOWED
    assert resolve(*DANGEROUS_SPELLING).verdict is GlobalClass.DANGEROUS


def test_a_name_spelled_two_ways_keeps_the_worse_verdict_in_every_reader() -> None:
    """Drift: the safe unpickler's `find_class` overwrote the walk's verdict with the last spelling's, and the
    streaming reader cached the verdict per qualified name, so a dangerous spelling after an allowed one read as
    allowed (no CK601 from `audit` where `scan` reported it)."""
    for first, second in ((ALLOWED_SPELLING, DANGEROUS_SPELLING), (DANGEROUS_SPELLING, ALLOWED_SPELLING)):
        refs = _ref(*first) + _ref(*second)
        raw = b"\x80\x04" + refs + b"N."
        assert walk_pickle(raw).globals[QUAL] is GlobalClass.DANGEROUS
        report = PickleReport()
        load_pickle(raw, report)
        assert report.globals[QUAL] is GlobalClass.DANGEROUS, (first, second)

        data = _before_stop(DCP_METADATA.read_bytes(), refs)
        assert walk_pickle(data).globals[QUAL] is GlobalClass.DANGEROUS
        streamed, fallback = _stream(data)
        assert streamed.globals[QUAL] is GlobalClass.DANGEROUS, (first, second, fallback)
        assert fallback is not None  # judged by the reference, which the walk's verdict is merged into
        assert _findings(streamed)[0]["code"] == "CK601"


def test_a_pickle_after_the_metadata_is_judged_by_the_streaming_reader_too() -> None:
    """Drift: the streaming reader stopped at the first STOP, while the walk (and so `scan` and the reference reader)
    judges the pickles that follow it: a `.metadata` with a dangerous pickle appended read as safe."""
    data = DCP_METADATA.read_bytes() + b"\x80\x04" + _u("os") + _u("system") + b"\x93."
    assert walk_pickle(data).globals["os.system"] is GlobalClass.DANGEROUS
    streamed, fallback = _stream(data)
    assert fallback == "bytes after STOP"
    assert streamed.globals["os.system"] is GlobalClass.DANGEROUS
    assert [f["code"] for f in _findings(streamed)] == ["CK601"]
    # bytes that are no pickle change nothing: the reference reads the same model
    _, fallback = _stream(DCP_METADATA.read_bytes())
    assert fallback is None


_IMPORT_MODULE = _u("megatron.core.transformer.spec_utils") + _u("import_module") + b"\x93"  # allowed by prefix
_NAMESPACE = _u("argparse") + _u("Namespace") + b"\x93)\x81"  # an instance of an allowed plain class
# Ways a pickle gets a global called without REDUCE-ing it, each leaving the stack as it was (the final POP).
IMPLICIT_CALLS = {
    "a __setstate__ hook in a BUILD state": _NAMESPACE + b"}" + _u("__setstate__") + _IMPORT_MODULE + b"sb}b0",
    "an append hook": _NAMESPACE + b"}" + _u("append") + _IMPORT_MODULE + b"sb0",
    "a __class__ slot state": _NAMESPACE + b"N}" + _u("__class__") + _IMPORT_MODULE + b"s\x86b0",
    "a class as the BUILD state": _NAMESPACE + _IMPORT_MODULE + b"b0",
    "defaultdict's default factory": _u("collections") + _u("defaultdict") + b"\x93" + _IMPORT_MODULE + b"\x85R0",
    "functools.partial": _u("functools") + _u("partial") + b"\x93" + _IMPORT_MODULE + b"\x85R0",
}


@pytest.mark.parametrize("gadget", list(IMPLICIT_CALLS))
def test_a_global_called_implicitly_in_a_metadata_is_judged_by_the_streaming_reader(gadget: str) -> None:
    """Drift: the streaming reader judged only REDUCE / NEWOBJ callees, so a `.metadata` holding a global the
    unpickler calls through a hook, a state or a `THROUGH` helper read as safe where the walk (`scan`) reports
    CK604. It now hands what it does not judge as the walk does to the reference reader."""
    data = _before_stop(DCP_METADATA.read_bytes(), IMPLICIT_CALLS[gadget])
    walk = walk_pickle(data)
    assert "megatron.core.transformer.spec_utils.import_module" in walk.called
    streamed, fallback = _stream(data)
    assert fallback is not None
    assert streamed.called.keys() == walk.called.keys()
    walked = PickleReport()
    walked.merge_walk(walk)
    assert _findings(streamed) == _findings(walked)
    assert "CK604" in {f["code"] for f in _findings(streamed)}


# --- the property: every pickle the suite knows, judged by the three interpreters ------------------------------------


class _Asked(SafeUnpickler):
    """The safe unpickler, recording every (module, name) its `find_class` is asked."""

    def __init__(self, file: IO[bytes], report: PickleReport) -> None:
        super().__init__(file, report)
        self.asked: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.asked.add((module, name))
        return super().find_class(module, name)


def _verdict(report: PickleReport) -> str:
    return "unsafe" if report.unsafe else "unknown" if report.unknown else "safe"


def _walked(walk: PickleWalk) -> PickleReport:
    report = PickleReport()
    report.merge_walk(walk)
    return report


def judge_alike(data: bytes) -> str:
    """Judge `data` with the walker, the safe unpickler (alone, and as the readers use it: after the walk) and the
    streaming reader (its evaluator over any pickle, the whole reader as `.metadata`); assert one verdict, one set of
    globals, the same findings. Returns how far the streaming reader read it alone: "metadata" (the whole reader, as
    a `.metadata`), "stream" (its evaluator, to the STOP), "fallback" / "error" (handed to the reference)."""
    walk = walk_pickle(data)
    walked = _walked(walk)
    expect = (_verdict(walked), dict(walked.globals), _findings(walked))

    # the safe unpickler on its own: it asks for no global the walk did not see, and judges each one alike. Only
    # within the walk's bounds (past them the readers refuse the bytes: a memo index can cost the unpickler GiBs).
    if walk.limit is None:
        alone = PickleReport()
        unpickler = _Asked(io.BufferedReader(io.BytesIO(data)), alone)
        try:
            unpickler.load()
            loaded = True
        except Exception:  # noqa: BLE001 - a broken pickle: what it asked before failing is still compared
            loaded = False
        seen = {(r.module, r.name) for r in walk.refs}
        assert unpickler.asked <= seen, unpickler.asked - seen
        for q, v in alone.globals.items():
            assert VERDICT_RANK[v] <= VERDICT_RANK[walk.globals[q]], (q, v, walk.globals[q])
        if loaded and walk.segments == 1 and walk.error is None:
            assert alone.globals == walk.globals

    # the safe unpickler as every reader uses it (`load_pickle`: the walk's verdict merged, then the unpickling)
    report = PickleReport()
    try:
        load_pickle(data, report)
    except ReadError:
        pass
    assert (_verdict(report), dict(report.globals), _findings(report)) == expect

    # the streaming reader as `.metadata`: through, or handed to the reference reader (whatever the bytes are)
    streamed, fallback = _stream(data)
    assert (_verdict(streamed), dict(streamed.globals), _findings(streamed)) == expect
    how = "metadata" if fallback is None else "stream"

    # the streaming evaluator over any pickle: what it reads through to its STOP it judges alone
    probe = PickleReport()
    w = Walker(io.BytesIO(data), Sink(), probe, len(data))
    try:
        swalk(w)
    except Fallback:
        return "fallback"
    except (IndexError, KeyError, TypeError, ValueError, OverflowError, UnicodeDecodeError, AttributeError,
            RecursionError, MemoryError, ReadError):
        return "error"  # as `read_metadata` treats them: the reference reads it
    finally:
        w.release()
    assert (_verdict(probe), dict(probe.globals), _findings(probe)) == expect
    return how


def _nested(data: bytes, out: list[bytes], depth: int = 0) -> None:
    """`data` and the pickles / zip archives held as byte strings inside it (`PickleWalk.blobs`)."""
    out.append(data)
    if depth >= 3:
        return
    for off, n, latin1 in walk_pickle(data).blobs:
        blob = data[off:off + n]
        if latin1:
            try:
                blob = blob.decode("utf-8").encode("latin-1")
            except (UnicodeDecodeError, UnicodeEncodeError):
                continue
        if blob[:4] == b"PK\x03\x04":
            out.extend(_zip_pickles(blob))
        else:
            _nested(blob, out, depth + 1)


def _zip_pickles(archive: bytes) -> list[bytes]:
    out: list[bytes] = []
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            for info in z.infolist():
                if info.file_size <= 1 << 26 and (info.filename.endswith(".pkl") or "/data/" in info.filename):
                    member = z.read(info)
                    if member.endswith(b".") and walk_pickle(member).error is None:
                        _nested(member, out, 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, KeyError, RuntimeError):
        pass
    return out


def pickles_under(path: Path) -> list[bytes]:
    """Every pickle `scan` finds under `path` (whole files, stored items, archive members), and the ones inside them."""
    out: list[bytes] = []
    files: dict[Path, bytes] = {}
    for p in scan_path(path).pickles:
        f = path / p.file if path.is_dir() else path
        if f not in files:
            try:
                files[f] = f.read_bytes()
            except OSError:
                continue
        data = files[f][p.offset:p.offset + p.length]
        if p.member is None:
            _nested(data, out)
            continue
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                _nested(z.read(p.member), out)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, KeyError, RuntimeError):
            continue  # a member only torch's reader finds (case, duplicates, a second directory): not extracted
    return out


# How many distinct pickles each source gave (printed at the end of a run with -s).
COVERED: dict[str, dict[str, int]] = {}


def judge_all(source: str, pickles: Iterable[bytes], seen: set[bytes] | None = None) -> dict[str, int]:
    seen = set() if seen is None else seen
    counts = {"pickles": 0, "stream": 0, "metadata": 0}
    for data in pickles:
        key = hashlib.blake2b(data, digest_size=16).digest()
        if key in seen:
            continue
        seen.add(key)
        counts["pickles"] += 1
        try:
            how = judge_alike(data)
        except AssertionError as e:
            raise AssertionError(f"{source}: the interpreters disagree on {data[:120]!r}... ({len(data)} bytes)") from e
        counts["stream"] += how in ("stream", "metadata")
        counts["metadata"] += how == "metadata"
    COVERED[source] = {k: COVERED.get(source, {}).get(k, 0) + v for k, v in counts.items()}
    return counts


@pytest.fixture(autouse=True, scope="module")
def _coverage_note() -> Iterator[None]:
    """Say how many distinct pickles each source gave (shown with `-s`)."""
    yield
    for source, c in COVERED.items():
        print(f"\none rule: {source}: {c['pickles']} distinct pickles; the streaming evaluator read {c['stream']} "
              f"through, the streaming .metadata reader {c['metadata']}")


def test_every_sample_pickle_is_judged_alike() -> None:
    seen: set[bytes] = set()
    got = {"pickles": 0, "stream": 0, "metadata": 0}
    for base in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        c = judge_all("sample_ckpts", pickles_under(base), seen)
        got = {k: got[k] + c[k] for k in got}
    assert got["pickles"] >= 200 and got["metadata"] >= 20, got


def test_every_corpus_pickle_is_judged_alike(tmp_path: Path) -> None:
    """Every case of the acceptance corpus (damaged, hostile, edited with torch, the layouts and the stacks)."""
    from corpus import CASES, Ctx, missing_source
    from corpus_layouts import LAYOUT_CASES
    from corpus_stacks import STACK_CASES

    seen: set[bytes] = set()
    built = 0
    for i, case in enumerate((*CASES, *LAYOUT_CASES, *STACK_CASES)):
        if any(missing_source(s) for s in case.sources):
            continue
        work = tmp_path / f"c{i}"
        work.mkdir()
        marker = tmp_path / f"marker{i}"
        root = case.build(Ctx(work, marker))
        built += 1
        judge_all("corpus", pickles_under(root), seen)
        assert not marker.exists()
        shutil.rmtree(work, ignore_errors=True)
    assert built >= 100 and COVERED["corpus"]["pickles"] >= 100, (built, COVERED["corpus"])


def test_every_hostile_sample_and_drift_gadget_is_judged_alike(tmp_path: Path) -> None:
    import hostile_samples as hs

    marker = tmp_path / "marker"
    raw = [hs.payload(marker, kind) for kind in hs.PAYLOADS]
    raw += [_before_stop(DCP_METADATA.read_bytes(), g) for g in IMPLICIT_CALLS.values()]
    raw += [b"\x80\x04" + g + b"N." for g in IMPLICIT_CALLS.values()]
    refs = _ref(*ALLOWED_SPELLING) + _ref(*DANGEROUS_SPELLING)
    raw += [b"\x80\x04" + refs + b"N.", _before_stop(DCP_METADATA.read_bytes(), refs),
            DCP_METADATA.read_bytes() + raw[0]]
    files = {"torchscript.pt": hs.torchscript_bytes(marker), "tar.pt": hs.torch_tar_bytes({}, raw[0]),
             "payload.pt": hs.torch_save_bytes({"x": hs.Reduce(print, ("never run",))})}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    contained = [p for name in files for p in pickles_under(tmp_path / name)]
    c = judge_all("hostile", [*raw, *contained])
    assert c["pickles"] >= 20 and not marker.exists(), c


def test_every_allowlist_witness_is_judged_alike() -> None:
    from test_allowlist_entries import WITNESSES, _torch_pickle

    pickles: list[bytes] = []
    for witness in WITNESSES.values():
        obj = witness.build()
        if witness.torch:
            pickles.append(_torch_pickle(obj)[1])
            continue
        for protocol, fix_imports in ((0, True), (0, False), (2, True), (2, False), (4, True), (5, True)):
            try:
                pickles.append(pickle.dumps(obj, protocol=protocol, fix_imports=fix_imports))
            except TypeError:  # torch's memory formats pickle from protocol 4 on only
                continue
    c = judge_all("allowlist witnesses", pickles)
    assert c["pickles"] >= len(WITNESSES), c


def _hostile_module(name: str) -> Any:
    """A module of tests/hostile/ (the fuzz suite), as pytest imported it or from its file."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "hostile" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FUZZ_CASES = int(os.environ.get("CKPTINSPECT_ONE_RULE_FUZZ_CASES", "60"))


@pytest.mark.fuzz
def test_every_fuzzed_pickle_is_judged_alike(tmp_path: Path) -> None:
    """The fuzz suite's mutations (`test_fuzz.mutate`: byte flips, truncation, splices, the hostile operators of
    `fuzz_hostile_ops.py`) over its bases, seeded: every pickle in every mutated tree."""
    fuzz = _hostile_module("test_fuzz")
    BASES, mutate, reset = fuzz.BASES, fuzz.mutate, fuzz.reset

    seen: set[bytes] = set()
    bases = {name: src for name, src in BASES.items() if src.is_dir() and any(src.iterdir())}
    assert bases
    work = tmp_path / "work"
    for i in range(FUZZ_CASES):
        name = sorted(bases)[i % len(bases)]
        rng = random.Random(f"one-rule:{i}")
        reset(bases[name], work)
        applied = mutate(rng, work)
        try:
            judge_all("fuzz", pickles_under(work), seen)
        except AssertionError as e:
            raise AssertionError(f"case {i} ({name}, {applied})") from e
    assert COVERED["fuzz"]["pickles"] >= FUZZ_CASES, COVERED["fuzz"]

