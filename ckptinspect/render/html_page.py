"""The frame of an `-o html` report: one self-contained page, its Content-Security-Policy, and the filterable table.

Nothing leaves the page: no external script, style, font or image, and a CSP of `default-src 'none'` whose
`style-src` / `script-src` admit only the hashes of the page's own inline blocks (computed here, when rendering).
No checkpoint data ever goes into the `<script>` block: every string from a checkpoint is HTML-escaped text or an
escaped attribute value, and the script reads the table from the DOM. Inline event handlers and `style` attributes
are not used (a CSP without `'unsafe-inline'` would block them), so an injected `onerror=` could not run even if
escaping failed. The script also reads `#severity=...&code=...&sort=...&dir=asc|desc` from the URL to start with a
filter (a link to "only the errors").
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from ckptinspect._version import __version__

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1200px;
padding:0 1em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd}
code,.mono,td.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em}
.verdict{display:inline-block;font-weight:700;font-size:1.2em;padding:.2em .7em;border-radius:4px;color:#fff}
.v-complete,.v-identical{background:#2a9d4b}.v-incomplete,.v-different{background:#c98a00}
.v-corrupt,.v-blocking{background:#c62828}.v-unsafe{background:#7b1fa2}.v-unrecognized{background:#00838f}
dl.counts{display:flex;flex-wrap:wrap;gap:.4em 1.6em;margin:.8em 0}dl.counts div{display:flex;gap:.4em}
dl.counts dt{color:#555}dl.counts dd{margin:0;font-weight:700}
table{border-collapse:collapse;width:100%;margin:.4em 0}th,td{border:1px solid #ddd;padding:.25em .5em;
text-align:left;vertical-align:top;overflow-wrap:anywhere}th{background:#f4f4f6;white-space:nowrap}
.nw{white-space:nowrap;overflow-wrap:normal}
table.sortable th{cursor:pointer;user-select:none}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}tr[hidden]{display:none}
.s-error,.s-blocking{color:#c62828;font-weight:600}.s-warning,.s-minor{color:#a66f00;font-weight:600}
.s-info{color:#00838f}.leftover{color:#777}
.controls{display:flex;flex-wrap:wrap;gap:.8em;align-items:center;margin:.4em 0}
figure{margin:.8em 0;overflow-x:auto}figcaption{color:#555;font-size:.9em}
footer{margin-top:2em;color:#777;font-size:.85em}
"""

_JS = """
(function () {
  "use strict";
  var params = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var i = kv.indexOf("=");
    if (i > 0) { params[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1)); }
  });
  Array.prototype.forEach.call(document.querySelectorAll("table.filterable"), function (table) {
    var box = document.getElementById(table.id + "-controls");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var pick = function (name) { return box.querySelector("[data-filter=" + name + "]"); };
    var sev = pick("severity"), code = pick("code"), text = pick("text");
    var shown = box.querySelector(".shown");
    function has(sel, v) { return Array.prototype.some.call(sel.options, function (o) { return o.value === v; }); }
    if (params.severity && has(sev, params.severity)) { sev.value = params.severity; }
    if (params.code && has(code, params.code)) { code.value = params.code; }
    function apply() {
      var s = sev.value, c = code.value, t = text.value.toLowerCase(), n = 0;
      rows.forEach(function (r) {
        var ok = (!s || r.getAttribute("data-severity") === s) && (!c || r.getAttribute("data-code") === c) &&
          (!t || r.textContent.toLowerCase().indexOf(t) >= 0);
        r.hidden = !ok;
        if (ok) { n += 1; }
      });
      shown.textContent = String(n);
      table.setAttribute("data-shown", String(n));
    }
    [sev, code, text].forEach(function (el) {
      el.addEventListener("input", apply);
      el.addEventListener("change", apply);
    });
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    function sortBy(th, dir) {
      var i = heads.indexOf(th), num = th.getAttribute("data-type") === "number";
      heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      var key = function (r) {
        var cell = r.cells[i], v = cell.getAttribute("data-value");
        v = v === null ? cell.textContent : v;
        return num ? Number(v) : v.toLowerCase();
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        return (x < y ? -1 : x > y ? 1 : 0) * dir || (Number(a.getAttribute("data-index")) -
          Number(b.getAttribute("data-index")));
      });
      rows.forEach(function (r) { body.appendChild(r); });
      table.setAttribute("data-sorted", th.getAttribute("data-key") + (dir > 0 ? " asc" : " desc"));
    }
    heads.forEach(function (th) {
      th.addEventListener("click", function () {
        sortBy(th, th.getAttribute("aria-sort") === "ascending" ? -1 : 1);
      });
    });
    var first = heads.filter(function (h) { return h.getAttribute("data-key") === params.sort; })[0];
    if (first) { sortBy(first, params.dir === "desc" ? -1 : 1); }
    apply();
  });
  document.body.setAttribute("data-ready", "1");
}());
"""


