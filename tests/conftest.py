"""Shared test fixtures: where the sample checkpoints and the shared real-checkpoint fixture live.

`SAMPLES` are the checkpoints `tools/make_sample_ckpts.py` writes with megatron-core / torch DCP (may be missing
while being regenerated). `FIXTURE_0192` is a real Megatron-Core 0.19.2 torch_dist save dir with `integrity.json`,
kept outside the repo in the `shared/` dir next to the repo dir; tests that need it skip when it is absent.
Never modify either: copy to `tmp_path` first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLES = Path(__file__).parents[1] / "sample_ckpts"
FIXTURE_0192 = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "mcore-0.19.2"


@pytest.fixture
def samples() -> Path:
    """The `sample_ckpts/` dir (skips the test when it does not exist)."""
    if not SAMPLES.is_dir():
        pytest.skip(f"{SAMPLES} not available (run tools/make_sample_ckpts.py)")
    return SAMPLES


@pytest.fixture
def fixture_0192() -> Path:
    """The real Megatron-Core 0.19.2 save dir (skips the test when it does not exist)."""
    if not FIXTURE_0192.is_dir():
        pytest.skip(f"{FIXTURE_0192} not available")
    return FIXTURE_0192
