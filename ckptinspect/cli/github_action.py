"""The script of the GitHub Action (`action.yml`): one audit, every report a workflow wants, the CLI's exit code.

Reads its inputs from `CKPTINSPECT_*` environment variables (set by `action.yml`), audits once through the public
API, then: prints the text report (the step log), appends the markdown report to `$GITHUB_STEP_SUMMARY`, writes
the JUnit XML to `CKPTINSPECT_JUNIT` and the SARIF log to `CKPTINSPECT_SARIF` (the next step of `action.yml` uploads
it to code scanning when the input `upload-sarif` is true), emits an `::error` / `::warning` annotation per deciding
finding, writes the outputs `status`, `exit-code` and `sarif` (the SARIF file written, empty for none) to
`$GITHUB_OUTPUT`, and exits with `ckptinspect audit`'s exit code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ckptinspect.errors import UsageError

_TRUE = ("1", "true", "yes", "on")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(f"CKPTINSPECT_{name}", default).strip()


def _escape(text: str) -> str:
    """A workflow-command message: `%`, CR and LF escaped as GitHub requires."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")


def main() -> int:
    from ckptinspect.api import audit
    from ckptinspect.cli.shell import console
    from ckptinspect.findings import EXIT_USAGE
    from ckptinspect.findings import FailOn

    path = _env("PATH")
    try:
        if not path:
            raise UsageError("input 'path' is required")
        fail_on = _env("FAIL_ON", "error") or "error"
        if fail_on not in ("error", "warning", "never"):
            raise UsageError(f"input 'fail-on': {fail_on!r} is not error | warning | never")
        sev = FailOn(fail_on).severity
        r = audit(path, deep=_env("DEEP").lower() in _TRUE, all_iterations=_env("ALL").lower() in _TRUE,
                  manifest=_env("MANIFEST") or None, select=_env("SELECT").split(), ignore=_env("IGNORE").split())
    except UsageError as e:
        print(f"::error title=ckptinspect::{_escape(str(e))}", flush=True)
        _append(os.environ.get("GITHUB_OUTPUT"), f"status=\nexit-code={EXIT_USAGE}\nsarif=")
        return EXIT_USAGE
    console().print(r.to_text())
    for f in r.deciding_findings:
        if sev is not None and f.severity.rank >= sev.rank:
            level = "error" if f.severity.value == "error" else "warning"
            print(f"::{level} title={f.code}::{_escape(f'{f.path or path}: {f.message}')}")
    _append(os.environ.get("GITHUB_STEP_SUMMARY"), r.to_markdown())
    junit = _env("JUNIT", "ckptinspect-junit.xml")
    if junit:
        Path(junit).parent.mkdir(parents=True, exist_ok=True)
        Path(junit).write_text(r.to_junit(), encoding="utf-8")
    sarif = _env("SARIF", "ckptinspect.sarif")
    if sarif:
        Path(sarif).parent.mkdir(parents=True, exist_ok=True)
        Path(sarif).write_text(r.to_sarif(), encoding="utf-8")
    code = r.exit_code(sev)
    _append(os.environ.get("GITHUB_OUTPUT"), f"status={r.status.value}\nexit-code={code}\nsarif={sarif}")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
