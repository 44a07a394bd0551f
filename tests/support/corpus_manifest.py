"""Acceptance cases: integrity manifest (CK4xx, on the 0.19.2 fixture, which has integrity.json).

Part of the corpus gathered in `tests/support/corpus.py` (see `tests/support/corpus_kit.py` for the builders)."""

from __future__ import annotations

import os
from pathlib import Path

from corpus_kit import Case, Ctx, M19, S, _rm, _write, m19


def _flip_byte(ckpt: Path, ctx: Ctx) -> None:
    with open(ckpt / "__3_0.distcp", "r+b") as f:
        f.seek(100_000)
        b = f.read(1)
        f.seek(100_000)
        f.write(bytes([b[0] ^ 0xFF]))


def _stale_manifest(ckpt: Path, ctx: Ctx) -> None:
    """A second save into the same dir rewrote the data and metadata.json but left the old integrity.json
    (Megatron's save() deletes nothing; the manifest is written last): data changed, manifest a minute older."""
    _flip_byte(ckpt, ctx)
    mj = ckpt / "metadata.json"
    now = mj.stat().st_mtime
    os.utime(ckpt / "integrity.json", (now - 60, now - 60))



MANIFEST_CASES: tuple[Case, ...] = (
    # audit hashes only with --hash / --deep (issue 18: work proportional to the verdict)
    Case("manifest_byte_flip", m19(_flip_byte), "corrupt", S({"CK401"}), flags=("--hash",), sources=M19),
    Case("manifest_stale", m19(_stale_manifest), "corrupt", S({"CK401", "CK405"}), flags=("--hash",), sources=M19),
    Case("manifest_file_deleted", m19(_rm("__7_0.distcp")), "corrupt", S({"CK402", "CK201"}), sources=M19),
    Case("manifest_extra_file", m19(_write("notes.txt", b"hello\n")), "complete", S({"CK403"}), sources=M19),
    Case("manifest_garbage", m19(_write("integrity.json", b"\x00garbage")), "corrupt", S({"CK404"}), sources=M19),
    # the temp file of a `manifest write` killed before its rename (as our writer names it; tests/
    # test_interrupted_write.py kills real writes): reported, never an unlisted file (CK403)
    Case("manifest_write_leftover", m19(_write(".integrity.json.4194304.0badcafe.tmp", b'{"algorithm": "sha256"')),
         "complete", S({"CK406"}), absent=frozenset({"CK403"}), sources=M19),
)
