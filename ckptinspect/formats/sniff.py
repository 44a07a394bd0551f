"""Format sniffing: what a path is, which format, the evidence, and the producer generation.

Follows Megatron's `_get_checkpoint_format` (reference §1) with the fixes it recommends: a `.metadata` without
`metadata.json` is an unfinished torch_dist save when Megatron markers are present (`common.pt`, ShardedObject
`…/shard_<o>_<s>` keys, `optimizer.distributed.` keys, `planner_data` None), otherwise plain DCP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.formats.files import regular_size
from ckptinspect.io.local import noted, probe_dir, read_small
from ckptinspect.formats.dcp.hf import hf_layout
from ckptinspect.formats.dcp.ranks import missing_message, rank_files
from ckptinspect.formats.dcp.stream import SeenMetadata, read_metadata
from ckptinspect.formats.generation import GEN_ZARR, Generation, megatron_generation
from ckptinspect.formats.inflight import MSC_METADATA_TMP, msc_temp_of
from ckptinspect.formats.legacy import is_legacy_dir
from ckptinspect.formats.nvrx_local import LOCAL_FILE
from ckptinspect.formats.safetensors import GENERATION as SAFETENSORS_GEN, safetensors_evidence
from ckptinspect.formats.savedir import TRACKER, SaveStyle, looks_like_save_dir
from ckptinspect.formats.stacks import classify_dcp_keys, outer_layout, unfinished_marker
from ckptinspect.model import Format, Kind, Stack, StrEnum

MAX_JSON_BYTES = 1 << 20  # metadata.json is ~120 bytes; a huge one is garbage, not worth reading
FSDP_PREFIXES = ("model.module.", "optimizer.state.module.", "optimizer.param_to_group_meta.")


class SniffState(StrEnum):
    """Whether a checkpoint's markers say its save finished, or the code of what is half-written / missing."""

    COMPLETE = "complete"
    CK100 = "CK100"  # no known checkpoint format
    CK101 = "CK101"  # .metadata without metadata.json: torch_dist save not finalized
    CK102 = "CK102"  # data files without .metadata
    CK103 = "CK103"  # .metadata.tmp: crash while writing .metadata
    CK106 = "CK106"  # metadata.json present, .metadata lost
    CK209 = "CK209"  # the checkpoint dir cannot be listed or entered here (permission denied): nothing sniffed
    CK130 = "CK130"  # Megatron iteration dir with nothing but (part of) common.pt: a save that started
    CK131 = "CK131"  # metadata.json cut short (the final marker being written, or interrupted)
    CK503 = "CK503"  # save dir: the tracker names a missing iteration
    CK507 = "CK507"  # NeMo 2 `-unfinished` marker
    CK513 = "CK513"  # NVRx local file still being written (.dirty)


@dataclass(frozen=True, slots=True)
class CheckpointSniff:
    """What one checkpoint dir is.

    format: None when unrecognized (CK100).
    state: COMPLETE when the markers say the save finished, or the half-written code that applies.
    subject / message: the state finding's subject and message when the generic ones would not say it (a DCP
      per-rank save with a rank's `__R.metadata` missing); None for the generic ones.
    """

    format: Format | None
    evidence: tuple[str, ...]
    generation: str | None
    state: SniffState
    subject: str | None = None
    message: str | None = None


def _has_data_files(path: Path) -> bool:
    """`*.distcp` files, or multistorageclient's atomic-write temps of them (`.__0_0.distcp.tmp`, renamed at close:
    Megatron-Core writes through MSC whenever the package is installed, unless `--disable-msc`)."""
    try:
        return any(p.name.endswith(".distcp") or msc_temp_of(p.name, ".distcp") for p in path.iterdir())
    except OSError:
        return False


