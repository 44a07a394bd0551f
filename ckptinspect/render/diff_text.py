"""Rich text rendering of a `diff` result: verdict, blocking differences first, then args, checkpoint facts, tensors,
objects, values and notes. Returns renderables; nothing here prints."""

from __future__ import annotations

from collections import Counter

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ckptinspect.commands.diff.args import ArgDiff, Which
from ckptinspect.commands.diff.diff import Change, DiffResult, KeyDiff, What


def render_diff(r: DiffResult, max_rows: int = 200) -> RenderableType:
    """The whole diff: a verdict panel, then one table per non-empty section."""
    parts: list[RenderableType] = [_verdict(r)]
    if r.conversion is not None:
        parts.append(_conversion(r, max_rows))
    elif r.blocking:
        parts.append(_blocking_table(r, max_rows))
    rest = [d for d in r.args if not d.blocking]
    if rest:
        parts.append(_args_table("args", rest, max_rows))
    if r.meta:
        parts.append(_args_table("checkpoint", list(r.meta), max_rows))
    if any(not c.blocking for c in r.tensors.changed):  # the blocking ones are in the table above
        parts.append(_keys_table(f"tensors ({r.tensors.common} in common)", r.tensors, max_rows, only_minor=True))
    if r.tensors.optimizer:
        parts.append(_optimizer_table(r, max_rows))
    if not r.objects.empty:
        parts.append(_keys_table(f"objects ({r.objects.common} families in common, never blocking)", r.objects,
                                 max_rows, only_minor=False))
    if r.values is not None:
        v = r.values
        line = (f"values: {len(v.compared)} tensor(s) compared ({v.elements_compared} elements), "
                f"{len(v.identical)} identical, {len(v.compared) - len(v.identical)} differ, "
                f"{len(v.skipped)} skipped")
        parts.append(Text(line, style="bold"))
        if v.skipped:
            t = Table(title="values not compared")
            t.add_column("key", overflow="fold")
            t.add_column("reason", overflow="fold")
            for k, why in v.skipped[:max_rows]:
                t.add_row(k, why)
            parts.append(t)
    if r.notes:
        parts.append(Group(Text("notes", style="bold"), *(Text(f"• {n}") for n in r.notes)))
    return Group(*parts)


def _verdict(r: DiffResult) -> RenderableType:
    if r.identical:
        word = Text("identical", style="bold green")
    elif r.blocking:
        word = Text("blocking differences", style="bold red")
    else:
        word = Text("differences, none blocking", style="bold yellow")
    head = Text.assemble(("diff: ", "bold"), word, "   (conversion: Megatron vs Hugging Face export)"
                         if r.conversion is not None else "" if r.tensors.comparable else ("   (tensors not compared, see notes)", "yellow"))
    sides = Table(show_header=False, box=None, padding=(0, 1))
    for name, s in (("A", r.a), ("B", r.b)):
        sides.add_row(name, s.path, s.format.value if s.format else "unrecognized", s.generation or "-",
                      f"iteration {s.iteration}" if s.iteration is not None else "-")
    return Panel(Group(head, sides), expand=False)


def _conversion(r: DiffResult, max_rows: int) -> RenderableType:
    c = r.conversion
    assert c is not None  # called only for a conversion diff
    counts = ", ".join(f"{n} {k}" for k, n in sorted(Counter(p.status for p in c.params).items()))
    head = Text(f"conversion {c.direction}: architecture {c.architecture or 'unmapped'}; {len(c.params)} "
                f"parameter(s) mapped ({counts or 'none'}), {len(c.extra)} extra, {len(c.unmapped)} unmapped",
                style="bold")
    evidence = [Text(f"  evidence: {e}") for e in c.evidence]
    if not c.findings:
        return Group(head, *evidence)
    t = Table(title="conversion findings")
    for col in ("code", "subject", "message"):
        t.add_column(col, overflow="fold")
    for f in c.findings[:max_rows]:
        t.add_row(f.code, f.subject or "", f.message)
    return Group(head, *evidence, t)


