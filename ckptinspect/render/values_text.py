"""`values`: the text (rich) and CSV renderings of a value scan — the verdict, the findings, one row per tensor."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.render.text import human_bytes, render_findings, status_text

if TYPE_CHECKING:
    from ckptinspect.commands.values.report import TensorScan, ValuesReport

MAX_ROWS = 200
CSV_COLUMNS = ("key", "shard", "dtype", "shape", "component", "count", "nan", "posinf", "neginf", "zeros",
               "subnormal", "min", "max", "mean", "std", "l2", "absmax", "fingerprint", "complete", "pad_elements")


def _g(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def render_values(r: ValuesReport, max_rows: int = MAX_ROWS) -> RenderableType:
    """The verdict (with what was read), the findings, then the per-tensor table (tensors with a finding first)."""
    complete = sum(t.values.complete for t in r.tensors)
    shard = f"   slice {r.shard[0]}/{r.shard[1]}" if r.shard else ""
    head = Text.assemble(("verdict: ", "bold"), status_text(r.status),
                         f"   {len(r.tensors)} tensor(s), {complete} fully scanned, {human_bytes(r.bytes_read)} read"
                         f"{shard}")
    parts: list[RenderableType] = [head]
    if r.findings:
        parts.append(render_findings(list(r.findings)))
    flagged = {f.subject for f in r.findings}
    rows = sorted(r.tensors, key=lambda t: (_label(t) not in flagged,))
    parts.append(_table(rows[:max_rows]))
    if len(rows) > max_rows:
        parts.append(Text(f"… {len(rows) - max_rows} more tensor(s): -o json or -o csv lists every one", "dim"))
    return Group(*parts)


def _label(t: TensorScan) -> str:
    return f"{t.shard}/{t.key}" if t.shard else t.key


def _table(tensors: Sequence[TensorScan]) -> Table:
    t = Table(title="values")
    for col in ("key", "dtype", "shape", "nan", "inf", "zeros", "subnormal", "min", "max", "std", "l2", "fingerprint"):
        t.add_column(col, justify="left" if col in ("key", "dtype", "fingerprint") else "right", overflow="fold")
    for ts in tensors:
        s = ts.judged
        bad = s.nan or s.posinf or s.neginf
        fp = ts.values.fingerprint
        t.add_row(Text(_label(ts), "red" if bad else ""), ts.dtype, "×".join(map(str, ts.shape)) or "scalar",
                  _g(s.nan), _g(s.posinf + s.neginf), _g(s.zeros), _g(s.subnormal), _g(s.min), _g(s.max), _g(s.std),
                  _g(s.l2), fp[:16] if fp else Text(ts.unsupported or ("not read" if ts.errors else "partial"), "dim"))
    return t


def values_csv(r: ValuesReport) -> str:
    """One row per tensor, `CSV_COLUMNS` (the JSON `tensors` fields); shape as ``d0xd1``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for t in r.tensors:
        d = t.to_dict()
        d["shape"] = "x".join(map(str, t.shape))
        w.writerow(["" if d.get(c) is None else d.get(c) for c in CSV_COLUMNS])
    return buf.getvalue().rstrip("\n")
