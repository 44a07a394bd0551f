"""Megatron-Core's own dist_checkpointing unit tests as an oracle: `audit` agrees with what Megatron did.

`tests/data/megatron_unit_oracle/peer_mcore.txz` holds checkpoint dirs that Megatron-LM core_v0.16.1's
`tests/unit_tests/dist_checkpointing` (run unchanged on CPU/gloo, 8 ranks, by `tools/oracles/megatron_unit_tests/`)
wrote with `megatron.core.dist_checkpointing.save`; `peer_mcore.json` records, per dir, Megatron's own outcome:
`loaded` (a full `load()` in the test, or the harness's topology-free reload of every tensor and object, succeeded
and read every element), `loaded_with_gap` (it loaded but left elements no chunk covers), `save_rejected` (`save`
raised on some rank; the dir is what was on disk), `load_fails` (every load Megatron made failed). The README of
the harness gives the table this test enforces: `loaded` -> `complete`, exit 0; anything else -> not `complete`,
exit 1; never exit 3, never a hang. One test per dir, the capture id (sanitised test id / n-th save) as test id.
"""

from __future__ import annotations

import json
import signal
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app

CORPUS = Path(__file__).parents[1] / "data" / "megatron_unit_oracle"
ARCHIVE = CORPUS / "peer_mcore.txz"
DOC = json.loads((CORPUS / "peer_mcore.json").read_text())
RECORDS: list[dict[str, Any]] = DOC["records"]
EXPECTED = {"loaded": "complete", "loaded_with_gap": "not complete", "save_rejected": "not complete",
            "load_fails": "not complete"}
HANG_S = 60


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("megatron_unit_oracle")
    with tarfile.open(ARCHIVE) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="data")
        else:  # Python < 3.11.4 without extraction filters; the archive is the repo's own
            tar.extractall(root)  # noqa: S202
    return root


@contextmanager
def _no_hang(what: str) -> Iterator[None]:
    """Fail instead of waiting forever: SIGALRM where the platform has it (the main thread of a pytest worker)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def _fire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"audit of {what} ran past {HANG_S} s")

    old = signal.signal(signal.SIGALRM, _fire)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_corpus_holds_both_verdicts_and_exactly_its_records(corpus_root: Path) -> None:
    """The agreement below cannot pass vacuously: Megatron loaded some dirs and refused others, and every record
    names a dir of the archive (and every dir of the archive has a record)."""
    outcomes = {r["megatron"]["outcome"] for r in RECORDS}
    assert "loaded" in outcomes and outcomes - {"loaded"}, outcomes
    dirs = {str(p.parent.relative_to(corpus_root)) for p in corpus_root.glob("*/*/*/*") if p.is_file()}
    assert dirs == {r["path"] for r in RECORDS}
    assert len({r["capture"] for r in RECORDS}) == len(RECORDS)


@pytest.mark.parametrize("rec", RECORDS, ids=[r["capture"] for r in RECORDS])
def test_audit_agrees_with_megatron(rec: dict[str, Any], corpus_root: Path) -> None:
    outcome = rec["megatron"]["outcome"]
    assert rec["expected"] == EXPECTED[outcome]
    with _no_hang(rec["path"]):
        r = CliRunner().invoke(app, ["audit", str(corpus_root / rec["path"]), "-o", "json"])
    assert r.exit_code != 3, r.stderr
    doc = json.loads(r.stdout)
    errors = [(f["code"], f["message"]) for f in doc["findings"] if f["severity"] == "error"]
    if outcome == "loaded":
        assert (r.exit_code, doc["status"]) == (0, "complete"), (rec["megatron"], errors)
    else:
        assert doc["status"] != "complete" and r.exit_code == 1, (rec["megatron"], doc["status"], errors)


def test_a_loaded_save_passes_a_warning_gate_too(corpus_root: Path) -> None:
    """Megatron's uneven 1-D sharding gives the last ranks empty shards at one offset; DCP keeps one of them, so a
    rank's data file (one zero-element tensor) is named by nothing. It is the writer's own (CK210, info), not a stale
    leftover (CK204, warning): `--fail-on warning` passes every dir Megatron loads that has no other warning."""
    uneven = [r for r in RECORDS if "uneven_1d_sharding" in r["test"] and r["megatron"]["outcome"] == "loaded"]
    assert uneven
    shadowed = 0
    for rec in uneven:
        r = CliRunner().invoke(app, ["audit", str(corpus_root / rec["path"]), "-o", "json", "--fail-on", "warning"])
        codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
        assert "CK204" not in codes, rec["path"]
        shadowed += "CK210" in codes
    assert shadowed >= 2


def test_a_stale_data_file_beside_a_loaded_save_stays_a_warning(corpus_root: Path, tmp_path: Path) -> None:
    """A real leftover (a data file of another save, holding data) is still CK204 next to a save that has an empty
    shard: only a file holding one zero-element tensor is the writer's own."""
    import shutil

    rec = next(r for r in RECORDS if r["test"].endswith("test_uneven_1d_sharding[src_split7-dest_split7]")
               and r["megatron"]["outcome"] == "loaded")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(corpus_root / rec["path"], ckpt)
    shutil.copy(ckpt / "__0_0.distcp", ckpt / "__9_0.distcp")  # a rank's data file holding a non-empty tensor
    r = CliRunner().invoke(app, ["audit", str(ckpt), "-o", "json"])
    codes = [(f["code"], f["message"].split(":")[0]) for f in json.loads(r.stdout)["findings"]
             if f["code"] in ("CK204", "CK210")]
    assert ("CK204", "__9_0.distcp") in codes and ("CK210", "__6_0.distcp") in codes, codes
