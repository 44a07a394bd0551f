"""Rich rendering of an `estimate`: sizes by component, bytes per rank, legacy vs torch_dist, stalls, host memory.

Bytes are printed in decimal units (1 GB = 10^9 bytes), the convention of the design notes and of storage vendors;
the header says so, because the rest of ckptinspect prints binary units (KiB, MiB).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ckptinspect.commands.estimate import Estimate, Volume

COMPONENT_LABELS = {"model": "model weights", "fp32_master": "fp32 master params",
                    "optimizer_moments": "optimizer moments", "rng_args_scheduler": "rng / args / scheduler / rerun"}


def decimal_bytes(n: float) -> str:
    """`n` bytes in decimal units: 410.2 MB, 26.25 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if v < 100 else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _volume_rows(t: Table, label: str, v: Volume) -> None:
    t.add_row(label, decimal_bytes(v.max), decimal_bytes(v.mean), decimal_bytes(v.min), str(v.writers),
              str(v.files))


def render_estimate(e: Estimate) -> RenderableType:
    o, tg = e.options, e.target
    head = Text()
    head.append(f"model: {e.source}, {e.params:,} parameters, {e.param_dtype}\n")
    head.append(f"target: TP={tg.tp} PP={tg.pp} DP={tg.dp} EP={tg.ep} ETP={tg.etp_} CP={tg.cp} VPP={tg.vpp}"
                f"  world={tg.world}, {tg.gpus_per_node} GPUs per node\n")
    fp = "fully parallel" if o.fully_parallel else "not fully parallel"
    optim = f"distributed optimizer ({o.optim_sharding.value})" if o.distributed_optimizer else "no DistOpt"
    head.append(f"save: {o.format.value} ({fp if o.format.value == 'torch_dist' else 'per-rank files'}), "
                f"{'async' if o.async_save else 'sync'}, {o.optimizer.value}, {optim}\n")
    bw = e.bandwidths
    head.append(f"assumed bandwidths: write {decimal_bytes(bw.write)}/s per stream, aggregate "
                f"{decimal_bytes(bw.aggregate)}/s, D2H {decimal_bytes(bw.d2h)}/s\n")
    head.append("units: decimal (1 kB = 10^3 B, 1 MB = 10^6 B, 1 GB = 10^9 B)", style="bold")

    comp = Table(title="size by component (one copy)", title_justify="left", min_width=50)
    comp.add_column("component")
    comp.add_column("bytes", justify="right")
    for k, v in e.components.items():
        comp.add_row(COMPONENT_LABELS.get(k, k), decimal_bytes(v))
    comp.add_row(Text("total", style="bold"), Text(decimal_bytes(sum(e.components.values())), style="bold"))

    per = Table(title="bytes written per rank", title_justify="left")
    for col in ("save", "max", "mean", "min", "writers", "data files"):
        per.add_column(col, justify="right" if col != "save" else "left")
    _volume_rows(per, f"torch_dist ({fp})", e.torch_dist)
    _volume_rows(per, "legacy (torch)", e.legacy)

    heavy = Table(title=f"heaviest ranks ({e.chosen.fmt.value})", title_justify="left")
    for col in ("rank", "total", "model", "optimizer", "rng", "other"):
        heavy.add_column(col, justify="right")
    for r in e.chosen.heaviest(5):
        c = e.chosen.by_rank.get(r, {})
        heavy.add_row(str(r), decimal_bytes(e.chosen.total(r)),
                      *(decimal_bytes(c.get(k, 0)) for k in ("model", "optimizer", "rng", "other")))

    cost = Table(title="cost of one save", title_justify="left")
    cost.add_column("what")
    cost.add_column("value", justify="right")
    cost.add_row("writer concentration, legacy / torch_dist heaviest writer", f"{e.concentration:.1f}x")
    cost.add_row("stall: legacy sync (heaviest writer / write bw)", seconds(e.stall_seconds["legacy_sync"]))
    cost.add_row("stall: torch_dist sync (total / aggregate bw)", seconds(e.stall_seconds["torch_dist_sync"]))
    cost.add_row("stall: torch_dist async (heaviest rank / D2H bw)", seconds(e.stall_seconds["torch_dist_async"]))
    cost.add_row("stall of the save as configured", seconds(e.stall_seconds["configured"]))
    cost.add_row("async pinned host memory per node", decimal_bytes(e.host_memory_per_node))
    cost.add_row("files in the checkpoint dir", str(e.files))
    notes = Text("\n".join(f"note: {n}" for n in e.notes[1:]), style="dim")
    return Group(head, comp, per, heavy, cost, notes)
