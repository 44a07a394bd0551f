"""The acceptance corpus: broken, half-written, hostile and healthy checkpoints, built at test time.

Every case copies a real checkpoint (the `sample_ckpts/` written by megatron-core 0.16.1 / torch DCP, or the
Megatron-Core 0.19.2 fixture) into a scratch dir and applies ONE mutation that mimics a real failure: a crash
during the save (reference §8.2), a lost or truncated file, a damaged `.metadata` (edited with torch's own DCP
classes), a tampered manifest, a hostile pickle. It declares what `ckptinspect audit` must say about it: the
status, the codes that must appear, the codes that must not, which path to audit and with which flags.

The cases live one module per check family (`corpus_healthy.py`, `corpus_storage.py`, `corpus_coverage.py`,
`corpus_formats.py`, `corpus_manifest.py`, `corpus_tracker.py`, `corpus_safety.py`, `corpus_legacy.py`,
`corpus_args.py`, `corpus_inflight.py`; the parallel layouts and the training stacks in `corpus_layouts.py` /
`corpus_stacks.py`), the builders and mutation helpers they share in `corpus_kit.py`. This module gathers the
families into `CASES` and re-exports the kit's names the tests import from here.

`tests/acceptance/test_acceptance.py` runs the CLI over `CASES` (case name = test id). Builders never touch the sources.
"""

from __future__ import annotations

from corpus_args import ARGS_CASES
from corpus_coverage import COVERAGE_CASES
from corpus_formats import FORMATS_CASES
from corpus_healthy import HEALTHY_CASES
from corpus_inflight import INFLIGHT_CASES
from corpus_kit import (
    SOURCES,
    Case,
    Ctx,
    Harmless,
    Hostile,
    _mutated,
    append_item,
    copy_source,
    edit_metadata,
    missing_source,
    torch_bytes,
)
from corpus_legacy import LEGACY_CASES
from corpus_manifest import MANIFEST_CASES
from corpus_safety import SAFETY_CASES
from corpus_storage import STORAGE_CASES
from corpus_tracker import TRACKER_CASES

__all__ = ["CASES", "SOURCES", "Case", "Ctx", "Harmless", "Hostile", "_mutated", "append_item", "copy_source",
           "edit_metadata", "missing_source", "torch_bytes"]

CASES: tuple[Case, ...] = (
    *HEALTHY_CASES, *STORAGE_CASES, *COVERAGE_CASES, *FORMATS_CASES, *MANIFEST_CASES, *TRACKER_CASES,
    *SAFETY_CASES, *LEGACY_CASES, *ARGS_CASES, *INFLIGHT_CASES,
)
