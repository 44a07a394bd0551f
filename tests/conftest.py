"""Shared test fixtures: where the sample checkpoints live, and the no-fixture-skip rule.

`SAMPLES` are the real checkpoints in `sample_ckpts/` (written by `tools/make_sample_ckpts.py` with megatron-core
0.13.1 / 0.14.0 / 0.15.3 / 0.16.1 and torch DCP; `mcore_0_19_2` by megatron-core 0.19.2). `FIXTURE_0192` is the
0.19.2 save dir with `integrity.json`. Everything a test reads is inside the repository. Never modify a sample:
copy it to `tmp_path` first.

The repo carries its own evidence: a test whose fixture is missing FAILS. The `pytest_runtest_makereport` hook
below turns any skip whose reason says a file or sample is missing into a failure, so a broken checkout can never
pass as "N passed, M skipped".

Markers (registered in pyproject.toml): `storage` is set here, on every test that uses an object-storage server
fixture (`s3_server`, `gcs_server`, `azurite_server`, or a fixture built on one); `slow`, `fuzz`, `live` and
`browser` are set on the tests themselves. The fast loop (CONTRIBUTING.md) deselects all five.
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


# The session fixtures that start a server on 127.0.0.1 (tests/support/s3_server.py, gcs_server.py, azurite_server.py).
STORAGE_SERVERS = frozenset({"s3_server", "gcs_server", "azurite_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `storage` every test whose fixture closure starts an object-storage server."""
    for item in items:
        if STORAGE_SERVERS.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.storage)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if MISSING_FIXTURE.search(reason):
            report.outcome = "failed"
            report.longrepr = f"skipped for a missing fixture, which is a failure here: {reason}"


# --- the fuzz suite's summary under pytest-xdist (tests/support/fuzz_stats.py) ----------------------------------------------

_FUZZ_WORKER_STATS: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Draw the fuzz seed once per session, before any pytest-xdist worker starts (they inherit the environment),
    so every worker's part of the fuzz suite uses the same seed and the summary can name it."""
    import os
    import random

    if "CKPTINSPECT_FUZZ_SEED" not in os.environ and not hasattr(config, "workerinput"):
        os.environ["CKPTINSPECT_FUZZ_SEED"] = str(random.SystemRandom().randrange(1 << 32))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist controller: keep the fuzz statistics a worker sent."""
    from fuzz_stats import WORKER_KEY

    doc = getattr(node, "workeroutput", {}).get(WORKER_KEY)
    if doc:
        _FUZZ_WORKER_STATS.append(doc)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """xdist controller: the fuzz section a serial run prints (tests/hostile/test_fuzz.py), from every worker's part."""
    if not _FUZZ_WORKER_STATS:
        return
    import os

    from fuzz_stats import Stats, summary_lines

    merged = Stats()
    for doc in _FUZZ_WORKER_STATS:
        merged.merge(doc)
    terminalreporter.section("ckptinspect fuzz")
    for line in summary_lines(merged, os.environ.get("CKPTINSPECT_FUZZ_SEED", "?"),
                              os.environ.get("CKPTINSPECT_FUZZ_CASES", "1000"),
                              os.environ.get("CKPTINSPECT_FUZZ_ONLY")):
        terminalreporter.write_line(line)
