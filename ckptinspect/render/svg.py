"""SVG of a chunk picture (`coverage KEY --svg FILE`): one rectangle per compressed cell, scaled to its extent."""

from __future__ import annotations

from html import escape

from ckptinspect.commands.coverage.picture import GAP, OVERLAP, ChunkPicture

WIDTH, HEIGHT, MARGIN = 720, 480, 40
_PALETTE = ("#8ecae6", "#219ebc", "#90be6d", "#43aa8b", "#f9c74f", "#f8961e", "#577590", "#b5838d")


def picture_svg(p: ChunkPicture) -> str:
    rows, cols = p.row_bounds, p.col_bounds
    h_total = max(rows[-1] - rows[0], 1)
    w_total = max(cols[-1] - cols[0], 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 2 * MARGIN}" height="{HEIGHT + 2 * MARGIN}"'
           ' font-family="monospace" font-size="10">',
           f'<text x="{MARGIN}" y="{MARGIN - 16}" font-size="12">{escape(p.key)} shape {tuple(p.shape)}'
           f' axes {tuple(p.axes)}</text>']
    for i, row in enumerate(p.cells):
        y = MARGIN + (rows[i] - rows[0]) * HEIGHT / h_total
        h = (rows[i + 1] - rows[i]) * HEIGHT / h_total
        for j, v in enumerate(row):
            x = MARGIN + (cols[j] - cols[0]) * WIDTH / w_total
            w = (cols[j + 1] - cols[j]) * WIDTH / w_total
            fill = "#e63946" if v == GAP else "#9d4edd" if v == OVERLAP else _PALETTE[v % len(_PALETTE)]
            label = "gap" if v == GAP else "overlap" if v == OVERLAP else str(v)
            out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{fill}"'
                       f' stroke="#222" stroke-width="0.5"><title>rows {rows[i]}:{rows[i + 1]} cols'
                       f' {cols[j]}:{cols[j + 1]}: {label}</title></rect>')
            if w > 18 and h > 12:
                out.append(f'<text x="{x + w / 2:.2f}" y="{y + h / 2 + 3:.2f}" text-anchor="middle">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
