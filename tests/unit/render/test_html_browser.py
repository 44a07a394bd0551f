"""The `-o html` report in a real browser: Debian's chromium, headless, started by the test (nothing downloaded).

Each report is loaded from a `file://` URL; `--dump-dom` gives the DOM after the page's script ran (it marks
`<body data-ready="1">`, fills the shown-row count, applies the `#severity=...&code=...&sort=...` filter), and the
network log (`--log-net-log`) lists every request: the page may make none. Chromium's own background requests
(`initiator: not an origin`) are not the page's; host resolution is mapped to nothing, so none leaves the machine.
Hostile content: the torch-written checkpoint whose tensor keys are `<img onerror=...>` / `</script><script>...`
markup (`tests/support/html_doc.py`) — its scripts would set `document.title`; the title must stay ours, with and
without the CSP (escaping alone must hold). A control page with the same markup injected unescaped proves the
probe: without the CSP the browser runs it and requests its image; with the CSP it does neither.

Without chromium the tests skip, except on CI (`CI=true`), where they fail: `.ci/run` installs chromium.
A screenshot of each report is kept in the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES
from html_doc import IMG_KEY, PWNED, SCRIPT_KEY, HtmlDoc, hostile_dcp

pytestmark = pytest.mark.browser
LEAK = "http://leak.example.invalid/pixel.png"


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is not installed and CI=true: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed on this machine (apt-get install chromium); CI=true fails instead")
    return exe


def _flags(exe: str, tmp: Path) -> list[str]:
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp / 'profile'}"]


def load(exe: str, page: Path, fragment: str = "") -> tuple[HtmlDoc, list[str]]:
    """(the DOM after the page's scripts ran, the URLs the page requested)."""
    net = page.with_suffix(".netlog.json")
    r = subprocess.run([*_flags(exe, page.parent), f"--log-net-log={net}", "--virtual-time-budget=3000",
                        "--dump-dom", page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]
    return HtmlDoc(r.stdout), page_requests(net)


def page_requests(netlog: Path) -> list[str]:
    """The URLs of the requests the page started (chromium's own have no initiating origin)."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [ev["params"]["url"] for ev in log["events"] if ev["type"] == start and "url" in ev.get("params", {})
            and ev["params"].get("initiator") != "not an origin"]


def screenshot(exe: str, page: Path) -> Path:
    png = page.with_suffix(".png")
    r = subprocess.run([*_flags(exe, page.parent), "--hide-scrollbars", "--window-size=1280,1800",
                        f"--screenshot={png}", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    return png


def report(tmp_path: Path, name: str, *args: str) -> tuple[Path, dict[str, object]]:
    runner = CliRunner()
    html = runner.invoke(app, [*args, "-o", "html"]).stdout
    doc = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    page = tmp_path / f"{name}.html"
    page.write_text(html, encoding="utf-8")
    return page, doc


def title(dom: HtmlDoc) -> str:
    """The document's title (the head's `<title>`, not an SVG one)."""
    found = re.search(r"<title>([^<]*)</title>", dom.source)
    return found.group(1) if found else ""


def shown_codes(dom: HtmlDoc) -> list[str]:
    return [str(a["data-code"]) for a, _ in dom.body_rows("findings-table") if "hidden" not in a]


def test_audit_report_renders_filters_and_sorts_in_chromium(chromium: str, tmp_path: Path) -> None:
    page, js = report(tmp_path, "audit", "audit", str(SAMPLES / "torch_dist"), "--all")
    findings = js["findings"]
    assert isinstance(findings, list)
    dom, requests = load(chromium, page)
    assert requests == []
    assert dom.all("body")[0]["data-ready"] == "1"
    assert dom.text_by_id["verdict"] == js["status"] == "incomplete"
    assert len(dom.body_rows("findings-table")) == len(findings) and len(shown_codes(dom)) == len(findings)
    assert dom.all("table")[1]["data-shown"] == str(len(findings))  # [0] is the iterations table
    assert [a["id"] for a in dom.all("svg")] == ["rank-chart"]
    infos = [f["code"] for f in findings if f["severity"] == "info"]
    dom, requests = load(chromium, page, "#severity=info&sort=checkpoint&dir=desc")
    assert requests == [] and sorted(shown_codes(dom)) == sorted(infos) and len(infos) == 3
    (table,) = [a for a in dom.all("table") if a.get("id") == "findings-table"]
    assert table["data-shown"] == "3" and table["data-sorted"] == "checkpoint desc"
    places = [cells[4] for a, cells in dom.body_rows("findings-table")]
    assert places == sorted(places, reverse=True)
    dom, _ = load(chromium, page, "#code=CK101")
    assert shown_codes(dom) == ["CK101"]
    screenshot(chromium, page)


def test_hostile_keys_do_not_run_with_or_without_the_csp(chromium: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    page, js = report(tmp_path, "hostile", "audit", str(hostile_dcp(tmp_path / "hostile")))
    bare = tmp_path / "hostile-no-csp.html"
    bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text()))
    assert "Content-Security-Policy" not in bare.read_text()
    for p in (page, bare):
        dom, requests = load(chromium, p)
        assert requests == []
        assert dom.all("body")[0]["data-ready"] == "1"  # the page's own script ran
        assert title(dom).startswith("ckptinspect audit: corrupt") and PWNED not in title(dom)
        assert not dom.all("img") and len(dom.all("script")) == 1
        keys = sorted(str(a["data-key"]) for a in dom.all("figure") if a.get("class") == "coverage")
        assert keys == sorted([IMG_KEY, SCRIPT_KEY])
        assert dom.text.count(IMG_KEY) >= 3 and dom.text.count(SCRIPT_KEY) >= 3
    # the URL fragment is compared with the filter's options, never written into the page
    hostile = quote(IMG_KEY, safe="")
    dom, requests = load(chromium, page, f"#severity={hostile}&code={hostile}&sort={hostile}")
    assert requests == [] and PWNED not in title(dom) and not dom.all("img")
    assert len(shown_codes(dom)) == len(dom.body_rows("findings-table")) == 3  # an unknown filter filters nothing
    screenshot(chromium, page)


def test_control_unescaped_markup_runs_without_csp_and_is_blocked_by_it(chromium: str, tmp_path: Path) -> None:
    """The probe can fail: markup injected as a broken renderer would leave it runs (title set, image requested)
    on the page without its CSP, and neither happens with it."""
    page, _ = report(tmp_path, "audit", "audit", str(SAMPLES / "torch_dist" / "iter_0000002"))
    injected = (f'<img src="{LEAK}" onerror="document.title=\'{PWNED}\'">'
                f"<script>document.body.setAttribute('data-pwned', '{PWNED}')</script>")
    text = page.read_text().replace('<section id="findings">', injected + '<section id="findings">', 1)
    with_csp = tmp_path / "control-csp.html"
    with_csp.write_text(text)
    without = tmp_path / "control-no-csp.html"
    without.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text))
    dom, requests = load(chromium, without)
    assert title(dom) == PWNED and dom.all("body")[0].get("data-pwned") == PWNED
    assert requests == [LEAK]
    dom, requests = load(chromium, with_csp)
    assert title(dom).startswith("ckptinspect audit: complete") and "data-pwned" not in dom.all("body")[0]
    assert requests == [] and dom.all("body")[0]["data-ready"] == "1"


def test_diff_report_in_chromium(chromium: str, tmp_path: Path) -> None:
    page, js = report(tmp_path, "diff", "diff", str(SAMPLES / "torch_dist" / "iter_0000001"),
                      str(SAMPLES / "dcp" / "step-10"))
    dom, requests = load(chromium, page, "#severity=blocking")
    assert requests == [] and dom.all("body")[0]["data-ready"] == "1"
    assert dom.text_by_id["verdict"] == "blocking" and js["blocking"]
    shown = [a for a, _ in dom.body_rows("findings-table") if "hidden" not in a]
    assert shown and all(a["data-severity"] == "blocking" for a in shown)
    assert len(shown) < len(dom.body_rows("findings-table"))
    screenshot(chromium, page)
