"""`audit -o html` and `diff -o html`: one self-contained HTML report (the frame and its script: `html_page.py`).

audit: the verdict, the counts the verdict rests on, a save dir's iterations, the findings table (sortable, filtered
by severity and code), the bytes written per save-time rank as a stacked bar chart (when the data file names give
ranks), and the chunk-grid picture (`render/svg.py`) of every tensor with a coverage problem (CK301-CK303) in a
checkpoint whose tensor table the report kept (the picked one; a leftover iteration keeps only its verdict).
diff: the verdict, both sides, and every difference in one table (filtered by blocking / not and by kind).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ckptinspect.commands.audit.audit import AuditReport, CheckpointAudit
from ckptinspect.commands.coverage.picture import chunk_picture
from ckptinspect.commands.diff.args import ArgDiff, Which
from ckptinspect.commands.diff.diff import Change, DiffResult, KeyDiff, What
from ckptinspect.findings import CODES, Finding, Severity
from ckptinspect.model.components import COMPONENTS
from ckptinspect.render.estimate_svg import COLORS
from ckptinspect.render.html_page import (Cell, Column, FilterTable, Row, counts_html, esc, page, plain_table,
                                          section)
from ckptinspect.render.svg import picture_svg
from ckptinspect.render.text import human_bytes

COVERAGE_CODES = frozenset({"CK301", "CK302", "CK303"})
MAX_PICTURES = 20
MAX_ROWS = 5000  # findings / differences per table; the JSON document has every one
_SEVERITIES = ("error", "warning", "info")
_SVG_NS = ' xmlns="http://www.w3.org/2000/svg"'  # not needed inline in HTML; the page names no URL at all


# --- audit ---------------------------------------------------------------------------------------------------------


def audit_html(r: AuditReport) -> str:
    """The HTML report of `audit PATH` (every finding of the JSON document, leftovers' marked as not deciding)."""
    deciding = {id(f) for f in r.gating_findings}
    counts = [(s.value, sum(1 for f in r.gating_findings if f.severity is s)) for s in reversed(Severity)]
    counts.append(("findings", len(r.findings)))
    leftover = len(r.findings) - len(deciding)
    if leftover:
        counts.append(("leftover findings", leftover))
    facts = [f"{r.kind.value}"]
    if r.format:
        facts.append(f"format {r.format.value}" + ("" if r.iteration is None else f", iteration {r.iteration}"))
    if r.summary is not None:
        s = r.summary
        facts.append(f"{s.tensors} tensors, {s.chunks} chunks, {s.objects} objects, {s.files} files, "
                     f"{human_bytes(s.bytes)}")
    parts = [section("overview", "verdict", counts_html(counts) + f'<p id="facts">{esc("; ".join(facts))}</p>')]
    if r.save_dir is not None:
        parts.append(section("iterations", "iterations", _iterations(r)))
    parts.append(section("findings", f"findings ({len(r.findings)})", _findings_table(r.findings, deciding)
                         if r.findings else "<p>no findings</p>"))
    if r.summary is not None and r.summary.by_rank:
        parts.append(section("by-rank", "bytes written per rank", rank_chart(r.summary.by_rank)))
    pictures = list(_pictures(r))
    if pictures:
        parts.append(section("coverage", "chunk coverage of tensors with a problem", "\n".join(pictures)))
    return page("audit", r.status.value, r.path, parts)


def _iterations(r: AuditReport) -> str:
    rows = []
    for a in r.checkpoints:
        codes = sorted({f.code for f in a.findings})
        rows.append([Cell("resume" if r.picked is a else ""), Cell(a.name or "", cls="mono"),
                     Cell(str(a.checkpoint.iteration) if a.checkpoint.iteration is not None else "-"),
                     Cell(a.checkpoint.format.value if a.checkpoint.format else "-"),
                     Cell(a.status.value, cls=f"v-text s-{_status_class(a)}"),
                     Cell("full" if a.full else "cheap"), Cell(str(len(a.findings))), Cell(" ".join(codes))])
    return plain_table(("picked", "name", "iteration", "format", "status", "audit", "findings", "codes"), rows,
                       "iterations-table")


def _status_class(a: CheckpointAudit) -> str:
    return "info" if a.status.value == "complete" else "warning" if a.status.value == "incomplete" else "error"


def _findings_table(findings: Sequence[Finding], deciding: set[int]) -> str:
    cols = (Column("severity", "severity", number=True), Column("code", "code"), Column("title", "title"),
            Column("subject", "subject"), Column("checkpoint", "checkpoint"), Column("message", "message"),
            Column("decides", "decides"))
    rows = []
    for f in findings[:MAX_ROWS]:
        sev = f.severity.value
        decides = id(f) in deciding
        rows.append(Row(sev, f.code, (
            Cell(sev, value=f.severity.rank, cls=f"s-{sev} nw"), Cell(f.code, cls="mono nw"), Cell(CODES[f.code].title),
            Cell(f.subject or "-", cls="mono"), Cell(_short(f.path), cls="mono"),
            Cell(raw=esc(f.message) + _details(f.details)), Cell("yes" if decides else "no (leftover iteration)")),
            None if decides else "leftover"))
    more = f"<p>{len(findings) - MAX_ROWS} more findings: see -o json</p>" if len(findings) > MAX_ROWS else ""
    return FilterTable("findings-table", cols, rows, _SEVERITIES).to_html() + more


def _details(details: Mapping[str, Any]) -> str:
    if not details:
        return ""
    text = json.dumps(dict(details), default=str, sort_keys=True)
    text = text if len(text) <= 4000 else text[:4000] + " ..."
    return f'<details><summary>details</summary><code>{esc(text)}</code></details>'


def _short(path: str | None) -> str:
    if not path:
        return "-"
    return "/".join(path.rstrip("/").split("/")[-2:])


def rank_chart(by_rank: Mapping[int, Mapping[str, int]], width: int = 720, height: int = 220) -> str:
    """Bytes per save-time rank, stacked by component, as inline SVG (ranks beyond `width` share a bar: the max)."""
    ranks = sorted(by_rank)
    per_bar = -(-len(ranks) // width) if ranks else 1
    groups = [ranks[i:i + per_bar] for i in range(0, len(ranks), per_bar)]
    total = {k: sum(v.values()) for k, v in by_rank.items()}
    peak = max(total.values(), default=0) or 1
    left, top, bottom = 70, 16, 40
    w = width / max(len(groups), 1)
    out = [f'<svg id="rank-chart" width="{width + left + 10}" height="{height + top + bottom}" font-size="11"'
           f' font-family="monospace" role="img"><title>bytes written per rank</title>',
           f'<text x="4" y="{top + 4}">{esc(human_bytes(peak))}</text><text x="4" y="{top + height}">0</text>',
           f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>']
    for b, group in enumerate(groups):
        rank = max(group, key=lambda k: total[k])
        label = f"rank {rank}" if len(group) == 1 else f"ranks {group[0]}-{group[-1]} (max: rank {rank})"
        y = float(top + height)
        for comp in COMPONENTS:
            n = by_rank[rank].get(comp, 0)
            if n <= 0:
                continue
            h = n * height / peak
            y -= h
            out.append(f'<rect class="bar" data-rank="{rank}" x="{left + b * w:.2f}" y="{y:.2f}"'
                       f' width="{max(w - 1, 0.5):.2f}" height="{h:.2f}" fill="{COLORS.get(comp, "#999")}">'
                       f"<title>{esc(label)}: {esc(comp)} {esc(human_bytes(n))}</title></rect>")
        if len(groups) <= 32:
            out.append(f'<text x="{left + b * w + w / 2:.2f}" y="{top + height + 14}" text-anchor="middle">'
                       f"{rank}</text>")
    x = left
    for comp in COMPONENTS:
        out.append(f'<rect x="{x}" y="{top + height + 24}" width="10" height="10" fill="{COLORS.get(comp, "#999")}"/>'
                   f'<text x="{x + 14}" y="{top + height + 33}">{esc(comp)}</text>')
        x += 110
    out.append("</svg>")
    rows = [[Cell(str(k)), *(Cell(human_bytes(by_rank[k].get(c, 0))) for c in COMPONENTS),
             Cell(human_bytes(total[k]))] for k in ranks[:256]]
    table = plain_table(("rank", *COMPONENTS, "total"), rows, "rank-table")
    return f"<figure>{''.join(out)}</figure>\n<details><summary>per rank</summary>{table}</details>"


def _pictures(r: AuditReport) -> Iterator[str]:
    """The chunk-grid SVG of each tensor a coverage finding names, for the checkpoints whose tensors were kept."""
    n = 0
    for a in r.checkpoints:
        keys = list(dict.fromkeys(f.subject for f in a.findings if f.code in COVERAGE_CODES and f.subject))
        if not keys or not a.checkpoint.tensors:
            continue
        by_key = {t.key: t for t in a.checkpoint.tensors}
        by_key.update({f"{t.shard}/{t.key}": t for t in a.checkpoint.tensors if t.shard})
        for key in keys:
            t = by_key.get(key)
            if t is None:
                continue
            if n == MAX_PICTURES:
                yield ("<p>more tensors with a coverage problem: see <code>ckptinspect coverage"
                       f" {esc(a.checkpoint.path)}</code></p>")
                return
            n += 1
            p = chunk_picture(t)
            codes = sorted({f.code for f in a.findings if f.subject == key and f.code in COVERAGE_CODES})
            svg = picture_svg(p).replace(_SVG_NS, "", 1)
            cut = "; cut to the first 64 cells per side" if p.truncated else ""
            yield (f'<figure class="coverage" data-key="{esc(key)}">{svg}<figcaption><code>{esc(key)}</code>'
                   f" ({esc(' '.join(codes))}) in <code>{esc(_short(a.checkpoint.path))}</code>: red = gap, purple ="
                   f" overlap, n = chunk index{esc(cut)}</figcaption></figure>")


# --- diff ----------------------------------------------------------------------------------------------------------


def diff_html(r: DiffResult) -> str:
    """The HTML report of `diff A B`: verdict, sides, and one table of every difference."""
    verdict = "blocking" if r.blocking else "identical" if r.identical else "different"
    rows = sorted(_diff_rows(r), key=lambda x: x.severity != "blocking")  # blocking first, else in order
    blocking = sum(1 for x in rows if x.severity == "blocking")
    counts = [("blocking", blocking), ("differences", len(rows)), ("args", len(r.args)),
              ("checkpoint facts", len(r.meta)), ("tensors in common", r.tensors.common),
              ("tensors only in A", len(r.tensors.only_in_a)), ("tensors only in B", len(r.tensors.only_in_b)),
              ("tensors changed", len(r.tensors.changed))]
    sides = [[Cell(name), Cell(s.path, cls="mono"), Cell(s.format.value if s.format else "unrecognized"),
              Cell(s.generation or "-"), Cell("-" if s.iteration is None else str(s.iteration))]
             for name, s in (("A", r.a), ("B", r.b))]
    parts = [section("overview", "verdict", counts_html(counts)
                     + plain_table(("side", "path", "format", "generation", "iteration"), sides, "sides-table"))]
    cols = (Column("blocking", "blocking", number=True), Column("kind", "kind"), Column("name", "name"),
            Column("A", "a"), Column("B", "b"), Column("note", "note"))
    body = FilterTable("findings-table", cols, rows[:MAX_ROWS], ("blocking", "minor"), "blocking", "kind").to_html() \
        if rows else "<p>no differences</p>"
    parts.append(section("findings", f"differences ({len(rows)})", body))
    if r.values is not None:
        v = r.values
        parts.append(section("values", "values", f"<p>{len(v.compared)} tensor(s) compared ({v.elements_compared}"
                             f" elements), {len(v.identical)} identical, {len(v.skipped)} skipped</p>"))
    if r.notes:
        parts.append(section("notes", "notes", "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in r.notes) + "</ul>"))
    return page("diff", verdict, f"{r.a.path} vs {r.b.path}", parts)


def _diff_rows(r: DiffResult) -> Iterator[Row]:
    for side in (r.a, r.b):
        if side.format is None:
            yield _row(True, "checkpoint", side.path, "", "", "not a recognized checkpoint")
    for kind, diffs in (("arg", r.args), ("checkpoint", r.meta)):
        for d in diffs:
            yield _arg_row(kind, d)
    yield from _key_rows("tensor", r.tensors, blocking_keys=True)
    yield from _key_rows("object", r.objects, blocking_keys=False)
    for s in r.tensors.optimizer:
        yield _row(False, "optimizer format", s.format.label, str(len(s.keys)) if s.side is Which.A else "-",
                   str(len(s.keys)) if s.side is Which.B else "-", f"{s.side.value.upper()} only, e.g. {s.keys[0]}")
    if r.values is not None:
        for key, why in r.values.skipped:
            yield _row(False, "values skipped", key, "", "", why)
    if r.conversion is not None:  # a conversion diff: each finding is blocking (the export is not proven equal)
        for f in r.conversion.findings:
            yield _row(True, f"conversion {f.code}", f.subject or "", "", "", f.message)


def _arg_row(kind: str, d: ArgDiff) -> Row:
    a = "(missing)" if d.missing is Which.A else _value(d.a)
    b = "(missing)" if d.missing is Which.B else _value(d.b)
    return _row(d.blocking, f"{kind} {d.category.value}", d.name, a, b, d.reason or "")


def _key_rows(kind: str, k: KeyDiff, blocking_keys: bool) -> Iterator[Row]:
    for key in k.only_in_a:
        yield _row(blocking_keys, f"{kind} only in A", key, "present", "-", "")
    for key in k.only_in_b:
        yield _row(blocking_keys, f"{kind} only in B", key, "-", "present", "")
    for ka, kb in k.renamed:
        yield _row(False, f"{kind} renamed", ka, ka, kb, "the same tensor under two spellings")
    for c in k.changed:
        yield _row(c.blocking, f"{kind} {c.what.value}", c.key, _value(c.a), _value(c.b), _change_note(c))


def _change_note(c: Change) -> str:
    if c.what is What.VALUES:
        diff = "-" if c.max_abs_diff is None else f"{c.max_abs_diff:.6g}"
        return f"{c.mismatched_elements}/{c.compared_elements} elements differ, max |a-b| {diff}"
    return c.note or ""


def _row(blocking: bool, kind: str, name: str, a: str, b: str, note: str) -> Row:
    sev = "blocking" if blocking else "minor"
    return Row(sev, kind, (Cell("yes" if blocking else "no", value=int(blocking), cls=f"s-{sev} nw"),
                           Cell(kind, cls="nw"), Cell(name, cls="mono"), Cell(a, cls="mono"), Cell(b, cls="mono"),
                           Cell(note)))


def _value(v: Any) -> str:
    if isinstance(v, dict) and "chunks" in v:
        return f"{v['chunks']} chunks, grid {'x'.join(map(str, v.get('grid') or [])) or '()'}"
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return "x".join(map(str, v)) or "()"
    if v is None:
        return "-"
    return v if isinstance(v, str) else json.dumps(v, default=str)
