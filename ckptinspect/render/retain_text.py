"""Rich rendering of a `retain` plan: one row per iteration dir in save-dir order (keep or delete, its status, why
it is kept), a line saying how many could be deleted (and that nothing was), then the findings. Returns
renderables; never prints."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.commands.retain import RetainPlan
from ckptinspect.render.text import render_findings, status_text


def render_retain(plan: RetainPlan) -> RenderableType:
    p = plan.policy
    rules = [f"keep-last {p.keep_last}"] + ([f"keep-every {p.keep_every}"] if p.keep_every else []) + (
        [f"keep {' '.join(str(k) for k in p.keep)}"] if p.keep else [])
    # checkpoint content (dir names, the tracker's text) is Text, never console markup
    t = Table(title=Text(f"{plan.path}  (tracker: {plan.tracker_raw!r}; {', '.join(rules)})"))
    for col in ("plan", "name", "iteration", "status", "why kept"):
        t.add_column(col)
    for e in plan.entries:
        t.add_row(Text("keep", style="green") if e.kept else Text("delete", style="bold red"), Text(e.name),
                  Text(str(e.iteration)), status_text(e.status), Text(", ".join(r.value for r in e.reasons)))
    n = len(plan.delete)
    verdict = (f"{n} iteration dir(s) could be deleted, {len(plan.keep)} kept; nothing was deleted"
               + (" (to delete them: ckptinspect retain ... --print0 | xargs -0 rm -rf)" if n else ""))
    parts: list[RenderableType] = [t, Text(verdict)]
    if plan.findings:
        parts.append(render_findings(list(plan.findings)))
    return Group(*parts)