def sniff_checkpoint(path: Path, megatron_context: bool = False, _again: int = 2, *,
                     seen: SeenMetadata | None = None) -> CheckpointSniff:
    """Sniff one checkpoint dir (or a legacy `.pt` file). Never raises.

    `megatron_context` says the dir sits in a Megatron save dir (tracker / `iter_*` naming), which decides the
    format of a save that crashed before `.metadata` existed. A save being written can move on between the checks
    below (a data file appearing after the dir was found holding only `common.pt`): a Megatron iteration dir that
    reads as no checkpoint while it holds a file of the save is sniffed again (`_again` more times at most).
    `seen`: where a `.metadata` the sniff parses is kept for the reader that follows (`read_checkpoint`'s).
    """
    if path.is_file():
        if LOCAL_FILE.match(path.name):
            return CheckpointSniff(Format.NVRX_LOCAL, (f"{path.name}: an NVRx local checkpoint file "
                                                       "(iter_N_R_local.pt)",), "nvidia-resiliency-ext", SniffState.COMPLETE)
        if path.suffix == ".pt":
            return CheckpointSniff(Format.TORCH, (f"{path.name}: a torch.save file (legacy per-rank format)",),
                                   "megatron legacy torch", SniffState.COMPLETE)
        if path.name == ".metadata":
            return sniff_checkpoint(path.parent, megatron_context, seen=seen)
        st = safetensors_evidence(path)
        if st is not None:
            return CheckpointSniff(Format.SAFETENSORS, (st,), SAFETENSORS_GEN, SniffState.COMPLETE)
        return CheckpointSniff(None, (f"{path.name} is a file of no known checkpoint format",), None, SniffState.CK100)
    ev: list[str] = []
    mj = path / "metadata.json"
    if mj.exists():
        gen = None
        parsed = False
        try:
            cfg = json.loads(read_small(mj, MAX_JSON_BYTES).decode("utf-8"))
            parsed = True
            backend = cfg.get("sharded_backend") if isinstance(cfg, dict) else None
            ev.append(f"metadata.json present (sharded_backend={backend!r})")
            if isinstance(cfg, dict):
                if "common_backend" in cfg:
                    gen = "megatron-core<=0.18 (4-key metadata.json)"
                elif (path / "common.pt").exists():
                    gen = "megatron-core<=0.18 (common.pt)"
                else:
                    gen = "megatron-core>=0.19 (2-key metadata.json, common_state item)"
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            ev.append("metadata.json present but unreadable")
        if (path / "common.pt").exists():
            ev.append("common.pt present")
        state = SniffState.COMPLETE
        cut = None if parsed else _cut_marker(path)
        if cut is not None:
            ev.append(cut)
            return CheckpointSniff(Format.TORCH_DIST, tuple(ev), None, SniffState.CK131)
        if gen is not None and isinstance(cfg, dict) and cfg.get("sharded_backend") == "zarr":
            gen = GEN_ZARR
            ev.append("zarr backend: one zarr array dir per tensor key, no .metadata (megatron-core <=0.15)")
        elif gen is not None and isinstance(cfg, dict):
            finer = _megatron_generation(path, cfg, seen)
            if finer.label is not None:
                gen = finer.label
                ev.extend(finer.evidence)
        # (an unreadable metadata.json hides a zarr backend: without it, no conclusion from a missing .metadata)
        if (state is SniffState.COMPLETE and not (path / ".metadata").exists() and gen != GEN_ZARR
                and noted(mj) is None):
            # metadata.json is written after .metadata: a missing .metadata here was lost, not never written.
            state = SniffState.CK103 if (path / ".metadata.tmp").exists() else SniffState.CK106
        return CheckpointSniff(Format.TORCH_DIST, tuple(ev), gen, state)
    if is_legacy_dir(path):
        ev.append("mp_rank_* shard dirs present")
        return CheckpointSniff(Format.TORCH, tuple(ev), "megatron legacy torch", SniffState.COMPLETE)
    if (path / ".metadata").exists():
        ev.append(".metadata present, no metadata.json")
        fmt, markers = _dcp_or_unfinished(path, seen)
        ev.extend(markers)
        if fmt is Format.TORCH_DIST:
            ev.append("Megatron markers without metadata.json: a torch_dist save that was not finalized")
            return CheckpointSniff(Format.TORCH_DIST, tuple(ev), None, SniffState.CK101)
        return CheckpointSniff(fmt, tuple(ev), "torch.distributed.checkpoint", SniffState.COMPLETE)
    rf = rank_files(path)
    if rf.metadata:
        # `dcp.save(..., use_collectives=False)`: every rank wrote its own `__R.metadata` (`dcp/ranks.py`)
        shown = ", ".join(rf.metadata.values())
        ev.append(f"per-rank metadata {shown if len(rf.metadata) <= 4 else str(len(rf.metadata)) + ' files'}, no "
                  ".metadata: dcp.save(..., use_collectives=False); dcp.load reads each rank's own")
        if rf.missing:
            subject, message = missing_message(rf)
            state = SniffState.CK103 if rf.missing[0] in rf.tmp else SniffState.CK102
            return CheckpointSniff(Format.TORCH_DCP, tuple(ev), None, state, subject, message)
        return CheckpointSniff(Format.TORCH_DCP, tuple(ev), "torch.distributed.checkpoint", SniffState.COMPLETE)
    # torch's FileSystemWriter writes .metadata.tmp then renames; through MSC the temp is `..metadata.tmp`
    tmp = (path / ".metadata.tmp").exists() or (path / MSC_METADATA_TMP).exists()
    data = _has_data_files(path)
    if tmp or data:
        megatron = megatron_context or (path / "common.pt").exists()
        fmt = Format.TORCH_DIST if megatron else Format.TORCH_DCP
        if tmp:
            ev.append(".metadata.tmp present (crash while writing .metadata)")
        if data:
            ev.append("*.distcp data files present without .metadata")
        if (path / "common.pt").exists():
            ev.append("common.pt present")
        return CheckpointSniff(fmt, tuple(ev), None, SniffState.CK103 if tmp else SniffState.CK102)
    hf = hf_layout(path)
    if hf is not None:
        return CheckpointSniff(Format.TORCH_DCP, (hf,), "torch.distributed.checkpoint HuggingFaceStorageWriter",
                               SniffState.COMPLETE)
    st = safetensors_evidence(path)
    if st is not None:  # after the DCP writers' layouts: safetensors files with DCP's __metadata__ are theirs
        return CheckpointSniff(Format.SAFETENSORS, (st,), SAFETENSORS_GEN, SniffState.COMPLETE)
    started = _started_save(path, megatron_context)
    if started is not None:
        return CheckpointSniff(Format.TORCH_DIST, (started,), None, SniffState.CK130)
    if _again > 0 and _save_moved_on(path, megatron_context):
        return sniff_checkpoint(path, megatron_context, _again - 1, seen=seen)
    return CheckpointSniff(None, ("no metadata.json, no .metadata, no mp_rank_* dirs",), None, SniffState.CK100)


