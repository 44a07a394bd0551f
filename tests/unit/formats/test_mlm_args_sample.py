"""sample_ckpts/mlm_args: a save written by Megatron-LM's own training entry point (issue 24 §0).

`tools/make_mlm_args_sample.py` ran `pretrain_gpt.py` of Megatron-LM core_v0.16.1 on CPU (mock data, 2 iterations),
so `common.pt` holds the Namespace Megatron's `parse_args` + `validate_args` built, with `args.exit_signal =
signal.SIGTERM` pickled as `signal.Signals` (REDUCE). Real Megatron-LM checkpoints all carry that value, and
Megatron's own loader accepts it (`megatron/core/safe_globals.py` allowlists `signal.Signals`), so `audit` must call
the save `complete`. The pickle is read with pickletools only (nothing executed).
"""

from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES

SAVE = SAMPLES / "mlm_args"
COMMON = SAVE / "iter_0000002" / "common.pt"


def _common_pickle() -> bytes:
    with zipfile.ZipFile(COMMON) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_common_pt_args_pickle_references_signal_signals() -> None:
    """The value the audit has to accept is really there: `exit_signal` -> GLOBAL 'signal Signals', (15,), REDUCE."""
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(_common_pickle())]
    globals_ = [arg for name, arg in ops if name in ("GLOBAL", "STACK_GLOBAL")]
    assert "signal Signals" in globals_ and "argparse Namespace" in globals_, globals_
    at = next(i for i, (name, arg) in enumerate(ops) if name == "GLOBAL" and arg == "signal Signals")
    assert ("BINUNICODE", "exit_signal") in ops[at - 3:at]
    rest = [name for name, _ in ops[at + 1:at + 8] if not name.endswith("PUT")]
    assert rest[:3] == ["BININT1", "TUPLE1", "REDUCE"], rest  # Signals(15): SIGTERM


def test_tracker_names_the_saved_iteration() -> None:
    assert (SAVE / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert sorted(p.name for p in SAVE.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


def test_audit_of_the_real_megatron_lm_save_is_complete() -> None:
    r = CliRunner().invoke(app, ["audit", str(SAVE), "-o", "json"])
    doc = json.loads(r.stdout)
    assert (r.exit_code, doc["status"]) == (0, "complete"), doc["findings"]
    assert [f["code"] for f in doc["findings"] if f["severity"] in ("error", "warning")] == []
    assert doc["iteration"] == 2
