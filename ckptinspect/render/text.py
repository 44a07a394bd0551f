"""Rich text renderings of sniff / ls / info / audit / coverage results (returned as renderables)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from typing import TYPE_CHECKING

from ckptinspect.findings import CODES, Finding, Severity, Status
from ckptinspect.model.components import COMPONENTS

if TYPE_CHECKING:  # type-only: `sniff` must not pay for importing the readers and checks (≤0.3 s budget)
    from ckptinspect.commands.audit.audit import AuditReport, Listing
    from ckptinspect.checks.coverage import TensorCoverage
    from ckptinspect.formats.sniff import SniffReport
    from ckptinspect.model import Checkpoint
    from ckptinspect.commands.audit.summary import Summary
    from ckptinspect.commands.coverage.coverage import CoverageReport
    from ckptinspect.services.integrity_report import ManifestReport

STATUS_STYLE = {
    Status.COMPLETE: "bold green", Status.INCOMPLETE: "bold yellow", Status.CORRUPT: "bold red",
    Status.UNSAFE: "bold magenta", Status.UNRECOGNIZED: "bold cyan",
}
SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def status_text(status: Status) -> Text:
    return Text(status.value, style=STATUS_STYLE[status])


def render_sniff(r: SniffReport) -> RenderableType:
    from ckptinspect.formats.sniff import SniffState  # loaded already: the report came from it

    t = Table(show_header=False, box=None)
    t.add_row("path", r.path)
    t.add_row("kind", r.kind.value)
    t.add_row("format", r.format.value if r.format else "unrecognized")
    t.add_row("generation", r.generation or "-")
    if r.state is not SniffState.COMPLETE:
        t.add_row("state", Text(f"{r.state}: {CODES[r.state].title}", style="yellow"))
    if r.checkpoint and r.checkpoint != r.path:
        t.add_row("checkpoint", r.checkpoint)
    for i, e in enumerate(r.evidence):
        t.add_row("evidence" if i == 0 else "", e)
    return t


def render_ls(listing: Listing) -> RenderableType:
    t = Table(title=f"{listing.path}  (tracker: {listing.tracker.get('raw')!r})")
    for col in ("", "name", "iteration", "format", "status", "size", "files", "codes"):
        t.add_column(col, justify="right" if col in ("size", "files") else "left")
    for row in listing.iterations:
        t.add_row("→" if row.tracked else "", row.name, str(row.iteration), row.format.value if row.format else "-",
                  status_text(row.status), human_bytes(row.bytes), str(row.files), " ".join(row.codes))
    parts: list[RenderableType] = [t]
    if listing.findings:
        parts.append(render_findings(listing.findings))
    return Group(*parts)


def render_findings(findings: Sequence[Finding], limit_per_code: int = 20) -> RenderableType:
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_code[f.code].append(f)
    t = Table(title="findings", show_lines=False)
    t.add_column("code")
    t.add_column("severity")
    t.add_column("where")
    t.add_column("message", overflow="fold")
    for code in sorted(by_code, key=lambda c: (-CODES[c].severity.rank, c)):
        group = by_code[code]
        for f in group[:limit_per_code]:
            t.add_row(code, Text(f.severity.value, style=SEVERITY_STYLE[f.severity]), _short_path(f.path),
                      f.message)
        if len(group) > limit_per_code:
            t.add_row(code, "", "", f"... {len(group) - limit_per_code} more {code} finding(s)")
    return t


def _short_path(path: str | None) -> str:
    if not path:
        return "-"
    parts = path.rstrip("/").split("/")
    return "/".join(parts[-2:])


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def render_summary(s: Summary, ckpt: Checkpoint | None) -> RenderableType:
    t = Table(show_header=False, box=None, title="summary")
    if ckpt is not None:
        topo = ckpt.topology
        t.add_row("format", f"{ckpt.format.value if ckpt.format else '-'}  ({ckpt.generation or 'generation unknown'})")
        t.add_row("iteration", str(ckpt.iteration) if ckpt.iteration is not None else "-")
        t.add_row("topology", f"TP={topo.tp} PP={topo.pp} DP={topo.dp} CP={_n(topo.cp)} EP={topo.ep} "
                  f"ETP={_n(topo.etp)} VPP={_n(topo.vpp)} world={topo.world_size}")
        t.add_row("optimizer", ckpt.optimizer_sharding or "-")
    if s.dtypes:
        t.add_row("dtypes", ", ".join(f"{c} " + "/".join(s.dtypes[c]) for c in s.dtypes))
    t.add_row("content", f"{s.tensors} tensors, {s.chunks} chunks, {s.objects} objects, {s.files} files, "
              f"{human_bytes(s.bytes)}")
    t.add_row("components", ", ".join(f"{c} {human_bytes(s.by_component[c])}" for c in COMPONENTS))
    parts: list[RenderableType] = [t]
    if s.by_rank:
        r = Table(title="bytes written per rank")
        r.add_column("rank", justify="right")
        for c in COMPONENTS:
            r.add_column(c, justify="right")
        r.add_column("total", justify="right")
        for rank, comps in sorted(s.by_rank.items()):
            r.add_row(str(rank), *(human_bytes(comps[c]) for c in COMPONENTS), human_bytes(sum(comps.values())))
        parts.append(r)
    return Group(*parts)


def verdict_counts(r: AuditReport) -> str:
    """Errors and warnings the verdict rests on, and apart those of leftover iterations (which do not decide it):
    `0 error(s), 1 warning(s); leftover iterations: 1 error(s), 0 warning(s)`."""
    deciding = r.gating_findings
    leftovers = len(r.findings) - len(deciding)

    def count(findings: Sequence[Finding]) -> str:
        errors = sum(1 for f in findings if f.severity is Severity.ERROR)
        warnings = sum(1 for f in findings if f.severity is Severity.WARNING)
        return f"{errors} error(s), {warnings} warning(s)"

    if not leftovers:
        return count(deciding)
    ids = {id(f) for f in deciding}
    return f"{count(deciding)}; leftover iterations: {count([f for f in r.findings if id(f) not in ids])}"


def render_audit(r: AuditReport) -> RenderableType:
    head = Text.assemble(
        ("verdict: ", "bold"), status_text(r.status), f"   {r.kind.value} {r.path}", f"   ({verdict_counts(r)})",
    )
    parts: list[RenderableType] = [Panel(head, expand=False)]
    if r.save_dir is not None:
        it = Table(title="iterations")
        for col in ("", "name", "status", "audit", "codes"):
            it.add_column(col)
        for a in r.checkpoints:
            it.add_row("→" if r.picked is a else "", a.name or "", status_text(a.status),
                       "full" if a.full else "cheap", " ".join(sorted({f.code for f in a.findings})))
        parts.append(it)
    if r.findings:
        parts.append(render_findings(r.findings))
    if r.summary is not None:
        parts.append(render_summary(r.summary, r.picked.checkpoint if r.picked else None))
    if r.picked is not None and r.picked.values is not None:
        v = r.picked.values
        whole = sum(t.values.complete for t in v)
        parts.append(Text(f"values: {len(v)} tensor(s), {whole} fully scanned, {human_bytes(r.picked.values_bytes)} "
                          "read (ckptinspect values CKPT for the per-tensor table)"))
    return Group(*parts)


def render_info(c: Checkpoint, s: Summary, max_rows: int = 200) -> RenderableType:
    parts: list[RenderableType] = [render_summary(s, c)]
    if c.findings:
        parts.append(render_findings(c.findings))
    t = Table(title=f"tensors ({len(c.tensors)})")
    for col in ("key", "shape", "dtype", "chunks", "bytes"):
        t.add_column(col, justify="right" if col in ("chunks", "bytes") else "left", overflow="fold")
    for tensor in c.tensors[:max_rows]:
        key = f"{tensor.shard}/{tensor.key}" if tensor.shard else tensor.key
        t.add_row(key, "×".join(map(str, tensor.shape)) or "()", tensor.dtype, str(len(tensor.chunks)),
                  human_bytes(tensor.nbytes))
    if len(c.tensors) > max_rows:
        t.add_row(f"... {len(c.tensors) - max_rows} more (use --output json or --csv)", "", "", "", "")
    parts.append(t)
    if c.objects:
        families: dict[str, list[Any]] = defaultdict(list)
        for o in c.objects:
            families[o.family].append(o)
        o_t = Table(title=f"objects ({len(c.objects)} in {len(families)} families)")
        for col in ("family", "items", "grid", "bytes"):
            o_t.add_column(col)
        for fam, items in list(families.items())[:max_rows]:
            grid = items[0].grid
            o_t.add_row(fam, str(len(items)), "×".join(map(str, grid)) if grid else "-",
                        human_bytes(sum(o.storage.length for o in items if o.storage)))
        parts.append(o_t)
    return Group(*parts)


def render_coverage_table(covs: Iterable[TensorCoverage]) -> RenderableType:
    t = Table(title="coverage")
    for col in ("key", "numel", "chunks", "covered", "gap", "overlap", "oob", "no storage", "ok"):
        t.add_column(col, justify="left" if col == "key" else "right", overflow="fold")
    for c in covs:
        t.add_row(c.key, str(c.numel), str(c.chunks), str(c.covered), str(c.gap), str(c.overlap),
                  str(c.out_of_bounds), str(c.no_storage), Text("yes", "green") if c.ok else Text("NO", "red"))
    return t


def render_picture(p: Any) -> RenderableType:
    """The chunk grid of one tensor: chunk indices, '·' gaps (red), 'X' overlaps (magenta)."""
    from ckptinspect.commands.coverage.picture import GAP, OVERLAP

    axes = ", ".join(f"axis {a}" for a in p.axes) or "scalar"
    caption = f"shape {tuple(p.shape)}, rows × columns = {axes}; · gap, X overlap, n = chunk index" + (
        "; cut to the first 64 cells per side" if p.truncated else "")
    t = Table(title=p.key, caption=caption, show_header=True, show_lines=False, min_width=60)
    t.add_column("rows", justify="right", style="dim")
    for j in range(len(p.col_bounds) - 1):
        t.add_column(str(p.col_bounds[j]), justify="center")
    for i, row in enumerate(p.cells):
        cells = []
        for v in row:
            if v == GAP:
                cells.append(Text("·gap", style="bold red"))
            elif v == OVERLAP:
                cells.append(Text("X", style="bold magenta"))
            else:
                cells.append(Text(str(v), style="green"))
        t.add_row(f"{p.row_bounds[i]}:{p.row_bounds[i + 1]}", *cells)
    return t


def render_coverage(r: CoverageReport) -> RenderableType:
    """`coverage`: the per-tensor table, the picture of one tensor's chunk grid when one was asked for, findings."""
    parts = [render_coverage_table(r.tensors)]
    if r.picture is not None:
        parts.append(render_picture(r.picture))
    if r.findings:
        parts.append(render_findings(r.findings))
    return Group(*parts)


def render_manifest_report(r: ManifestReport) -> RenderableType:
    """`manifest verify` / `merge`: the verdict with what was checked, then the findings."""
    head = Text.assemble(("verdict: ", "bold"), status_text(r.status),
                         f"   {r.files_checked} file(s) checked, {r.bytes_hashed} bytes hashed")
    parts: list[RenderableType] = [head]
    if r.findings:
        parts.append(render_findings(list(r.findings)))
    return Group(*parts)