def _save_moved_on(path: Path, megatron_context: bool) -> bool:
    """A Megatron iteration dir that holds a file its save writes: the checks above would have named it, so the
    save wrote it while they ran."""
    from ckptinspect.formats.inflight import megatron_iteration, save_file

    if megatron_iteration(path, megatron_context) is None:
        return False
    try:
        return any(save_file(p.name) for p in path.iterdir())
    except OSError:
        return False


def _cut_marker(path: Path) -> str | None:
    """Evidence when `metadata.json` is cut short beside a whole `.metadata` in an iteration the tracker does not
    name: Megatron's rank 0 is writing it (plain `open('w')` + `json.dump`) or was stopped doing so. In the tracked
    iteration a cut marker was whole once (the tracker is written after it): the reader's CK104 says corrupt."""
    from ckptinspect.formats.inflight import cut_json, is_tracked

    if not (path / ".metadata").exists() or is_tracked(path):
        return None
    try:
        raw = read_small(path / "metadata.json", MAX_JSON_BYTES)
    except OSError:
        return None
    if not cut_json(raw):
        return None
    return (f"metadata.json cut short ({len(raw)} bytes, a prefix of a JSON document) beside .metadata: the final "
            "marker is being written or its write was interrupted")


def _started_save(path: Path, megatron_context: bool) -> str | None:
    """Evidence when `path` is a Megatron save that started and wrote nothing after `common.pt`: `common.pt` alone
    (Megatron's file), or an empty dir that is Megatron's `iter_{N:07d}` of a save dir (`inflight.py`)."""
    from ckptinspect.formats.inflight import COMMON_PT, megatron_iteration, only_started

    started, names = only_started(path)
    if not started:
        return None
    if names:
        return (f"only {' and '.join(names)} present ({COMMON_PT} is written first, before the data files; "
                f".{COMMON_PT}.tmp is multistorageclient's temp of it): a Megatron torch_dist save that started and "
                "has written no data file yet")
    if megatron_iteration(path, megatron_context) is not None:
        return (f"{path.name} is Megatron's iteration dir (iter_{{N:07d}} in a save dir) and is empty: a save that "
                "created its dir and has written nothing yet")
    return None


