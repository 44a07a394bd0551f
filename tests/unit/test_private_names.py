"""Private stays private, and every package says what its modules own.

- A name with a leading underscore (`_facts`, `_Val`) is private to the module that defines it: no other module of the
  package imports it, and no module is imported under a private name (`formats/_files.py`). What several modules
  share is public, in one place, under a name that says what it is.
- Every package's `__init__` docstring names each of its modules and subpackages, so a newcomer finds where a
  concept lives from one docstring (module docstrings then say what each owns).

Read with `ast` from the source, lazy and `TYPE_CHECKING` imports included (`test_layering.imported_modules`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ckptinspect"
# The version module is private by the packaging convention (`_version.py`, written once, read by the root and the
# renderers that stamp documents with it).
ALLOWED_PRIVATE_MODULES = {"ckptinspect._version"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """`module:line imports X` for every import of another module's private name, or of a private module."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ckptinspect"):
                continue
            if target != module and target not in ALLOWED_PRIVATE_MODULES and any(
                    _private(p) for p in target.split(".")):
                out.append(f"{module}:{node.lineno} imports private module {target}")
            for a in node.names:
                if _private(a.name) and target != module:
                    out.append(f"{module}:{node.lineno} imports {target}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ckptinspect.") and a.name not in ALLOWED_PRIVATE_MODULES and any(
                        _private(p) for p in a.name.split(".")):
                    out.append(f"{module}:{node.lineno} imports private module {a.name}")
    return out


def test_no_module_imports_a_private_name_of_another() -> None:
    problems: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        problems += private_imports(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")
    assert not problems, f"{len(problems)} imports of private names:\n" + "\n".join(problems)


@pytest.mark.parametrize("module, source", [
    ("ckptinspect.commands.resume.predict", "from ckptinspect.commands.resume.facts import _facts\n"),
    ("ckptinspect.formats.dcp", "def f():\n    from ckptinspect.formats._files import pickle_findings\n"),
    ("ckptinspect.formats.sniff", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from ckptinspect.pickling.walk import _Val\n"),
    ("ckptinspect.pickling.engine", "from .opcodes import _STOP\n"),
    ("ckptinspect.checks.storage", "import ckptinspect.formats._files\n"),
])
def test_a_private_import_is_caught(module: str, source: str) -> None:
    assert private_imports(source, module), source


def test_public_and_own_names_pass() -> None:
    src = ("from ckptinspect.model import Checkpoint\nfrom ckptinspect._version import __version__\n"
           "from ckptinspect.pickling.policy import resolve\nimport _compat_pickle\n"
           "from ckptinspect.pickling.judge import _own\n")
    assert private_imports(src, "ckptinspect.pickling.judge") == []


def _packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("package", _packages(), ids=lambda p: _module_name(p / "__init__.py"))
def test_package_docstring_names_every_module(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    if package == PACKAGE:
        return  # the root's docstring is the user's quick start; docs/architecture.md draws the top level
    members = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in sorted(members) if not any(f in doc for f in (f"{m}.py", f"{m}/", f"`{m}`"))]
    assert not missing, f"{package.relative_to(PACKAGE.parent)}/__init__.py does not say what these own: {missing}"