def csp_hash(block: str) -> str:
    """The CSP source of an inline `<style>` / `<script>` block: `'sha256-<base64 of its text's SHA-256>'`."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(block.encode("utf-8")).digest()).decode("ascii") + "'"


def esc(value: object) -> str:
    """Text or attribute value from anywhere (a checkpoint above all), escaped: `<`, `>`, `&` and both quotes."""
    return escape(str(value), quote=True)


@dataclass(frozen=True, slots=True)
class Column:
    """A table column. key: its name in the URL's `sort=`; number: sorted as numbers."""

    title: str
    key: str
    number: bool = False


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell: `text` (escaped here), optional sort `value`, CSS `cls`, or `raw` markup the renderer built."""

    text: str = ""
    value: str | int | None = None
    cls: str | None = None
    raw: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """A row of a filterable table: `severity` and `code` are what the two filters match."""

    severity: str
    code: str
    cells: Sequence[Cell]
    cls: str | None = None


@dataclass(frozen=True, slots=True)
class FilterTable:
    """A sortable table with a severity and a code filter and a free-text search (`html_page.js` drives it)."""

    id: str
    columns: Sequence[Column]
    rows: Sequence[Row]
    severities: Sequence[str]  # in the order the filter lists them
    severity_label: str = "severity"
    code_label: str = "code"
    codes: Sequence[str] = field(default_factory=tuple)

    def to_html(self) -> str:
        codes = self.codes or sorted({r.code for r in self.rows})
        sev_opts = "".join(f'<option value="{esc(s)}">{esc(s)}</option>' for s in self.severities)
        code_opts = "".join(f'<option value="{esc(c)}">{esc(c)}</option>' for c in codes)
        out = [f'<div class="controls" id="{esc(self.id)}-controls">',
               f'<label>{esc(self.severity_label)} <select data-filter="severity"><option value="">all</option>'
               f"{sev_opts}</select></label>",
               f'<label>{esc(self.code_label)} <select data-filter="code"><option value="">all</option>'
               f"{code_opts}</select></label>",
               '<label>search <input type="search" data-filter="text"></label>',
               f'<span><span class="shown">{len(self.rows)}</span> of {len(self.rows)} shown</span></div>',
               f'<table id="{esc(self.id)}" class="sortable filterable" data-rows="{len(self.rows)}">'
               "<thead><tr>"]
        out += [f'<th data-key="{esc(c.key)}"' + (' data-type="number"' if c.number else "") + f">{esc(c.title)}</th>"
                for c in self.columns]
        out.append("</tr></thead><tbody>")
        for i, r in enumerate(self.rows):
            cls = f' class="{esc(r.cls)}"' if r.cls else ""
            out.append(f'<tr data-index="{i}" data-severity="{esc(r.severity)}" data-code="{esc(r.code)}"{cls}>'
                       + "".join(_cell(c) for c in r.cells) + "</tr>")
        out.append("</tbody></table>")
        return "\n".join(out)


def _cell(c: Cell) -> str:
    attrs = (f' data-value="{esc(c.value)}"' if c.value is not None else "") \
        + (f' class="{esc(c.cls)}"' if c.cls else "")
    return f"<td{attrs}>{c.raw if c.raw is not None else esc(c.text)}</td>"


def plain_table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], table_id: str | None = None) -> str:
    """A static table (no filter): the iterations of a save dir, the sides of a diff."""
    out = [f'<table id="{esc(table_id)}">' if table_id else "<table>", "<thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "\n".join(out)


def counts_html(counts: Iterable[tuple[str, int]]) -> str:
    """`<dl id="counts">` of named counts; each `<dd data-count="NAME">` for scripts and tests."""
    items = "".join(f'<div><dt>{esc(name)}</dt><dd data-count="{esc(name)}">{n}</dd></div>' for name, n in counts)
    return f'<dl class="counts" id="counts">{items}</dl>'


def section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def page(command: str, verdict: str, subtitle: str, sections: Sequence[str]) -> str:
    """The whole document: head with the CSP over this page's own style and script, the verdict, the sections."""
    policy = (f"default-src 'none'; style-src {csp_hash(_CSS)}; script-src {csp_hash(_JS)}; base-uri 'none'; "
              "form-action 'none'")
    head = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            '<meta name="referrer" content="no-referrer">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>ckptinspect {esc(command)}: {esc(verdict)} - {esc(subtitle)}</title>\n"
            f"<style>{_CSS}</style></head>\n")
    body = (f'<body data-command="{esc(command)}" data-verdict="{esc(verdict)}">\n<header>'
            f"<h1>ckptinspect {esc(command)}</h1>"
            f'<p><span class="verdict v-{esc(verdict)}" id="verdict">{esc(verdict)}</span> '
            f'<span class="mono" id="subject">{esc(subtitle)}</span></p></header>\n')
    foot = (f"<footer>ckptinspect {esc(__version__)}: a self-contained report; nothing on this page is fetched from "
            "anywhere.</footer>\n")
    return head + body + "\n".join(sections) + "\n" + foot + f"<script>{_JS}</script>\n</body></html>\n"
