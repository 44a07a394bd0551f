"""Ground truth from each sample's OWN release: megatron-core X loaded the sample megatron-core X wrote.

The test extra pins megatron-core 0.16.1, so the older releases cannot run in this suite. Their loads were run once,
each from its own virtualenv (sample_ckpts/README.md, "Generation samples"), with

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

SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"
RECORD = json.loads((SAMPLES / "own_release_loads.json").read_text())


def _generation_rows() -> dict[str, str]:
    """sample -> release, from the README's "Generation samples" table."""
    text = (SAMPLES / "README.md").read_text()
    table = text.split("## Generation samples", 1)[1].split("\n\n", 2)[1]
    rows = dict(re.findall(r"^\| `([a-z0-9_]+)/` \| megatron-core ([0-9.]+)", table, re.M))
    assert rows, "README generation table not found"
    return rows


ROWS = _generation_rows()
# megatron-core >=0.17 needs Python >=3.12, and the only torch for 3.12 here is a multi-GB CUDA build
# (sample_ckpts/README.md): the 0.19.2 sample is the one not loaded by its own release on this machine.
NOT_RUNNABLE_HERE = {"mcore_0_19_2"}


def test_every_generation_sample_has_an_own_release_load_or_a_stated_reason() -> None:
    assert set(ROWS) - NOT_RUNNABLE_HERE == set(RECORD), (sorted(ROWS), sorted(RECORD))
    assert NOT_RUNNABLE_HERE <= set(ROWS)


@pytest.mark.parametrize("sample", sorted(set(ROWS) - NOT_RUNNABLE_HERE))
def test_own_release_loaded_it_and_ckptinspect_agrees(sample: str) -> None:
    rec = RECORD[sample]
    assert rec["megatron_core"] == ROWS[sample], "loaded by another release than the one that wrote it"
    assert rec["checkpoint"] == f"sample_ckpts/{sample}/iter_0000001"
    assert rec["load_optim"] is True and rec["topology"] == {"tp": 2, "pp": 1, "dp": 2}
    assert rec["ok"] is True, rec["error"]
    assert audit(SAMPLES / sample).status is Status.COMPLETE