def _megatron_generation(path: Path, cfg: dict[str, object], seen: SeenMetadata | None) -> Generation:
    """The release family from a small `.metadata` and `common.pt` (both read without executing anything)."""
    from ckptinspect.errors import ReadError
    from ckptinspect.pickling.plain import to_plain
    from ckptinspect.pickling.torch_archive import read_torch_file

    md = None
    size = regular_size(path / ".metadata")
    if size is not None and size <= (64 << 20):
        try:
            # kept in `seen` for the reader that follows: the file is read once
            md = read_metadata(path / ".metadata", seen=seen, keep=True)
        except Exception:  # noqa: BLE001 - the reader reports an unreadable .metadata; sniff just knows less
            md = None
    common = None
    source = None
    csize = regular_size(path / "common.pt")
    if csize is not None:
        source = "common.pt"
        if csize <= (4 << 20):
            try:
                archive = read_torch_file(path / "common.pt")
                plain = None if archive.report.dangerous else to_plain(archive.obj)
                common = plain if isinstance(plain, dict) else None
            except (ReadError, OSError):
                common = None
    elif md is not None and any(o.key == "common_state/shard_0_1" for o in md.objects):
        source = "common_state/shard_0_1"
    return megatron_generation(cfg, source, md, common)


def sniff_stacked(path: Path, megatron_context: bool = False) -> tuple[CheckpointSniff, Stack | None]:
    """`sniff_checkpoint` that also knows the stacks: NVRx iterations, NeMo 2 / Bridge outer layouts, torchtitan vs
    Megatron FSDP keys. Returns the sniff (of the payload, evidence of the layout first) and the stack."""
    from ckptinspect.formats.nvrx_local import virtual_iteration

    local = virtual_iteration(path)
    if local is not None:
        root, it = local
        mine = [f for f in root.files if f.iteration == it]
        ev = (f"NVRx local checkpoint: {len(mine)} file(s) iter_{it:07d}_<rank>_local[.dirty].pt in "
              f"{len(root.rank_dirs)} rank dir(s) (nvidia-resiliency-ext LocalCheckpointManager)",)
        dirty = any(f.dirty for f in mine)
        return CheckpointSniff(Format.NVRX_LOCAL, ev, "nvidia-resiliency-ext", SniffState.CK513 if dirty else SniffState.COMPLETE), \
            Stack.NVRX_LOCAL
    if path.is_file() and LOCAL_FILE.match(path.name):
        return sniff_checkpoint(path), Stack.NVRX_LOCAL
    layout = outer_layout(path)
    if layout is None:
        s = sniff_checkpoint(path, megatron_context)
        stack = None
        if s.format is Format.FSDP_DTENSOR:
            stack = Stack.MEGATRON_FSDP
        elif any(e.startswith("torchtitan") for e in s.evidence):
            stack = Stack.TORCHTITAN
        return s, stack
    s = sniff_checkpoint(layout.payload, True)
    state = s.state
    if layout.stack is Stack.NEMO2 and unfinished_marker(path).exists():
        state = SniffState.CK507
    return CheckpointSniff(s.format, layout.evidence + s.evidence, s.generation, state), layout.stack


