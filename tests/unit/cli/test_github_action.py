"""The GitHub Action (`action.yml`): its audit step's command run as GitHub runs it, with the step's environment
(inputs as `CKPTINSPECT_*`, `GITHUB_STEP_SUMMARY`, `GITHUB_OUTPUT`), on a real sample and a truncated copy; the
SARIF upload step reads what the audit step wrote (its `sarif` output), validated against the SARIF 2.1.0 schema."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from sarif_schema import sarif_doc

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_ckpts"
ACTION = (ROOT / "action.yml").read_text(encoding="utf-8")


def audit_step() -> tuple[str, dict[str, str]]:
    """The `run:` command of the step `id: audit` and its `env:` (input name for each variable)."""
    step = ACTION[ACTION.index("id: audit"):]
    run = re.search(r"^\s+run: (.+)$", step, re.M)
    assert run is not None
    env = dict(re.findall(r"^\s+(CKPTINSPECT_\w+): \$\{\{ inputs\.([\w-]+) \}\}$", step, re.M))
    return run.group(1), env


def inputs_default() -> dict[str, str]:
    block = ACTION[ACTION.index("inputs:"):ACTION.index("outputs:")]
    out = {}
    for name, body in re.findall(r"^  ([\w-]+):\n((?:    .*\n)+)", block, re.M):
        m = re.search(r"^    default: (.*)$", body, re.M)
        out[name] = m.group(1).strip('"') if m else ""
    return out


def run_action(tmp_path: Path, **inputs: str) -> tuple[int, str, Path, dict[str, str]]:
    command, env_map = audit_step()
    values = {**inputs_default(), **inputs}
    summary, output = tmp_path / "summary.md", tmp_path / "output.txt"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output)}
    env.update({var: values[name] for var, name in env_map.items()})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` = this interpreter
    p = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines()) if output.exists() else {}
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, summary, outputs


def test_action_declares_every_input_it_passes() -> None:
    command, env_map = audit_step()
    assert command == "python -m ckptinspect.cli.github_action"
    assert set(env_map.values()) <= set(inputs_default())
    assert {"path", "fail-on", "junit", "sarif"} <= set(env_map.values())
    # every input the action refers to anywhere is declared
    assert set(re.findall(r"inputs\.([\w-]+)", ACTION[ACTION.index("runs:"):])) <= set(inputs_default())


def upload_step() -> dict[str, Any]:
    steps: list[dict[str, Any]] = yaml.safe_load(ACTION)["runs"]["steps"]
    (step,) = [s for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@")]
    assert steps.index(step) > next(i for i, s in enumerate(steps) if s.get("id") == "audit")
    return step


def test_upload_step_takes_the_sarif_the_audit_step_wrote() -> None:
    step = upload_step()
    assert step["uses"] == "github/codeql-action/upload-sarif@v4"
    assert step["with"] == {"sarif_file": "${{ steps.audit.outputs.sarif }}",
                            "category": "${{ inputs.sarif-category }}"}
    # opt-in, and also after a failing audit step (`always()`), but not when no SARIF was written
    assert step["if"] == "${{ always() && inputs.upload-sarif == 'true' && steps.audit.outputs.sarif != '' }}"
    assert inputs_default()["upload-sarif"] == "false" and inputs_default()["sarif"] == "ckptinspect.sarif"
    assert yaml.safe_load(ACTION)["outputs"]["sarif"]["value"] == "${{ steps.audit.outputs.sarif }}"


def uploaded(tmp_path: Path, outputs: dict[str, str]) -> dict[str, Any]:
    """The SARIF document the upload step would send: the file named by the audit step's `sarif` output, relative
    to the workspace (the step's working dir)."""
    assert outputs["sarif"], outputs
    return sarif_doc((tmp_path / outputs["sarif"]).read_text(encoding="utf-8"))


@pytest.mark.slow
def test_action_passes_on_a_complete_save_dir(tmp_path: Path) -> None:
    rc, stdout, summary, outputs = run_action(tmp_path, path=str(SAMPLES / "torch_dist"))
    assert rc == 0 and outputs == {"status": "complete", "exit-code": "0", "sarif": "ckptinspect.sarif"}
    doc = uploaded(tmp_path, outputs)
    assert doc["runs"][0]["properties"]["status"] == "complete"
    assert [r["ruleId"] for r in doc["runs"][0]["results"]] == ["CK506", "CK400", "CK101"]
    assert summary.read_text().startswith("## ckptinspect audit: ")
    assert "verdict:" in stdout
    ET.fromstring((tmp_path / "ckptinspect-junit.xml").read_text())
    rc, stdout, _, outputs = run_action(tmp_path, path=str(SAMPLES / "torch_dist"), **{"fail-on": "warning"})
    assert rc == 1 and outputs["exit-code"] == "1" and "::warning title=CK506::" in stdout


@pytest.mark.slow
def test_action_fails_the_step_on_a_truncated_checkpoint(tmp_path: Path) -> None:
    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    victim = save / "iter_0000002" / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:100])
    rc, stdout, summary, outputs = run_action(tmp_path, path=str(save), junit="reports/audit.xml",
                                              sarif="reports/audit.sarif")
    assert rc == 1 and outputs == {"status": "corrupt", "exit-code": "1", "sarif": "reports/audit.sarif"}
    doc = uploaded(tmp_path, outputs)
    (ck202,) = [r for r in doc["runs"][0]["results"] if r["level"] == "error"]
    assert ck202["ruleId"] == "CK202" and doc["runs"][0]["properties"]["status"] == "corrupt"
    assert ck202["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "iter_0000002/__0_0.distcp", "uriBaseId": "CHECKPOINT"}
    assert "::error title=CK202::" in stdout
    assert "`corrupt`" in summary.read_text() and "CK202" in summary.read_text()
    junit = ET.fromstring((tmp_path / "reports" / "audit.xml").read_text())
    assert [f.get("type") for f in junit.iter("failure")] == ["CK202"]
    rc, _, _, outputs = run_action(tmp_path, path=str(save), ignore="CK2", sarif="")
    assert rc == 0 and outputs["status"] == "complete" and outputs["sarif"] == ""  # no SARIF: no upload
    rc, stdout, _, outputs = run_action(tmp_path, path=str(tmp_path / "nope"))
    assert rc == 2 and outputs["exit-code"] == "2" and stdout.startswith("::error title=ckptinspect::")
    assert outputs["sarif"] == ""
