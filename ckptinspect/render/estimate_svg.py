"""SVG of an `estimate` (`estimate --svg FILE`): bytes written per rank, stacked by component, for the configured
save and for legacy, on one scale — so the few tall legacy writers next to the flat torch_dist line read at a glance.

Drawn with the same canvas as the chunk picture (`render/svg.py`). With more ranks than pixels, neighbouring ranks
share a bar (its height is their maximum, the tooltip says which ranks).
"""

from __future__ import annotations

from html import escape

from ckptinspect.commands.estimate import Estimate, Volume
from ckptinspect.render.estimate_text import decimal_bytes
from ckptinspect.render.svg import HEIGHT, MARGIN, WIDTH

COLORS = {"model": "#219ebc", "optimizer": "#f8961e", "rng": "#90be6d", "other": "#577590"}
PANEL_GAP = 40


def _bars(v: Volume, top: float, height: float, scale: float, title: str) -> list[str]:
    out = [f'<text x="{MARGIN}" y="{top - 6:.1f}" font-size="12">{escape(title)}: max {decimal_bytes(v.max)},'
           f' mean {decimal_bytes(v.mean)}, {v.writers} of {v.world} ranks write</text>',
           f'<rect x="{MARGIN}" y="{top:.1f}" width="{WIDTH}" height="{height:.1f}" fill="none" stroke="#999"/>']
    world = max(v.world, 1)
    bars = min(world, WIDTH)
    per_bar = -(-world // bars)
    bars = -(-world // per_bar)
    w = WIDTH / bars
    for b in range(bars):
        ranks = range(b * per_bar, min((b + 1) * per_bar, world))
        r = max(ranks, key=v.total)
        comps = v.by_rank.get(r, {})
        y = top + height
        for comp, color in COLORS.items():
            n = comps.get(comp, 0)
            if n <= 0:
                continue
            h = n * scale
            y -= h
            label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]} (max: rank {r})"
            out.append(f'<rect x="{MARGIN + b * w:.2f}" y="{y:.2f}" width="{max(w - 0.5, 0.5):.2f}"'
                       f' height="{h:.2f}" fill="{color}"><title>{label}: {comp} {decimal_bytes(n)}</title></rect>')
    mean_y = top + height - v.mean * scale
    out.append(f'<line x1="{MARGIN}" x2="{MARGIN + WIDTH}" y1="{mean_y:.2f}" y2="{mean_y:.2f}" stroke="#e63946"'
               ' stroke-dasharray="4 3"><title>mean</title></line>')
    return out


def estimate_svg(e: Estimate) -> str:
    panel = (HEIGHT - PANEL_GAP) / 2
    peak = max(e.chosen.max, e.legacy.max, 1)
    scale = panel / peak
    total_h = HEIGHT + 2 * MARGIN + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 2 * MARGIN}" height="{total_h}"'
           ' font-family="monospace" font-size="10">',
           f'<text x="{MARGIN}" y="{MARGIN - 22}" font-size="13">bytes written per rank, {e.params:,} parameters,'
           f' TP={e.target.tp} PP={e.target.pp} DP={e.target.dp} (decimal units, one scale:'
           f' full height = {decimal_bytes(peak)})</text>']
    td_title = f"{e.torch_dist.fmt.value} ({'fully parallel' if e.torch_dist.fully_parallel else 'not fully parallel'})"
    out += _bars(e.torch_dist, MARGIN, panel, scale, td_title)
    out += _bars(e.legacy, MARGIN + panel + PANEL_GAP, panel, scale, "legacy (torch)")
    x = MARGIN
    for comp, color in COLORS.items():
        out.append(f'<rect x="{x}" y="{HEIGHT + MARGIN + 6}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{HEIGHT + MARGIN + 15}">{comp}</text>')
        x += 100
    out.append("</svg>")
    return "\n".join(out) + "\n"
