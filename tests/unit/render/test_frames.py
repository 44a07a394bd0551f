"""`info --csv` (`render/frames.py`): no cell a spreadsheet would evaluate, whatever the checkpoint names (issue 18
§4). Text columns (key, shard, shape, dtype) are neutralised; number columns stay numbers, negative ones included.
"""

from __future__ import annotations

import csv
import dataclasses
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ckptinspect
from ckptinspect.cli.app import app
from ckptinspect.render.frames import FORMULA_STARTS, inert_cell, number_cell, write_tensor_csv
from ckptinspect.model.chunk_table import ChunkTable
from hostile_samples import write_zip, zip_entries

REPO = Path(__file__).resolve().parents[3]
LEGACY = REPO / "sample_ckpts" / "legacy"
TEXT = ("key", "shard", "shape", "dtype")
NUMBERS = ("chunks", "bytes", "stored_bytes")
EVIL = ("=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2-3", "@SUM(A1)", "\t=1+1", "\r=1+1", "\uff1d1+1",
        "=cmd|' /C calc'!A0", "-", "=")
FORGED_ROW = "x\r\n=1+1,=2+2\r\nforged,row"  # a key that would forge rows if a CR / LF were not quoted
BENIGN = ("decoder.layers.0.weight", "a=b", "1-2", "'quoted", "", "x@y", "a\n=b")


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def assert_inert(table: list[dict[str, str]]) -> None:
    for row in table:
        for col in TEXT:
            assert not row[col].startswith(FORMULA_STARTS), (col, row[col])
        for col in NUMBERS:
            int(row[col])  # a number, never text


@pytest.mark.parametrize("text", EVIL)
def test_formula_starts_are_quoted(text: str) -> None:
    assert inert_cell(text) == "'" + text


@pytest.mark.parametrize("text", BENIGN)
def test_other_text_is_kept(text: str) -> None:
    assert inert_cell(text) == text


def test_numbers_stay_numbers_negative_ones_too() -> None:
    assert number_cell(-12) == -12 and number_cell(0) == 0 and number_cell(2**70) == 2**70
    assert number_cell("=1+1") == "'=1+1" and number_cell(True) == "True"


def test_every_text_column_is_neutralised(tmp_path: Path) -> None:
    """Each text column carries an evil value in turn (on the tensors of a real legacy checkpoint); the number columns
    keep their integers, a negative one included."""
    ckpt = ckptinspect.read(LEGACY / "iter_0000001")
    tensors = list(ckpt.tensors)
    assert len(tensors) >= len(EVIL)
    for i, evil in enumerate(EVIL):
        col = TEXT[i % len(TEXT)]
        t = tensors[i]
        if col == "key":
            tensors[i] = dataclasses.replace(t, key=evil)
        elif col == "shard":
            tensors[i] = dataclasses.replace(t, shard=evil)
        elif col == "dtype":
            tensors[i] = dataclasses.replace(t, dtype=evil)
        else:
            tensors[i] = dataclasses.replace(t, shape=(-3, 4))  # the text "-3x4"
    out = tmp_path / "t.csv"
    n = write_tensor_csv(dataclasses.replace(ckpt, table=ChunkTable.of(tensors)), out)
    table = rows(out)
    assert n == len(table) == len(tensors)
    assert_inert(table)
    assert table[2]["shape"] == "'-3x4"
    assert table[0]["key"] == "'" + EVIL[0] and table[1]["shard"] == "'" + EVIL[1]
    assert int(table[2]["bytes"]) < 0  # numel × element size of a negative shape: a number, as computed


def test_cli_on_a_real_archive_with_evil_keys_and_dtype(tmp_path: Path) -> None:
    """A real `torch.save` file whose state dict names tensors with formulas, and whose storage type is a string
    formula (the persistent id's type is what the legacy reader takes the dtype from), read through the CLI."""
    import torch

    ckpt = tmp_path / "legacy"
    shutil.copytree(LEGACY, ckpt)
    target = ckpt / "iter_0000001" / "mp_rank_00_000" / "model_optim_rng.pt"
    state = torch.load(target, weights_only=False)
    model = state["model"]
    for i, evil in enumerate(EVIL + ("\udcff=lone", FORGED_ROW)):
        model[evil] = torch.zeros(i + 1)
    torch.save(state, target)
    entries = zip_entries(target.read_bytes())
    name = next(n for n, _ in entries if n.endswith("/data.pkl"))
    data = dict(entries)[name]
    glob = b"ctorch\nFloatStorage\n"
    assert glob in data
    evil_type = "=SUM(1+1)".encode()
    data = data.replace(glob, b"X" + len(evil_type).to_bytes(4, "little") + evil_type, 1)
    target.write_bytes(write_zip([(n, data if n == name else d) for n, d in entries]))
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(app, ["info", str(ckpt), "--csv", str(out)])
    assert r.exit_code in (0, 1), r.output
    out.read_bytes().decode("utf-8")  # valid UTF-8, lone surrogate and all
    table = rows(out)
    assert_inert(table)
    keys = {row["key"] for row in table}
    assert all(any(k.endswith(e) for k in keys) for e in EVIL + (FORGED_ROW,)), keys  # each key is one cell
    assert len(table) == len(ckptinspect.read(ckpt / "iter_0000001").tensors)  # no forged row
    assert "'=SUM(1+1)" in {row["dtype"] for row in table}
