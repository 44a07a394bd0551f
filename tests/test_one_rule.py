"""One rule decides every global: the opcode walker (the verdict `scan` gives), the safe unpickler (`audit`'s readers)
and the streaming `.metadata` reader judge every pickle alike — same verdict, same globals, same findings.

The targeted tests below are the drifts found between them (each failed before its fix).
"""

from __future__ import annotations

import io
from pathlib import Path

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
