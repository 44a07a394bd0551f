"""Integrity check: verify the checkpoint's SHA-256 manifest (`integrity.json`, or `--manifest FILE`).

`audit` is metadata-level by default: the manifest is checked without reading file contents (listed files present,
unlisted files, staleness); `--hash` (or `--deep`) hashes every listed byte. A thin adapter over `integrity_verify.verify_manifest` (which
`manifest verify` shares) for `audit`: findings CK400–CK404. Only checkpoint dirs have a manifest (Megatron-Core ≥0.17.1 writes `integrity.json` next to `.metadata`); a checkpoint that is a single
file yields nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from ckptinspect.checks import CheckContext
from ckptinspect.findings import Finding
from ckptinspect.services.integrity_verify import verify_manifest
from ckptinspect.model import Checkpoint
from ckptinspect.io import location


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Yield the manifest verification findings of `ckpt`, attributed to `ckpt.path`."""
    root = location(ckpt.path)
    if not root.is_dir():
        return
    report = verify_manifest(root, ctx.manifest, workers=ctx.workers, progress=ctx.progress, path_label=ckpt.path,
                             hash_files=ctx.hash or ctx.deep)
    for finding in report.findings:
        yield finding.with_path(ckpt.path)
