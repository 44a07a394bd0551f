"""Format readers: sniff a path, then rebuild the neutral model with the reader for its format.

The registry is the literal `READERS` table below. Every reader has the same contract:

1. `read(path: Path, label: str, seen: SeenMetadata | None) -> Checkpoint`, `label` being the path as the user
   named it, `seen` what the sniff of this read parsed already (`dcp.stream.SeenMetadata`: a `.metadata` is read
   once per checkpoint read, handed from the sniff to the reader explicitly);
2. it never raises for a broken, hostile or half-written checkpoint: what it could not read becomes findings in
   `Checkpoint.findings` (CK1xx format, CK206 unreadable `.pt`, CK601/CK602 pickle safety, CK603 bounds);
3. it reads metadata only: tensor bytes are never loaded, and nothing from the checkpoint is executed.

`read_checkpoint` wraps every reader: a checkpoint dir that cannot be listed or entered is not sniffed at all, and
what the reader could not open for access reasons (noted by `io.local`) becomes CK209 findings after it ran.

Modules:
- `sniff.py` (what a path is, its format, the evidence), `generation.py` (which Megatron-Core release family wrote
  it), `resolve.py` (a save dir stands for the checkpoint a resume would pick; where a checkpoint's files live),
  `savedir.py` (the tracker and the iteration dirs), `inflight.py` (a save still being written, the age rule);
- readers: `torch_dist.py`, `dcp/` (the one package that knows DCP's `.metadata`: reference reader, streaming VM,
  per-rank and Hugging Face layouts), `legacy.py` (per-rank `mp_rank_*` `.pt`), `zarr_dir.py`, `megatron_fsdp.py`,
  `nvrx_local.py`, `safetensors.py` (Hugging Face safetensors files and sharded sets), `stacks.py` (Bridge, NeMo 2, torchtitan, non-persistent around a payload), `dataloader_state.py` (the stacks' per-DP-rank dataloader state), `run_config.py`
  (Bridge's `run_config.yaml`, safe-loaded);
- shared by them: `files.py` (listing a dir, reading stored items, pickle findings), `transforms.py` (DCP stream
  transforms undone within bounds), `topology.py` (TP/PP/DP/... from args, checked against the files),
  `args_values.py` (every args value checked at this boundary), `safetensors_header.py` (a safetensors header,
  bounded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ckptinspect.errors import access_failure
from ckptinspect.findings import Finding
from ckptinspect.formats.args_values import args_findings
from ckptinspect.formats.dcp.reader import read_dcp
from ckptinspect.formats.dcp.stream import SeenMetadata
from ckptinspect.formats.inflight import age_of, megatron_iteration
from ckptinspect.formats.legacy import read_legacy, with_save_in_progress
from ckptinspect.formats.nvrx_local import LOCAL_FILE, find_local_root, read_nvrx_local, virtual_iteration
from ckptinspect.formats.safetensors import read_safetensors
from ckptinspect.formats.sniff import CheckpointSniff, SniffState, sniff_checkpoint
from ckptinspect.formats.stacks import enrich, outer_layout
from ckptinspect.formats.torch_dist import read_torch_dist
from ckptinspect.model import Checkpoint, Format
from ckptinspect.io.local import note_failed_open, probe_dir, unread_scope
from ckptinspect.io.findings import storage_findings, unread_findings

Reader = Callable[[Path, str, SeenMetadata | None], Checkpoint]


def _read_fsdp(path: Path, label: str, seen: SeenMetadata | None = None) -> Checkpoint:
    return read_dcp(path, label, seen, fmt=Format.FSDP_DTENSOR)


def _read_legacy(path: Path, label: str, seen: SeenMetadata | None = None) -> Checkpoint:
    return read_legacy(path, label)  # no `.metadata`


def _read_nvrx(path: Path, label: str, seen: SeenMetadata | None = None) -> Checkpoint:
    """An NVRx iteration: the virtual `{root}/iter_N`, or one `{root}/{rank}/iter_N_R_local.pt` file (its iteration)."""
    found = virtual_iteration(path)
    if found is None and LOCAL_FILE.match(path.name):
        root = find_local_root(path.parent.parent)
        m = LOCAL_FILE.match(path.name)
        if root is not None and m is not None:
            found = (root, int(m.group(1)))
    if found is None:
        return Checkpoint(path=label, format=None, findings=(
            Finding("CK100", "not an NVRx local checkpoint (no {root}/{rank}/iter_N_R_local.pt files)", None, label),))
    return read_nvrx_local(found[0], found[1], label)


READERS: tuple[tuple[Format, Reader], ...] = (
    (Format.TORCH_DIST, read_torch_dist),
    (Format.TORCH, _read_legacy),
    (Format.TORCH_DCP, read_dcp),
    (Format.FSDP_DTENSOR, _read_fsdp),
    (Format.NVRX_LOCAL, _read_nvrx),
    (Format.SAFETENSORS, read_safetensors),
)

_HALF_WRITTEN_MESSAGES = {
    "CK101": "torch_dist save not finalized: .metadata present, metadata.json missing",
    "CK102": "data files present but no .metadata: the save crashed during the data write",
    "CK103": ".metadata.tmp present: the save crashed while writing .metadata",
    "CK106": ".metadata missing although metadata.json marks the save finished",
    "CK100": "no known checkpoint format here (no metadata.json, .metadata or mp_rank_* dirs)",
    "CK130": "a save started here and has written nothing after common.pt (no data file, no .metadata)",
    "CK131": "metadata.json is cut short: the save's final marker is being written (or its write was interrupted)",
}


def reader_for(fmt: Format) -> Reader:
    for f, reader in READERS:
        if f is fmt:
            return reader
    raise KeyError(fmt)  # unreachable: READERS covers every Format (tested)


def read_checkpoint(path: Path, label: str, megatron_context: bool = False) -> Checkpoint:
    """Sniff and read one checkpoint dir (or legacy `.pt` file, or NVRx iteration).

    A stack's outer layout (NeMo 2 `weights/`, Megatron-Bridge files) is found first; its payload is read with the
    payload's reader, then `stacks.enrich` adds the stack's own facts and completeness findings.
    A dir that cannot be listed or entered (for this user) is a checkpoint of unknown format with a CK209 finding;
    a file the reader could not open for that reason is a CK209 finding beside what the reader made of it.
    """
    with unread_scope():
        try:
            ckpt = _read_checkpoint(path, label, megatron_context)
        except OSError as e:
            if not access_failure(e):
                raise
            # A reader met an unreadable path where it did not expect one (a sub-dir it may not enter): what it
            # read is lost, but the verdict is honest: incomplete, naming the path, never a traceback.
            note_failed_open(e, path)
            ckpt = Checkpoint(path=label, format=None)
        extra = unread_findings(path, label, ckpt.findings)
        return replace(ckpt, findings=ckpt.findings + extra) if extra else ckpt


def _read_checkpoint(path: Path, label: str, megatron_context: bool) -> Checkpoint:
    if probe_dir(path) is not None:
        return Checkpoint(path=label, format=None)  # the CK209 of the dir is added by `read_checkpoint`
    if virtual_iteration(path) is not None:
        return _with_args_findings(_read_nvrx(path, label))
    layout = outer_layout(path)
    payload = layout.payload if layout is not None else path
    if payload != path and probe_dir(payload) is not None:
        return Checkpoint(path=label, format=None)
    seen = SeenMetadata()  # what the sniff parses, for the reader (this read only)
    sniff = sniff_checkpoint(payload, megatron_context or layout is not None, seen=seen)
    ckpt = read_sniffed(payload, label, sniff, seen)
    if ckpt.format is Format.TORCH:  # a legacy save being written is unfinished, not damaged (`inflight.py`)
        ckpt = with_save_in_progress(ckpt, payload, megatron_context)
    ckpt = enrich(ckpt, path, label, layout, payload_complete=sniff.state is SniffState.COMPLETE)
    return _with_args_findings(ckpt)


def _with_args_findings(ckpt: Checkpoint) -> Checkpoint:
    """CK703 for the args values the readers read as absent (`args_values`), once, whichever reader found them."""
    bad = args_findings(ckpt.args, ckpt.path, str(ckpt.extra.get("args_source") or "args"))
    return replace(ckpt, findings=ckpt.findings + bad) if bad else ckpt


def read_sniffed(path: Path, label: str, sniff: CheckpointSniff, seen: SeenMetadata | None = None) -> Checkpoint:
    state_findings: tuple[Finding, ...] = ()
    if sniff.state is not SniffState.COMPLETE:
        subject = sniff.subject or {"CK101": "metadata.json", "CK103": ".metadata.tmp", "CK131": "metadata.json",
                                    "CK130": None}.get(sniff.state, ".metadata")
        details: dict[str, object] = {"evidence": list(sniff.evidence)}
        if sniff.state in _UNFINISHED_MARKERS:
            details.update(age_of(path, megatron_iteration(path, True)).to_dict())
        state_findings = (
            Finding(sniff.state.value, sniff.message or _HALF_WRITTEN_MESSAGES[sniff.state],
                    None if sniff.state is SniffState.CK100 else subject, label, details),
        )
    if sniff.format is None:
        return Checkpoint(path=label, format=None, findings=state_findings, extra={"evidence": list(sniff.evidence)})
    ckpt = reader_for(sniff.format)(path, label, seen)
    state_findings += storage_findings(path, label, ckpt.findings)
    extra = dict(ckpt.extra)
    extra["evidence"] = list(sniff.evidence)
    extra["sniff_state"] = sniff.state.value
    found = ckpt.findings
    if sniff.state in (SniffState.CK131, SniffState.CK101):
        # the reader's "metadata.json not JSON" is the cut marker CK131 already names (or, after CK101, the marker
        # rank 0 began writing after the sniff looked): unfinished, not corrupt
        found = tuple(f for f in found if not (f.code == "CK104" and f.subject == "metadata.json"))
    elif sniff.state is SniffState.CK130:
        # a common.pt that is not a whole archive yet is the write in progress CK130 names (what it referenced
        # before the cut is still judged: CK601 / CK604 stay)
        found = tuple(f for f in found if not (f.code == "CK206" and f.subject == "common.pt"))
    return replace(ckpt, generation=ckpt.generation or sniff.generation, findings=state_findings + found,
                   extra=extra)


# the states of a save caught before its end whose finding carries the age rule's verdict (`inflight.age_of`)
_UNFINISHED_MARKERS = frozenset({SniffState.CK130, SniffState.CK131})