def _blocking_table(r: DiffResult, max_rows: int) -> RenderableType:
    t = Table(title="blocking", title_style="bold red")
    for col in ("what", "name", "A", "B", "why"):
        t.add_column(col, overflow="fold")
    rows: list[tuple[str, ...]] = []
    for side in (r.a, r.b):
        if side.format is None:
            rows.append(("checkpoint", side.path, "", "", "not a recognized checkpoint"))
    rows += [("arg", d.name, _fmt(d.a, d.missing is Which.A), _fmt(d.b, d.missing is Which.B), d.reason or "")
             for d in r.args if d.blocking]
    rows += [("tensor key", k, "present", "-", "only in A") for k in r.tensors.only_in_a]
    rows += [("tensor key", k, "-", "present", "only in B") for k in r.tensors.only_in_b]
    rows += [(f"tensor {c.what.value}", c.key, _fmt(c.a), _fmt(c.b), c.note or "")
             for c in r.tensors.changed if c.blocking]
    for row in rows[:max_rows]:
        t.add_row(*row)
    _more(t, len(rows), max_rows, 5)
    return t


def _optimizer_table(r: DiffResult, max_rows: int) -> RenderableType:
    """Optimizer keys of a format only one side has: one row per side and format, not one per key."""
    t = Table(title="optimizer state in another format (never blocking)")
    for col in ("side", "format", "keys", "states", "e.g."):
        t.add_column(col, overflow="fold")
    for s in r.tensors.optimizer[:max_rows]:
        t.add_row(s.side.value.upper(), s.format.label, str(len(s.keys)), ", ".join(s.states), s.keys[0])
    return t


def _args_table(title: str, rows: Sequence[ArgDiff], max_rows: int) -> RenderableType:
    t = Table(title=title)
    for col in ("category", "name", "A", "B", "note"):
        t.add_column(col, overflow="fold")
    for d in rows[:max_rows]:
        t.add_row(d.category.value, d.name, _fmt(d.a, d.missing is Which.A), _fmt(d.b, d.missing is Which.B),
                  d.reason or "")
    _more(t, len(rows), max_rows, 5)
    return t


def _keys_table(title: str, k: KeyDiff, max_rows: int, only_minor: bool) -> RenderableType:
    """Keys on one side only and changed keys; with `only_minor`, just the non-blocking changes."""
    t = Table(title=title)
    for col in ("change", "key", "A", "B", "detail"):
        t.add_column(col, overflow="fold")
    rows: list[tuple[RenderableType, ...]] = []
    if not only_minor:
        rows += [(Text("only in A", style="yellow"), key, "present", "-", "") for key in k.only_in_a]
        rows += [(Text("only in B", style="yellow"), key, "-", "present", "") for key in k.only_in_b]
    for c in k.changed:
        if only_minor and c.blocking:
            continue
        label = Text(c.what.value, style="red" if c.blocking else "yellow" if c.what is not What.VALUES else "cyan")
        rows.append((label, c.key, _fmt(c.a), _fmt(c.b), _detail(c)))
    for row in rows[:max_rows]:
        t.add_row(*row)
    _more(t, len(rows), max_rows, 5)
    return t


def _detail(c: Change) -> str:
    if c.what is What.VALUES:
        diff = "-" if c.max_abs_diff is None else f"{c.max_abs_diff:.6g}"
        at = "" if c.first_mismatch is None else f"; first at {list(c.first_mismatch)}"
        return f"{c.mismatched_elements}/{c.compared_elements} elements differ, max |a-b| {diff}{at}"
    return c.note or ""


def _fmt(v: Any, missing: bool = False) -> str:
    if missing:
        return "(missing)"
    if isinstance(v, dict) and "chunks" in v:
        return f"{v['chunks']} chunks, grid {'×'.join(map(str, v.get('grid') or [])) or '()'}"
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return "×".join(map(str, v)) or "()"
    if isinstance(v, float):
        return f"{v:.1f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return "-" if v is None else str(v)


def _more(t: Table, n: int, max_rows: int, cols: int) -> None:
    if n > max_rows:
        t.add_row(f"... {n - max_rows} more (use --output json)", *([""] * (cols - 1)))
