"""Shared test fixtures: where the sample checkpoints live, and the no-fixture-skip rule.

`SAMPLES` are the real checkpoints in `sample_ckpts/` (written by `tools/make_sample_ckpts.py` with megatron-core
0.13.1 / 0.14.0 / 0.15.3 / 0.16.1 and torch DCP; `mcore_0_19_2` by megatron-core 0.19.2). `FIXTURE_0192` is the
0.19.2 save dir with `integrity.json`. Everything a test reads is inside the repository. Never modify a sample:
copy it to `tmp_path` first.

The repo carries its own evidence: a test whose fixture is missing FAILS. The `pytest_runtest_makereport` hook
below turns any skip whose reason says a file or sample is missing into a failure, so a broken checkout can never
pass as "N passed, M skipped".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SAMPLES = Path(__file__).parents[1] / "sample_ckpts"
FIXTURE_0192 = SAMPLES / "mcore_0_19_2"

# Reasons that mean "a fixture file is not there" (as opposed to: not applicable on this platform).
MISSING_FIXTURE = re.compile(r"not available|not present|not generated|not found|no such file|absent|missing|fixture", re.I)


@pytest.fixture
def samples() -> Path:
    """The `sample_ckpts/` dir (fails the test when it does not exist)."""
    if not SAMPLES.is_dir():
        pytest.fail(f"{SAMPLES} is missing (the repo ships it; tools/make_sample_ckpts.py rebuilds it)")
    return SAMPLES


@pytest.fixture
def fixture_0192() -> Path:
    """The real Megatron-Core 0.19.2 save dir (fails the test when it does not exist)."""
    if not FIXTURE_0192.is_dir():
        pytest.fail(f"{FIXTURE_0192} is missing (the repo ships it)")
    return FIXTURE_0192


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if MISSING_FIXTURE.search(reason):
            report.outcome = "failed"
            report.longrepr = f"skipped for a missing fixture, which is a failure here: {reason}"
