"""`audit -o html` / `diff -o html` (`ckptinspect/render/html.py`, `html_page.py`), read back with `html.parser`.

Over real checkpoints: the sample save dir (`audit --all`: iterations, per-rank chart), the acceptance corpus's
`dropped_chunk` (a CK301 coverage gap: its SVG picture), and a checkpoint written by torch's DCP writer whose tensor
keys are markup plus a Megatron sample whose args carry a `</script>` (`tests/support/html_doc.py`). Each report must
hold what the JSON document holds (status, one row per finding, same codes and messages), name no URL, load nothing,
and carry a CSP whose hashes are those of its own inline blocks. The real-browser test is `test_html_browser.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES
from corpus import Ctx, case_named
from corpus_kit import _common, _set_args, edit_torch_file
from html_doc import (IMG_KEY, PWNED, SCRIPT_ARG, SCRIPT_KEY, HtmlDoc, assert_findings_rows, assert_self_contained,
                      hostile_dcp)

TD = SAMPLES / "torch_dist"


def cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout


def html_and_json(*args: str) -> tuple[int, HtmlDoc, dict[str, Any]]:
    code, out = cli(*args, "-o", "html")
    code_json, out_json = cli(*args, "-o", "json")
    assert code == code_json
    return code, HtmlDoc(out), json.loads(out_json)


def test_audit_of_a_save_dir_has_verdict_counts_iterations_findings_and_rank_chart() -> None:
    code, doc, js = html_and_json("audit", str(TD), "--all")
    assert code == 1  # iter_0000003 is a crash leftover
    assert_self_contained(doc)
    assert doc.text_by_id["verdict"] == js["status"] == "incomplete"
    assert doc.all("body")[0]["data-verdict"] == js["status"]
    counts = {a["data-count"] for a in doc.all("dd")}
    assert {"error", "warning", "info", "findings"} <= counts
    assert doc.text_by_id["counts"].count(str(len(js["findings"]))) >= 1
    assert_findings_rows(doc, js)
    its = doc.body_rows("iterations-table")
    assert [cells[1] for _, cells in its] == [c["name"] for c in js["checkpoints"]]
    assert [cells[4] for _, cells in its] == [c["status"] for c in js["checkpoints"]]
    assert [cells[0] for _, cells in its].count("resume") == 1
    bars = {a["data-rank"] for a in doc.all("rect") if a.get("class") == "bar"}
    assert bars == set(js["summary"]["by_rank"]) and len(bars) == 8
    assert [cells[0] for _, cells in doc.body_rows("rank-table")] == sorted(js["summary"]["by_rank"], key=int)
    options = {a["value"] for a in doc.all("option")}
    assert {f["code"] for f in js["findings"]} | {"error", "warning", "info"} <= options
    assert not doc.all("svg") or doc.all("svg")[0]["id"] == "rank-chart"  # no coverage problem, no picture


def test_a_coverage_gap_is_drawn_as_svg(tmp_path: Path) -> None:
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir(parents=True)
    path = case_named("dropped_chunk").build(ctx)
    code, doc, js = html_and_json("audit", str(path))
    assert code == 1 and doc.text_by_id["verdict"] == "corrupt"
    assert_self_contained(doc)
    assert_findings_rows(doc, js)
    (gap,) = [f for f in js["findings"] if f["code"] == "CK301"]
    figures = [a for a in doc.all("figure") if a.get("class") == "coverage"]
    assert [a["data-key"] for a in figures] == [gap["subject"]]
    assert len(doc.all("svg")) == 2  # the rank chart and the picture
    assert "gap" in doc.text_by_id.get("coverage", "")
    assert gap["subject"] in doc.text_by_id["coverage"]


def test_hostile_tensor_keys_render_as_text(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = hostile_dcp(tmp_path / "hostile")
    code, doc, js = html_and_json("audit", str(path))
    assert code == 1
    assert_self_contained(doc)  # one script block: no `<script>` and no `<img>` came from the keys
    assert_findings_rows(doc, js)
    assert sorted(f["subject"] for f in js["findings"] if f["code"] == "CK301") == sorted([IMG_KEY, SCRIPT_KEY])
    assert doc.text.count(IMG_KEY) >= 3 and doc.text.count(SCRIPT_KEY) >= 3  # row, caption, SVG title: as text
    figures = [a["data-key"] for a in doc.all("figure") if a.get("class") == "coverage"]
    assert sorted(figures) == sorted([IMG_KEY, SCRIPT_KEY])
    assert PWNED not in doc.blocks["script"][0]
    assert "<img" not in doc.source and doc.source.count("<script") == 1 and doc.source.count("</script") == 1


def test_diff_lists_blocking_args_first_and_escapes_them(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    b = tmp_path / "iter_0000002"
    shutil.copytree(TD / "iter_0000002", b)
    edit_torch_file(b / "common.pt", _set_args(data_path=[SCRIPT_ARG], tokenizer_type=IMG_KEY))
    code, doc, js = html_and_json("diff", str(TD / "iter_0000002"), str(b))
    assert code == 1 and doc.text_by_id["verdict"] == "blocking" and js["blocking"]  # the tokenizer changed
    assert_self_contained(doc)
    rows = doc.body_rows("findings-table")
    assert [cells[2] for _, cells in rows] == ["tokenizer_type", "data_path"]  # blocking first
    assert sorted(d["name"] for d in js["args"]) == ["data_path", "tokenizer_type"]
    assert rows[0][1][4] == IMG_KEY and rows[1][1][3] == "(missing)" and rows[1][1][4] == json.dumps([SCRIPT_ARG])
    assert "<img" not in doc.source and doc.source.count("<script") == 1


def test_diff_blocking_verdict_and_sides(tmp_path: Path) -> None:
    code, doc, js = html_and_json("diff", str(TD / "iter_0000001"), str(SAMPLES / "dcp" / "step-10"))
    assert code == 1 and js["blocking"] and doc.text_by_id["verdict"] == "blocking"
    assert_self_contained(doc)
    sides = doc.body_rows("sides-table")
    assert [cells[1] for _, cells in sides] == [js["a"]["path"], js["b"]["path"]]
    rows = doc.body_rows("findings-table")
    n = len(js["args"]) + len(js["checkpoint"]) + len(js["tensors"]["only_in_a"]) + len(js["tensors"]["only_in_b"]) \
        + len(js["tensors"]["changed"]) + len(js["objects"]["only_in_a"]) + len(js["objects"]["only_in_b"]) \
        + len(js["objects"]["changed"]) + len(js["tensors"]["optimizer_formats"])
    assert len(rows) == n
    blocking = [a["data-severity"] == "blocking" for a, _ in rows]
    assert any(blocking) and blocking == sorted(blocking, reverse=True)  # the blocking rows come first
    assert doc.all("dd")[0]["data-count"] == "blocking" and doc.text_by_id["counts"].startswith(
        f"blocking{sum(blocking)}")


def test_html_is_only_for_audit_and_diff() -> None:
    code, out = cli("ls", str(TD), "-o", "html")
    assert code == 2
    code, out = cli("info", str(TD / "iter_0000002"), "-o", "html")
    assert code == 2


def test_the_api_result_renders_the_same_page() -> None:
    import ckptinspect

    _, out = cli("audit", str(TD), "--all", "-o", "html")
    assert ckptinspect.audit(TD, all_iterations=True).to_html() == out
    _, out = cli("diff", str(TD / "iter_0000001"), str(TD / "iter_0000002"), "-o", "html")
    assert ckptinspect.diff(TD / "iter_0000001", TD / "iter_0000002").to_html() == out
