"""Every JSON document validates against its JSON Schema (draft 2020-12) in `docs/schema/`.

The acceptance corpus validates its audit documents in `test_acceptance.py` (with `validate_document`); here every
other command's document, on the samples and on broken inputs, goes through the same real validator.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from schemas import SCHEMAS, validate_document, validator

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"
COMMANDS = ("sniff", "ls", "info", "audit", "coverage", "diff", "resume", "scan", "manifest verify",
            "manifest merge", "manifest write", "estimate", "values", "retain", "watch")


def test_one_schema_per_command() -> None:
    assert {p.name for p in SCHEMAS.glob("*.schema.json")} == {f"{c.replace(' ', '-')}.schema.json"
                                                              for c in COMMANDS}
    for c in COMMANDS:
        validator(c)


def test_a_wrong_document_is_rejected() -> None:
    """The schemas are not vacuous: a status outside the contract or a missing key fails."""
    doc = _json("audit", str(SAMPLES / "dcp"))
    with pytest.raises(AssertionError):
        validate_document({**doc, "status": "fine"})
    with pytest.raises(AssertionError):
        validate_document({k: v for k, v in doc.items() if k != "checkpoints"})
    bad = json.loads(json.dumps(doc))
    bad["findings"] = [{"code": "CK999", "severity": "fatal", "message": "x", "subject": None, "path": None,
                        "details": {}}]
    with pytest.raises(AssertionError):
        validate_document(bad)


def _json(*args: str) -> dict[str, Any]:
    r = CliRunner().invoke(app, [*args, "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


PATHS = ["torch_dist", "torch_dist/iter_0000003", "torch_dist_fully", "dcp/step-10", "legacy"]


@pytest.mark.parametrize("path", PATHS)
def test_every_command_on_the_samples(path: str, tmp_path: Path) -> None:
    p = str(SAMPLES / path)
    runs = [("sniff", p), ("ls", p), ("info", p), ("audit", p, "--all"), ("coverage", p), ("scan", p),
            ("diff", str(SAMPLES / "torch_dist" / "iter_0000001"), p), ("manifest", "verify", p)]
    if path == "torch_dist":  # retain plans over save dirs only (a checkpoint: a usage error, exit 2)
        runs.append(("retain", p, "--keep-last", "1"))
    if not path.startswith("dcp"):  # resume predicts Megatron checkpoints only (DCP: a usage error, exit 2)
        runs.append(("resume", p, "--tp", "1", "--pp", "1"))
    for args in runs:
        validate_document(_json(*args))


def test_manifest_documents_and_broken_inputs(tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    shutil.copytree(SAMPLES / "torch_dist" / "iter_0000001", ckpt)
    validate_document(_json("manifest", "write", str(ckpt)))
    (ckpt / "__0_0.distcp").write_bytes(b"tampered")
    docs = []
    for k in range(2):
        doc = _json("manifest", "verify", str(ckpt), "--shard", f"{k}/2")
        validate_document(doc)
        (tmp_path / f"s{k}.json").write_text(json.dumps(doc))
        docs.append(doc)
    merged = _json("manifest", "merge", str(tmp_path / "s0.json"), str(tmp_path / "s1.json"))
    validate_document(merged)
    assert merged["status"] == "corrupt"
    one = _json("coverage", str(ckpt), "embedding.word_embeddings.weight")
    validate_document(one)
    assert "picture" in one


def test_broken_save_dir_documents(tmp_path: Path) -> None:
    """A tracker naming a missing iteration: the commands that need one checkpoint print the short document."""
    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    (save / "latest_checkpointed_iteration.txt").write_text("999")
    for iteration in ("iter_0000001", "iter_0000002", "iter_0000003"):
        shutil.rmtree(save / iteration)
    for args in (("info", str(save)), ("coverage", str(save)), ("resume", str(save), "--tp", "1", "--pp", "1"),
                 ("manifest", "verify", str(save)), ("audit", str(save)), ("ls", str(save)), ("scan", str(save)),
                 ("sniff", str(save)), ("retain", str(save), "--keep-last", "1")):
        doc = _json(*args)
        validate_document(doc)
        if args[0] in ("info", "coverage", "resume", "audit"):
            assert doc["status"] in ("corrupt", "unrecognized"), (args, doc["status"])


def test_estimate_documents() -> None:
    validate_document(_json("estimate", "--params", "7.5e9", "--tp", "2", "--pp", "2", "--dp", "64"))
    validate_document(_json("estimate", "--from", str(SAMPLES / "torch_dist"), "--dp", "8"))
