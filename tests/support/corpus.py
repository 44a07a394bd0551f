"""The acceptance corpus: broken, half-written, hostile and healthy checkpoints, built at test time.

Every case copies a real checkpoint (the `sample_ckpts/` written by megatron-core 0.16.1 / torch DCP, or the
Megatron-Core 0.19.2 fixture) into a scratch dir and applies ONE mutation that mimics a real failure: a crash
during the save (reference §8.2), a lost or truncated file, a damaged `.metadata` (edited with torch's own DCP
classes), a tampered manifest, a hostile pickle. It declares what `ckptinspect audit` must say about it: the
status, the codes that must appear, the codes that must not, which path to audit and with which flags.

The cases live one module per check family (`corpus_healthy.py`, `corpus_storage.py`, `corpus_coverage.py`,
`corpus_formats.py`, `corpus_manifest.py`, `corpus_tracker.py`, `corpus_safety.py`, `corpus_legacy.py`,
`corpus_args.py`, `corpus_inflight.py`; the parallel layouts and the training stacks in `corpus_layouts.py` /
`corpus_stacks.py`; safetensors and the value scan in `corpus_safetensors.py` / `corpus_values.py`), the builders and mutation helpers they share in `corpus_kit.py`. This module registers the
families, in `FAMILIES` and nowhere else, and re-exports the kit's names the tests import from here:

- `ACCEPTANCE_CASES`: every family. `tests/acceptance/test_acceptance.py` runs the CLI over them (case name = test
  id); `tests/unit/render/test_sarif.py` takes its cases from them.
- `CASES`: the check families on the core samples (every family but `layouts` and `stacks`), which the object-storage,
  chunk-table and streaming-reader tests replay.
- `case_named(name)`: one case of `ACCEPTANCE_CASES`.

Builders never touch the sources.
"""

from __future__ import annotations

from corpus_args import ARGS_CASES
from corpus_coverage import COVERAGE_CASES
from corpus_formats import FORMATS_CASES
from corpus_healthy import HEALTHY_CASES
from corpus_dataloader import DATALOADER_CASES
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
from corpus_layouts import LAYOUT_CASES
from corpus_legacy import LEGACY_CASES
from corpus_lineage import LINEAGE_CASES
from corpus_manifest import MANIFEST_CASES
from corpus_safety import SAFETY_CASES
from corpus_safetensors import SAFETENSORS_CASES
from corpus_stacks import STACK_CASES
from corpus_storage import STORAGE_CASES
from corpus_tracker import TRACKER_CASES
from corpus_values import VALUES_CASES

__all__ = ["ACCEPTANCE_CASES", "CASES", "FAMILIES", "SOURCES", "Case", "Ctx", "Harmless", "Hostile", "_mutated",
           "append_item", "case_named", "copy_source", "edit_metadata", "missing_source", "torch_bytes"]

FAMILIES: dict[str, tuple[Case, ...]] = {
    "healthy": HEALTHY_CASES, "storage": STORAGE_CASES, "coverage": COVERAGE_CASES, "formats": FORMATS_CASES,
    "manifest": MANIFEST_CASES, "tracker": TRACKER_CASES, "safety": SAFETY_CASES, "legacy": LEGACY_CASES,
    "args": ARGS_CASES, "inflight": INFLIGHT_CASES,
    # on the parallel-layout samples and the training stacks' samples, not on the core ones
    "layouts": LAYOUT_CASES, "stacks": STACK_CASES, "dataloader": DATALOADER_CASES,
    # the release format and the value scan (`audit --values`): not replayed from object storage by CASES
    "safetensors": SAFETENSORS_CASES, "values": VALUES_CASES,
    # save dirs put together from several real saves' iteration dirs (CK525-CK529)
    "lineage": LINEAGE_CASES,
}
"""Every case family of the acceptance corpus, in the order the acceptance test runs them."""

ACCEPTANCE_CASES: tuple[Case, ...] = tuple(c for family in FAMILIES.values() for c in family)
CASES: tuple[Case, ...] = tuple(c for name, family in FAMILIES.items()
                                if name not in ("layouts", "stacks", "dataloader", "safetensors", "values", "lineage")
                                for c in family)

_BY_NAME = {c.name: c for c in ACCEPTANCE_CASES}


def case_named(name: str) -> Case:
    """The acceptance case called `name` (names are unique: `test_acceptance.py` checks it)."""
    return _BY_NAME[name]
