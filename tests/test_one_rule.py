"""One rule decides every global: the opcode walker (the verdict `scan` gives), the safe unpickler (`audit`'s readers)
and the streaming `.metadata` reader judge every pickle alike — same verdict, same globals, same findings.

The targeted tests below are the drifts found between them (each failed before its fix).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ckptinspect.errors import ReadError
from ckptinspect.formats.dcp_stream import read_dcp_metadata_columns
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.report import PickleReport, safety_findings
from ckptinspect.pickling.unpickle import load_pickle
from ckptinspect.pickling.walk import walk_pickle
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
        fallback = read_dcp_metadata_columns(io.BytesIO(data), report).fallback
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
