"""Acceptance: `ckptinspect audit PATH -o json` over the generated corpus (`tests/support/corpus.py`), case name = test id.

For every case: the exit code is the one the findings imply (1 iff an error-severity finding gates, never 2 or 3),
no traceback, a JSON document with `schema_version` 1, the expected status and codes, and the audited tree is
byte-identical afterwards (the tool never writes into a checkpoint). Hostile-pickle cases and a few others run as
real subprocesses and must leave their marker file uncreated; the rest run in-process through typer's CliRunner.
Every document must validate against `docs/schema/audit.schema.json`, and `ckptinspect.audit(PATH)` must return
the same document (`to_dict()`) and the same exit code (`exit_code()`); its SARIF (`to_sarif()`, `-o sarif`) must
validate against the SARIF 2.1.0 schema (`tests/support/sarif_schema.py`) with one result per finding, and its HTML
report (`to_html()`) must be self-contained and hold the status and one row per finding (`tests/support/html_doc.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ckptinspect
from ckptinspect.cli.app import app
from ckptinspect.findings import CODES, Status
from corpus import ACCEPTANCE_CASES as CASES
from corpus import Case, Ctx, case_named, missing_source
from html_doc import assert_audit_report
from sarif_schema import sarif_doc
from schemas import validate_document

STATUS_RANK = {"complete": 0, "unrecognized": 1, "incomplete": 2, "corrupt": 3, "unsafe": 4}  # CONTRACT precedence

# Codes of `ckptinspect.findings.CODES` no on-disk case produces, with the reason. Empty: every code has a case.
UNCOVERABLE: dict[str, str] = {
    code: "object storage only (no local file can change between a listing and a read the way an object does): "
          "tests/storage/test_storage.py injects it through a real S3 server"
    for code in ("CK220", "CK221", "CK222", "CK223", "CK224", "CK225")
}
UNCOVERABLE.update({code: "produced by `retain`, not `audit`: tests/unit/commands/test_retain.py and "
                    "tests/unit/cli/test_retain_cmd.py run it over copies of real save dirs"
                    for code in ("CK520", "CK521", "CK522", "CK523")})
UNCOVERABLE["CK530"] = ("produced by `watch` (a save unchanged past --stall-after while unfinished), not `audit`: "
                        "tests/unit/commands/test_watch.py over copies of real saves, tests/live/test_live_watch.py "
                        "over a real megatron-core save stopped mid-write")
UNCOVERABLE.update({f"CK96{n}": "a diff code (conversion diff, not `audit`): tests/unit/commands/"
                    "test_diff_convert.py produces each from the real Megatron-LM imports in tests/data/hf_exports/"
                    for n in range(10)})
UNCOVERABLE["CK209"] = ("needs a process file modes bind (the cases run as whoever runs the suite, and root "
                        "ignores modes): tests/acceptance/test_permissions.py runs the CLI as an unprivileged user over "
                        "chmod'ed samples")


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run_audit(case: Case, path: Path, cwd: Path) -> Run:
    args = ["audit", str(path), "-o", "json", *case.flags]
    if case.subprocess:
        p = subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                           timeout=60, cwd=cwd)
        return Run(p.returncode, p.stdout, p.stderr)
    r = CliRunner().invoke(app, args)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Run(r.exit_code, r.stdout, r.stderr)


def audit_kwargs(flags: tuple[str, ...]) -> dict[str, Any]:
    """The `ckptinspect.audit` arguments of a case's CLI flags (a new flag must be mapped here)."""
    kw: dict[str, Any] = {"select": [], "ignore": []}
    it = iter(flags)
    for flag in it:
        if flag in ("--deep", "--all", "--hash", "--values"):
            kw[{"--deep": "deep", "--all": "all_iterations", "--hash": "hash_files", "--values": "values"}[flag]] = True
        elif flag in ("--select", "--ignore"):
            kw[flag[2:]].append(next(it))
        elif flag == "--manifest":
            kw["manifest"] = next(it)
        else:
            raise AssertionError(f"map {flag} to its ckptinspect.audit argument in audit_kwargs")
    return kw


def tree_state(root: Path) -> dict[str, str]:
    """Every dir and file under `root` (or `root` itself, a file) with the SHA-256 of each file."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    out: dict[str, str] = {}
    for dirpath, _, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = "dir"
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.join(rel, name)] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def gating(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings the verdict rests on: all but those of leftover iterations classified cheaply (`full` false)."""
    leftovers = {c["path"] for c in doc["checkpoints"] if c.get("full") is False}
    return [f for f in doc["findings"] if f["path"] not in leftovers]


