"""The one-way import rule: core → io → pickling → formats → services → checks → commands → render → api → cli.

Every module of the package belongs to one layer; a module may import from its own layer and the layers below it,
never from a layer above. Imports are read with `ast` from the source — module-level, inside functions (lazy imports)
and under `TYPE_CHECKING` alike: a lazy back-import is still a back-import. A module that no layer claims fails the
test too, so a new top-level module or package has to be placed deliberately.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ckptinspect"

# The first component below `ckptinspect.` → layer (higher imports lower; equal is fine).
LAYERS: dict[str, int] = {
    # core: finding codes, the exception tree, the neutral model; import nothing of the package but each other
    "_version": 0, "errors": 0, "findings": 0, "model": 0, "progress": 0,
    "io": 1,  # every byte read: safe local opens, object storage (knows nothing of pickles or formats)
    "pickling": 2,  # format-neutral: never execute, bounded, one verdict
    "formats": 3,  # sniff + readers: facts, no judgement
    "services": 4,  # engines the checks and the commands share (manifest hashing / verify, safety scan)
    "checks": 5,
    "commands": 6,
    "render": 7,
    # the public API: one function per command and its frozen results (which render themselves)
    "api": 8, "results": 8, "pytest_plugin": 8, "__init__": 8,
    "cli": 9, "__main__": 9,
}
LAYER_NAMES = {0: "core", 1: "io", 2: "pickling", 3: "formats", 4: "services", 5: "checks", 6: "commands",
               7: "render", 8: "api", 9: "cli"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _component(module: str) -> str | None:
    """`ckptinspect.checks.safety` → "checks"; the package itself → "__init__"; None outside the package."""
    parts = module.split(".")
    if parts[0] != "ckptinspect":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, wherever it stands."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "ckptinspect":  # `from ckptinspect import checks` names a subpackage; else the root's API
                out.extend((node.lineno, f"ckptinspect.{a.name}" if a.name in LAYERS else name) for a in node.names)
            else:
                out.append((node.lineno, name))
    return out


def back_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of `module` that run up a layer (empty when it keeps the rule)."""
    mine = _component(module)
    assert mine is not None
    problems = []
    for line, target in imported_modules(source, module, is_package):
        if target == "ckptinspect" and module != "ckptinspect":
            problems.append(f"{module}:{line} imports from the package root (the public API layer)")
            continue
        other = _component(target)
        if other is None:
            continue
        if other not in LAYERS:
            continue  # reported by test_every_module_has_a_layer
        if LAYERS[other] > LAYERS[mine]:
            problems.append(f"{module}:{line} ({LAYER_NAMES[LAYERS[mine]]}) imports {target} "
                            f"({LAYER_NAMES[LAYERS[other]]})")
    return problems


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({_component(_module_name(p)) or "" for p in MODULES} - set(LAYERS))
    assert not unplaced, f"place these in tests/unit/test_layering.py LAYERS: {unplaced}"


def test_imports_go_one_way() -> None:
    problems = []
    for path in MODULES:
        problems += back_imports(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")
    assert not problems, "imports running back up a layer:\n" + "\n".join(problems)


@pytest.mark.parametrize("module, source", [
    ("ckptinspect.checks.integrity", "from ckptinspect.commands.manifest.manifest import write_manifest\n"),
    ("ckptinspect.formats.sniff", "def f():\n    from ckptinspect.checks import registry\n"),
    ("ckptinspect.model", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ckptinspect.render.text\n"),
    ("ckptinspect.render.text", "from ckptinspect import __version__\n"),
    ("ckptinspect.checks.safety", "from ..commands.scan import scan\n"),
    ("ckptinspect.commands.audit.audit", "from ckptinspect import cli\n"),
    ("ckptinspect.formats.dcp", "import ckptinspect.api\n"),
    # the bottom layers are ordered too
    ("ckptinspect.io.local", "from ckptinspect.pickling import policy\n"),
    ("ckptinspect.pickling.policy", "def f():\n    from ckptinspect.formats import sniff\n"),
    ("ckptinspect.model", "import ckptinspect.io.local\n"),
    ("ckptinspect.errors", "def f():\n    from ckptinspect.io.backend import StorageError\n"),
    ("ckptinspect.services.safety_scan", "from ckptinspect.checks import safety\n"),
])
def test_a_back_import_is_caught(module: str, source: str) -> None:
    """The checker itself: each of these runs up a layer and must be reported."""
    assert back_imports(source, module), source


def test_downward_imports_pass() -> None:
    src = ("from ckptinspect.model import Checkpoint\nfrom ckptinspect.formats import read_checkpoint\n"
           "from ckptinspect.services.integrity_verify import verify_manifest\nfrom ckptinspect import checks\nimport json\n")
    assert back_imports(src, "ckptinspect.commands.manifest.manifest") == []


def command_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle in a graph of commands (name -> the commands it imports), each as the path that closes it."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [])
    return cycles


def test_no_cycle_between_commands() -> None:
    """`commands/<name>/` packages may use each other (audit adds estimate's CK801), never in a circle: each command
    can be read, changed and tested starting from the ones it uses."""
    edges: dict[str, set[str]] = {}
    root = PACKAGE / "commands"
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if len(rel) < 2:
            continue
        mine = rel[0]
        for _line, target in imported_modules(path.read_text(encoding="utf-8"), _module_name(path),
                                              path.name == "__init__.py"):
            parts = target.split(".")
            if parts[:2] == ["ckptinspect", "commands"] and len(parts) > 2 and parts[2] != mine:
                edges.setdefault(mine, set()).add(parts[2])
    assert not command_cycles(edges), command_cycles(edges)


def test_a_command_cycle_is_caught() -> None:
    assert command_cycles({"audit": {"estimate"}, "estimate": {"audit"}})
    assert command_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    assert not command_cycles({"audit": {"estimate"}, "estimate": set(), "diff": {"estimate"}})
