"""The pytest plugin (`pytest11` entry point): fixtures available without an import, failure messages that list
the findings. Runs inner pytest sessions with `pytester` on real samples and a truncated copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckptinspect.pytest_plugin import CheckpointFailed, assert_checkpoint

pytest_plugins = "pytester"

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"


@pytest.fixture
def truncated(tmp_path: Path) -> Path:
    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    victim = save / "iter_0000002" / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:100])
    return save


def test_assert_checkpoint_passes_and_fails_like_the_cli(truncated: Path) -> None:
    r = assert_checkpoint(SAMPLES / "torch_dist")
    assert r.status.value == "complete"
    with pytest.raises(CheckpointFailed) as e:
        assert_checkpoint(SAMPLES / "torch_dist", fail_on="warning")  # CK506: a crashed leftover iteration
    assert "CK506" in str(e.value) and "warning" in str(e.value)
    with pytest.raises(AssertionError) as e:
        assert_checkpoint(truncated)
    message = str(e.value)
    assert message.startswith(f"checkpoint {truncated}: corrupt")
    assert "CK202" in message and "past the end of the file" in message  # the findings table of the text report
    assert_checkpoint(truncated, fail_on="never")


@pytest.mark.slow
def test_fixtures_come_from_the_entry_point(pytester: pytest.Pytester, truncated: Path) -> None:
    pytester.makepyfile(f"""
        def test_good(ckpt_audit):
            r = ckpt_audit({str(SAMPLES / "torch_dist")!r})
            assert r.status.value == "complete" and r.exit_code() == 0

        def test_gate(ckpt_assert):
            ckpt_assert({str(truncated)!r})
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CheckpointFailed: checkpoint *: corrupt*", "*CK202*"])
