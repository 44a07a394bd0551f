"""pandas frames of the tensor table (`info --csv`). pandas is imported lazily: it is slow to import."""

from __future__ import annotations

from pathlib import Path

from ckptinspect.model import Checkpoint


def write_tensor_csv(c: Checkpoint, out: Path) -> int:
    """Write one row per tensor (key, shard, shape, dtype, chunks, bytes, stored_bytes); return the row count."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "key": [inert_cell(t.key) for t in c.tensors],
            "shard": [inert_cell(t.shard or "") for t in c.tensors],
            "shape": ["x".join(map(str, t.shape)) for t in c.tensors],
            "dtype": [inert_cell(t.dtype) for t in c.tensors],
            "chunks": [len(t.chunks) for t in c.tensors],
            "bytes": [t.nbytes for t in c.tensors],
            "stored_bytes": [t.stored_bytes for t in c.tensors],
        }
    )
    frame.to_csv(out, index=False)
    return len(frame)


def inert_cell(text: str) -> str:
    """A text cell a spreadsheet will not evaluate: a leading `=`, `+`, `-`, `@` (or tab / carriage return, which some
    spreadsheets strip before looking) gets a `'` in front (OWASP "CSV injection"). Tensor keys come from the
    checkpoint."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
