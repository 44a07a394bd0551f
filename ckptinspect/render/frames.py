"""pandas frames of the tensor table (`info --csv`). pandas is imported lazily: it is slow to import.

Every cell is typed by its column. Text columns (`key`, `shard`, `shape`, `dtype`) can carry checkpoint-controlled
text (a shape is written as text, `4x8`), so each goes through `inert_cell`. Number columns (`chunks`, `bytes`,
`stored_bytes`) hold integers the reader computed: written as numbers, a negative one included (a real number, not a
formula); anything else that reached them is written as neutralised text.
"""

from __future__ import annotations

from pathlib import Path

from ckptinspect.model import Checkpoint

# OWASP "CSV injection": the characters a spreadsheet starts a formula with (tab / CR: some strip them before looking),
# and their full-width forms (Excel with an East Asian IME evaluates `＝1+1` too).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def write_tensor_csv(c: Checkpoint, out: Path) -> int:
    """Write one row per tensor (key, shard, shape, dtype, chunks, bytes, stored_bytes); return the row count."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "key": [inert_cell(t.key) for t in c.tensors],
            "shard": [inert_cell(t.shard or "") for t in c.tensors],
            "shape": [inert_cell("x".join(map(str, t.shape))) for t in c.tensors],
            "dtype": [inert_cell(t.dtype) for t in c.tensors],
            "chunks": [number_cell(len(t.chunks)) for t in c.tensors],
            "bytes": [number_cell(t.nbytes) for t in c.tensors],
            "stored_bytes": [number_cell(t.stored_bytes) for t in c.tensors],
        },
        dtype=object,
    )
    # A key with lone surrogates (from a non-UTF-8 name) is written as `\udcff`: the file stays valid UTF-8. Rows end
    # in CRLF (RFC 4180), so a cell holding a CR or LF is quoted, never split into a forged row.
    frame.to_csv(out, index=False, encoding="utf-8", errors="backslashreplace", lineterminator="\r\n")
    return len(frame)


def inert_cell(text: str) -> str:
    """A text cell a spreadsheet will not evaluate: one starting with a `FORMULA_STARTS` character gets a `'` in
    front (OWASP "CSV injection"). Keys, shard names and dtypes come from the checkpoint."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def number_cell(value: object) -> int | str:
    """A number column's cell: an integer stays a number (negative ones too); anything else is neutralised text."""
    return value if type(value) is int else inert_cell(str(value))
