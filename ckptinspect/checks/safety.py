"""Pickle safety of the stored items inside `.distcp` files (byte items and tensor archives).

The readers already report what `.metadata`, `common.pt`, the common-state item and legacy `.pt` files reference
(CK601 / CK602). This check walks the opcodes of every other stored item's pickles (`safety_scan.scan_stored_items`: no
object is built, nothing is executed) and reports the same codes, plus CK603 / CK605 for pickles past the resource
bounds (`services/safety_containers.py` says which).
A giant checkpoint holds millions of tensor archives: without `--deep` only the byte items (rng state, extra state,
optimizer misc — where a hostile payload would hide) and the tensor items of TE `_extra_state` keys (decoded with
`pickle.loads`) are walked, up to `MAX_ITEMS`; `--deep` and `scan` walk all.
"""

from __future__ import annotations

from collections.abc import Iterator

from ckptinspect.checks import CheckContext
from ckptinspect.findings import Finding
from ckptinspect.formats.torch_dist import COMMON_STATE_KEY
from ckptinspect.io import location
from ckptinspect.model import Checkpoint, Format
from ckptinspect.services.safety_scan import scan_stored_items, stored_items
from ckptinspect.pickling.candidates import EXTRA_STATE

MAX_ITEMS = 20_000


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.format in (None, Format.TORCH, Format.NVRX_LOCAL):
        return  # legacy and NVRx local .pt files are unpickled (and reported) by the reader
    bounds: dict[tuple[str, int], int] = {}  # decode bounds of stream-transformed tensor items
    if ckpt.raw_tensor_items:
        # safetensors tensor data (DCP's Hugging Face storage): raw element bytes that no loader unpickles
        items = [(o.key, o.storage) for o in ckpt.objects if o.storage is not None]
    elif ctx.deep:
        items = [(k, it) for k, it in stored_items(ckpt.tensors, ckpt.objects, bounds) if k != COMMON_STATE_KEY]
    else:
        items = [(o.key, o.storage) for o in ckpt.objects if o.storage is not None and o.key != COMMON_STATE_KEY]
        # TE `_extra_state` saved as a tensor item (plain DCP): decoded with `pickle.loads` on load, so walked too
        extra = [t for t in ckpt.tensors if EXTRA_STATE in t.key]
        items = (items + list(stored_items(extra, (), bounds)))[:MAX_ITEMS]
    yield from scan_stored_items(location(ckpt.data_dir), ckpt.path, items, bounds=bounds).findings
