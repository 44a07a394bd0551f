"""The contract in the repo (`docs/contract.md`) and the code table (`findings.CODES`) say the same thing."""

from __future__ import annotations

import re
from pathlib import Path

from ckptinspect.findings import CODES

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
_ROW = re.compile(r"^\| (CK\d{3}) \| (error|warning|info) \| ([a-z]+|—) \| (.+) \|$")


def _table() -> dict[str, tuple[str, str | None]]:
    rows: dict[str, tuple[str, str | None]] = {}
    for line in CONTRACT.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            row = (m.group(2), None if m.group(3) == "—" else m.group(3))
            assert rows.setdefault(m.group(1), row) == row, f"{m.group(1)} documented twice, differently"
    return rows


def test_every_code_is_documented_with_its_severity_and_status() -> None:
    table = _table()
    code_table = {c: (i.severity.value, i.status.value if i.status else None) for c, i in CODES.items()}
    assert table == code_table


def test_readme_links_the_contract_inside_the_repo() -> None:
    readme = (CONTRACT.parent.parent / "README.md").read_text(encoding="utf-8")
    assert "docs/contract.md" in readme
    assert "../shared" not in readme