def summary(doc: dict[str, Any]) -> str:
    return "; ".join(f"{f['code']} {f['severity']} {f['path']}: {f['message']}" for f in doc["findings"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_audit(case: Case, tmp_path: Path) -> None:
    for source in case.sources:
        reason = missing_source(source)
        if reason is not None:
            pytest.skip(reason)
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    path = case.build(ctx)
    before = tree_state(ctx.work)

    run = run_audit(case, path, tmp_path)

    assert "Traceback" not in run.stderr, run.stderr
    assert run.exit_code in (0, 1), f"exit {run.exit_code}: {run.stderr}"
    doc = json.loads(run.stdout)
    assert doc["schema_version"] == 1 and doc["tool"] == "ckptinspect"
    validate_document(doc)
    codes = {f["code"] for f in doc["findings"]}
    assert doc["status"] == case.status, summary(doc)
    assert case.codes <= codes, f"missing {sorted(case.codes - codes)}; got {summary(doc)}"
    assert not case.absent & codes, f"unexpected {sorted(case.absent & codes)}; got {summary(doc)}"
    for f in doc["findings"]:
        assert set(f) >= {"code", "severity", "message", "subject", "path", "details"}
        assert f["severity"] == CODES[f["code"]].severity.value, f
    gate = gating(doc)
    errors = [f for f in gate if f["severity"] == "error"]
    assert run.exit_code == (1 if errors else 0), summary(doc)
    assert run.exit_code == (0 if case.status == "complete" else 1), summary(doc)
    implied = [s.value for s in (CODES[f["code"]].status for f in gate) if s is not None]
    assert doc["status"] == max(implied, key=STATUS_RANK.__getitem__, default="complete"), summary(doc)
    assert tree_state(ctx.work) == before, "the audit modified the checkpoint"
    assert not ctx.marker.exists(), "a pickle from the checkpoint was executed"
    # The Python API says exactly what the CLI said (and, in this process, executes nothing either).
    r = ckptinspect.audit(path, **audit_kwargs(case.flags))
    assert r.to_dict() == doc
    assert r.exit_code() == run.exit_code
    # `-o sarif` of the same audit: valid SARIF 2.1.0, one result per finding, the status in the run's properties
    sarif = sarif_doc(r.to_sarif())
    assert [x["ruleId"] for x in sarif["runs"][0]["results"]] == [f["code"] for f in doc["findings"]]
    assert sarif["runs"][0]["properties"]["status"] == doc["status"]
    # `-o html`: self-contained (CSP over its own blocks, nothing loaded), the status, one row per finding, escaped
    assert_audit_report(r.to_html(), doc)
    assert not ctx.marker.exists(), "a pickle from the checkpoint was executed by ckptinspect.audit"


def test_every_code_is_covered_by_a_case() -> None:
    covered = set().union(*(c.codes for c in CASES))
    missing = set(CODES) - covered - set(UNCOVERABLE)
    assert not missing, f"no acceptance case produces {sorted(missing)}"
    assert not covered - set(CODES), f"cases expect unknown codes {sorted(covered - set(CODES))}"


def test_every_status_is_covered_by_a_case() -> None:
    assert {c.status for c in CASES} == {s.value for s in Status} == set(STATUS_RANK)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_hostile_payloads_are_live(tmp_path: Path) -> None:
    """The hostile cases prove something only if their payload really runs when loaded naively."""
    for source in ("torch_dist", "legacy"):
        if missing_source(source):
            pytest.skip(missing_source(source) or "")
    ctx = Ctx(tmp_path / "bare", tmp_path / "PWNED-bare")
    ctx.work.mkdir()
    ckpt = case_named("hostile_metadata").build(ctx)
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))",
                    str(ckpt / ".metadata")], check=True, timeout=60)
    assert ctx.marker.exists()

    import torch

    ctx = Ctx(tmp_path / "legacy", tmp_path / "PWNED-legacy")
    ctx.work.mkdir()
    save = case_named("hostile_legacy_model_pt").build(ctx)
    torch.load(save / "iter_0000001" / "mp_rank_01_000" / "model_optim_rng.pt", weights_only=False)
    assert ctx.marker.exists()
    with pytest.raises(pickle.UnpicklingError):
        torch.load(save / "iter_0000001" / "mp_rank_01_000" / "model_optim_rng.pt", weights_only=True)