def _dcp_or_unfinished(path: Path, seen: SeenMetadata | None) -> tuple[Format, list[str]]:
    markers: list[str] = []
    if (path / "common.pt").exists():
        markers.append("common.pt present")
        return Format.TORCH_DIST, markers
    size = regular_size(path / ".metadata")
    if size is None or size > (64 << 20):
        return Format.TORCH_DCP, markers
    try:
        # kept in `seen` for the reader that follows: the file is read once
        md = read_metadata(path / ".metadata", seen=seen, keep=True)
    except Exception:  # noqa: BLE001 - unreadable metadata is reported by the reader; sniff falls back to DCP
        return Format.TORCH_DCP, markers
    keys = list(md.table.keys) + [o.key for o in md.objects]
    if any(o.key == "common_state/shard_0_1" for o in md.objects):
        markers.append("common_state/shard_0_1 item")
    if any(o.grid is not None for o in md.objects):
        markers.append("ShardedObject …/shard_<offset>_<shape> keys")
    if any(k.startswith("optimizer.distributed.") for k in keys):
        markers.append("optimizer.distributed.* keys")
    # Megatron-Core's own `.metadata` attributes (0.11+ `all_local_plans`, 0.8-0.15 `mcore_data`). `planner_data`
    # None is no marker: Megatron's MCoreSavePlanner writes None, and so does torch's DefaultSavePlanner with
    # `flatten_state_dict=False` (a plain DCP save).
    if md.rank_items:
        markers.append("all_local_plans (Megatron-Core's MCoreSavePlanner)")
    if md.mcore_data:
        markers.append("mcore_data (Megatron-Core 0.8-0.15)")
    if markers:
        return Format.TORCH_DIST, markers
    stack, why = classify_dcp_keys(keys)
    if stack is Stack.MEGATRON_FSDP:
        return Format.FSDP_DTENSOR, [why or "fsdp_dtensor key prefixes"]
    out = ["planner_data is an fqn map (flatten_state_dict=True)" if md.planner_keys is not None else
           "planner_data is None: an unflattened state dict (DefaultSavePlanner(flatten_state_dict=False))"]
    return Format.TORCH_DCP, out + ([why] if why else [])


def path_kind(path: Path) -> Kind:
    """SAVE_DIR for a save root, CHECKPOINT for anything else (a checkpoint dir or file)."""
    if path.is_dir() and not (path / "metadata.json").exists() and not (path / ".metadata").exists():
        if not is_legacy_dir(path) and looks_like_save_dir(path):
            return Kind.SAVE_DIR
    return Kind.CHECKPOINT



@dataclass(frozen=True, slots=True)
class SniffReport:
    """`sniff PATH`: what PATH is. For a save dir, format and generation are those of the checkpoint a resume
    would pick; `checkpoint` names it."""

    path: str
    kind: Kind
    format: Format | None
    evidence: tuple[str, ...]
    generation: str | None
    state: SniffState
    checkpoint: str | None
    stack: Stack | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path, "kind": self.kind.value, "format": self.format.value if self.format else None,
            "evidence": list(self.evidence), "generation": self.generation, "state": self.state.value,
            "checkpoint": self.checkpoint, "stack": self.stack.value if self.stack else None,
        }


def sniff(path: Path, label: str | None = None) -> SniffReport:
    """Sniff a save dir or a checkpoint (the caller checked that `path` exists)."""
    from ckptinspect.formats.savedir import read_save_dir

    label = label if label is not None else str(path)
    if path_kind(path) is Kind.CHECKPOINT:
        s, stack = sniff_stacked(path)
        return SniffReport(label, Kind.CHECKPOINT, s.format, s.evidence, s.generation, s.state, label, stack)
    save = read_save_dir(path)
    ev: list[str] = []
    t = save.tracker
    if t.exists:
        ev.append(f"{TRACKER}: {t.raw!r}" + (f" ({t.error})" if t.error else f" → iteration {t.iteration}"))
    else:
        ev.append(f"no {TRACKER}")
    ev.append(f"{len(save.iterations)} iteration dir(s): " + ", ".join(i.name for i in save.iterations[:6])
              + (" ..." if len(save.iterations) > 6 else ""))
    pick = save.resume_pick()
    if pick is None:
        return SniffReport(label, Kind.SAVE_DIR, None, tuple(ev), None, SniffState.CK503 if t.exists else SniffState.CK100, None)
    denied = probe_dir(pick.path)
    if denied is not None:
        ev.append(f"resume would load {pick.name}: {denied.reason} ({denied.what})")
        return SniffReport(label, Kind.SAVE_DIR, None, tuple(ev), None, SniffState.CK209,
                           f"{label.rstrip('/')}/{pick.name}", save.stack)
    s, stack = sniff_stacked(pick.path, save.style is SaveStyle.MEGATRON)
    if save.style_evidence:
        ev.insert(0, save.style_evidence)
    stack = stack or save.stack
    ev.append(f"resume would load {pick.name}")
    ev.extend(f"{pick.name}: {e}" for e in s.evidence)
    return SniffReport(label, Kind.SAVE_DIR, s.format, tuple(ev), s.generation, s.state,
                       f"{label.rstrip('/')}/{pick.name}", stack)
