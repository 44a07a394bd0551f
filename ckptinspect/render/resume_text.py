"""Rich rendering of a `resume` prediction: verdict, source → target, one row per component, and with `explain`
the rule table that was applied (every rule evaluated, the deciding one marked). Returns renderables; never prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.commands.resume import SOURCES, Outcome, ResumePrediction, Verdict

OUTCOME_STYLE = {
    Outcome.LOADED: "green", Outcome.RESHARDED: "green", Outcome.SKIPPED: "cyan", Outcome.DROPPED: "yellow",
    Outcome.FAILS: "bold red", Outcome.ABSENT: "dim",
}
VERDICT_STYLE = {Verdict.OK: "bold green", Verdict.LOSSY: "bold yellow", Verdict.FAILS: "bold red"}
_FLAGS = (("finetune", "--finetune"), ("no_load_optim", "--no-load-optim"), ("no_load_rng", "--no-load-rng"))


def outcome_text(outcome: Outcome) -> Text:
    return Text(outcome.value, style=OUTCOME_STYLE[outcome])


def _layout(d: Mapping[str, Any]) -> str:
    parts = [f"{k.upper()}{d[k] if d.get(k) is not None else '?'}" for k in ("tp", "pp", "dp", "ep", "cp")]
    parts += [f"{k.upper()}{d[k]}" for k in ("etp", "vpp") if d.get(k) is not None]
    world = d.get("world_size")
    return " ".join(parts) + f"  (world {world if world is not None else '?'})"


def render_resume(pred: ResumePrediction, explain: bool = False) -> RenderableType:
    head = Table(show_header=False, box=None)
    # Reasons quote Megatron ("[mc] mapping.py"): always Text, never console markup.
    head.add_row("checkpoint", Text(pred.checkpoint))
    head.add_row("format", Text(f"{pred.format}, optimizer {pred.source.get('optimizer_sharding') or '-'}"))
    head.add_row("saved", Text(_layout(pred.source)))
    flags = " ".join(flag for key, flag in _FLAGS if pred.target.get(key))
    head.add_row("resume as", Text(_layout(pred.target) + (f"  {flags}" if flags else "")))
    if pred.vocab is not None:
        v = pred.vocab
        new = "depends on the tokenizer" if v.predicted is None else str(v.predicted)
        line = f"{v.saved} → {new} (make_vocab_size_divisible_by {v.divisible_by} × TP {v.tp})"
        if v.predicted != v.saved and v.suggestion is not None:
            line += f"; --make-vocab-size-divisible-by {v.suggestion} keeps {v.saved}"
        head.add_row("padded vocab", Text(line))
    head.add_row("verdict", Text(pred.verdict.value, style=VERDICT_STYLE[pred.verdict]))

    comps = Table(title="components")
    comps.add_column("component")
    comps.add_column("outcome")
    comps.add_column("why", overflow="fold")
    for comp, p in pred.components.items():
        comps.add_row(comp.value, outcome_text(p.outcome), Text(p.reason))
    parts: list[RenderableType] = [head, comps]
    for label, lines in (("problem", pred.problems), ("note", pred.notes)):
        parts.extend(Text(f"{label}: {line}", style="yellow" if label == "problem" else "dim") for line in lines)
    if explain:
        parts.append(render_rules(pred))
    return Group(*parts)


def render_rules(pred: ResumePrediction) -> RenderableType:
    """The rule table as applied: ● decided the outcome, ○ also held, blank = did not hold."""
    legend = "; ".join(f"{k} {v}" for k, v in SOURCES.items())
    t = Table(title="rules applied (● decided, ○ also held)", caption=Text(legend))
    for col in ("", "rule", "when", "outcome", "models"):
        t.add_column(col, overflow="fold")
    for r in pred.rules:
        mark = "●" if r.decided else "○" if r.fired else ""
        style = "" if r.fired else "dim"
        t.add_row(mark, Text(r.id, style=style), Text(r.when, style=style), outcome_text(r.outcome) if r.fired
                  else Text(r.outcome.value, style="dim"), Text(r.source, style=style))
    return t
