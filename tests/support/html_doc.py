"""Reading an `-o html` report back with the stdlib parser, and the hostile checkpoint the HTML tests render.

`HtmlDoc` keeps every start tag with its attributes, the raw text of each `<script>` / `<style>` block, the text
under each element id, and the cell texts of every table row: what the tests assert on. `hostile_dcp` writes a real
checkpoint with torch's own DCP writer (`torch.distributed.checkpoint.save`) whose tensor keys are markup, then
grows both tensors' global shapes in `.metadata` (torch's classes) so each gets a coverage gap (CK301): the keys
then show in the findings table, in the captions and in the SVG pictures.
"""

from __future__ import annotations

import base64
import hashlib
import pickle
import re
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

# An injected script sets the document's title: the browser test reads the title back.
PWNED = "PWNED"
IMG_KEY = f"<img src=x onerror=\"document.title='{PWNED}'\">"
SCRIPT_KEY = f"w</script><script>document.title='{PWNED}'</script>"
SCRIPT_ARG = f"</script><script>document.title='{PWNED}'</script>"
_VOID = frozenset({"meta", "input", "link", "img", "br", "hr", "source", "area", "base", "col", "embed", "wbr"})


class HtmlDoc(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = text
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: dict[str, list[str]] = {"script": [], "style": []}
        self.text_by_id: dict[str, str] = defaultdict(str)
        self.rows: dict[str, list[tuple[dict[str, str | None], list[str]]]] = defaultdict(list)
        self.text = ""  # all text outside script / style
        self._stack: list[tuple[str, str | None]] = []
        self._block: str | None = None
        self._table: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag in self.blocks:
            self._block = tag
            self.blocks[tag].append("")
        if tag == "table":
            self._table.append(a.get("id") or "")
        elif tag == "tr" and self._table:
            self.rows[self._table[-1]].append((a, []))
        elif tag in ("td", "th") and self._table and self.rows[self._table[-1]]:
            self._cell = self.rows[self._table[-1]][-1][1]
            self._cell.append("")
        if tag not in _VOID:
            self._stack.append((tag, a.get("id")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.blocks:
            self._block = None
        if tag == "table" and self._table:
            self._table.pop()
        if tag in ("td", "th"):
            self._cell = None
        while self._stack:
            open_tag, _ = self._stack.pop()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._block is not None:
            self.blocks[self._block][-1] += data
            return
        self.text += data
        for _, ident in self._stack:
            if ident:
                self.text_by_id[ident] += data
        if self._cell is not None:
            self._cell[-1] += data

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]

    def csp(self) -> dict[str, list[str]]:
        """The page's Content-Security-Policy meta tag, directive -> sources."""
        (meta,) = [a for a in self.all("meta") if (a.get("http-equiv") or "").lower() == "content-security-policy"]
        out: dict[str, list[str]] = {}
        for part in (meta.get("content") or "").split(";"):
            words = part.split()
            if words:
                out[words[0]] = words[1:]
        return out

    def body_rows(self, table_id: str) -> list[tuple[dict[str, str | None], list[str]]]:
        """The rows of a table's body (its first row is the header)."""
        return self.rows[table_id][1:]


def sha256_source(block: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(block.encode()).digest()).decode() + "'"


def assert_self_contained(doc: HtmlDoc) -> None:
    """One inline style, one inline script, no src / href / URL anywhere, no handler or style attribute, and a CSP
    of `default-src 'none'` that admits exactly the hashes of the two blocks."""
    assert doc.source.startswith("<!DOCTYPE html>")
    assert len(doc.blocks["script"]) == 1 and len(doc.blocks["style"]) == 1
    assert not doc.all("link") and not doc.all("img") and not doc.all("iframe") and not doc.all("object")
    for tag, attrs in doc.tags:
        for name in attrs:
            assert name not in ("src", "href", "srcset", "action", "style", "xmlns"), (tag, name)
            assert not name.startswith("on"), (tag, name)
    assert not re.search(r"(?i)\b(https?|wss?|ftp)://|url\(|@import|//[a-z0-9.-]+\.[a-z]{2,}/", doc.source)
    csp = doc.csp()
    assert csp["default-src"] == ["'none'"]
    assert csp["script-src"] == [sha256_source(doc.blocks["script"][0])]
    assert csp["style-src"] == [sha256_source(doc.blocks["style"][0])]
    assert "'unsafe-inline'" not in doc.source and "'unsafe-eval'" not in doc.source


def assert_audit_report(html: str, js: dict[str, Any]) -> HtmlDoc:
    """`-o html` of an audit says what its JSON document `js` says: the status, one row per finding, a picture per
    tensor with a coverage problem (at most 20); and it is self-contained."""
    doc = HtmlDoc(html)
    assert_self_contained(doc)
    assert doc.text_by_id["verdict"] == js["status"]
    assert_findings_rows(doc, js)
    figures = [a["data-key"] for a in doc.all("figure") if a.get("class") == "coverage"]
    problems = list(dict.fromkeys(f["subject"] for f in js["findings"] if f["code"] in ("CK301", "CK302", "CK303")))
    assert set(figures) <= set(problems) and len(figures) == len(set(figures)) <= 20
    if js["kind"] == "checkpoint":  # its tensors are kept: every tensor with a problem is drawn
        assert figures == problems[:20]
    return doc


def assert_findings_rows(doc: HtmlDoc, js: dict[str, Any]) -> None:
    rows = doc.body_rows("findings-table")
    assert [(a["data-code"], a["data-severity"]) for a, _ in rows] == [(f["code"], f["severity"])
                                                                       for f in js["findings"]]
    assert [cells[1] for _, cells in rows] == [f["code"] for f in js["findings"]]
    assert [cells[5].startswith(f["message"]) for (_, cells), f in zip(rows, js["findings"])] == [True] * len(rows)


def hostile_dcp(where: Path) -> Path:
    """A torch DCP checkpoint saved by torch whose two tensor keys are markup, each with a coverage gap."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    dcp.save({IMG_KEY: torch.arange(32.0).reshape(8, 4), SCRIPT_KEY: torch.ones(4)}, checkpoint_id=str(where))
    md = FileSystemReader(str(where)).read_metadata()
    md.state_dict_metadata[IMG_KEY].size = torch.Size([16, 4])  # rows 8..16 now covered by no chunk
    md.state_dict_metadata[SCRIPT_KEY].size = torch.Size([6])
    with open(where / ".metadata", "wb") as f:
        pickle.dump(md, f)
    return where
