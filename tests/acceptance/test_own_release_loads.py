"""Ground truth from each sample's OWN release: megatron-core X loaded the sample megatron-core X wrote.

The test extra pins megatron-core 0.16.1, so the other releases cannot run in this suite. Their loads were run once,
each from its own virtualenv (0.19.2: Python 3.12 with torch 2.14.1, a CUDA build run on the CPU) (sample_ckpts/README.md, "Generation samples"), with

    V/bin/python tools/mcore_load.py --tp 2 --pp 1 --dp 2 --case NAME=sample_ckpts/NAME/iter_0000001:optim \
        --record sample_ckpts/own_release_loads.json

which runs Megatron's own torch_dist load path (`dist_checkpointing.load` of the model and DistributedOptimizer
sharded state dicts, then `load_state_dict`) at the saved topology and records the release, torch and Python that
did it. This test checks the record against the samples: every generation sample was loaded, with its optimizer, by
exactly the release its README row names, and ckptinspect's `complete` agrees with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckptinspect import Status, audit

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"
RECORD = json.loads((SAMPLES / "own_release_loads.json").read_text())


def _generation_rows() -> dict[str, str]:
    """sample -> release, from the README's "Generation samples" table."""
    text = (SAMPLES / "README.md").read_text()
    table = text.split("## Generation samples", 1)[1].split("\n\n", 2)[1]
    rows = dict(re.findall(r"^\| `([a-z0-9_]+)/` \| megatron-core ([0-9.]+)", table, re.M))
    assert rows, "README generation table not found"
    return rows


ROWS = _generation_rows()
# Where each was saved (README table): the 0.19.2 save is TP2 x PP2 x DP2 at iteration 400, the others TP2 x PP1 x DP2.
SAVED_AT = {"mcore_0_19_2": ("iter_0000400", {"tp": 2, "pp": 2, "dp": 2})}


def test_every_generation_sample_has_an_own_release_load() -> None:
    assert set(ROWS) == set(RECORD), (sorted(ROWS), sorted(RECORD))


@pytest.mark.parametrize("sample", sorted(ROWS))
def test_own_release_loaded_it_and_ckptinspect_agrees(sample: str) -> None:
    rec = RECORD[sample]
    it, topo = SAVED_AT.get(sample, ("iter_0000001", {"tp": 2, "pp": 1, "dp": 2}))
    assert rec["megatron_core"] == ROWS[sample], "loaded by another release than the one that wrote it"
    assert rec["checkpoint"] == f"sample_ckpts/{sample}/{it}"
    assert rec["load_optim"] is True and rec["topology"] == topo
    assert rec["ok"] is True, rec["error"]
    assert audit(SAMPLES / sample).status is Status.COMPLETE
