"""The repository carries its own evidence: no path outside it, and no test skipped for a missing fixture."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]

# Absolute machine paths or the sibling shared/ dir of the development setup.
OUTSIDE = re.compile(r"/work/|\.\./shared|parent / \"shared\"|parents\[2\] / \"shared\"")


def _committed_text_files() -> list[Path]:
    tests = [f for f in ROOT.glob("tests/**/*.py") if "node_modules" not in f.parts]
    files = [*tests, *ROOT.glob("tools/*.py"), *ROOT.glob("benchmarks/*.py"),
             *ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("sample_ckpts/**/*.md"),
             *ROOT.glob("ckptinspect/**/*.py"), ROOT / ".ci" / "run", ROOT / "pyproject.toml"]
    return [f for f in files if f.is_file() and f != Path(__file__)]


def test_no_file_refers_to_a_path_outside_the_repo() -> None:
    offenders = [f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
                 for f in _committed_text_files()
                 for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
                 if OUTSIDE.search(line) and "not in" not in line]  # an assertion that it is absent is fine
    assert offenders == []


def test_a_skip_for_a_missing_fixture_fails(pytester: pytest.Pytester) -> None:
    tests = pytester.mkdir("tests")
    (pytester.path / "sample_ckpts" / "mcore_0_19_2").mkdir(parents=True)
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tests / "test_x.py").write_text(textwrap.dedent("""
        import pytest
        def test_gone():
            pytest.skip("/somewhere/sample not available")
        def test_platform():
            pytest.skip("needs a GPU")
        def test_fixture(fixture_0192):
            pass
    """))
    res = pytester.runpytest("-q", "-p", "no:cacheprovider", "tests")
    res.assert_outcomes(failed=1, skipped=1, passed=1)
