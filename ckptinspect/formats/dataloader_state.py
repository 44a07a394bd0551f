"""Per-DP-rank dataloader state saved with a checkpoint: where each stack writes it, which ranks are there, CK540-CK544.

Layouts, from the stacks' source (docs/contract.md "Dataloader state" gives the lines):

- Megatron-Bridge (`training/checkpointing.py` `maybe_save_dataloader_state`, v0.4-v0.6 and later): with an
  Energon dataloader, `{dataset.dataloader_save or checkpoint.save/energon}/iter_{N:07d}/train_dataloader_dprank{dp:03d}.pt`,
  one `torch.save({"dataloader_state_dict": ...})` per DP rank (the TP/PP/CP leader of each DP replica writes it).
  The load (`maybe_load_dataloader_state`) opens only its own rank's file: a missing one raises RuntimeError, a
  file of a rank beyond the new DP is never read.
- torchtitan (`components/dataloader.py` `ParallelAwareDataloader.state_dict`, v0.2.x): the `dataloader` Stateful
  inside the DCP save, `{"dp_rank_{r}": pickle.dumps(StatefulDataLoader.state_dict()), "world_size": dp}`, hence
  the byte items `dataloader.dp_rank_{r}` and `dataloader.world_size`. The Grain loader of later torchtitan
  (`components/data/loader.py`) writes `version`, `dp_world_size` and `dp_rank_{r}` (a dict, flattened by DCP).

Megatron-LM's `--dataloader-save` (examples/multimodal) is a directory of the user's choosing that the checkpoint
does not name in a form this tool can resolve; it is not read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding, Severity
from ckptinspect.formats.files import pickle_findings, read_item_archive
from ckptinspect.model import Checkpoint, DataloaderState, Stack
from ckptinspect.pickling.plain import to_plain
from ckptinspect.pickling.torch_archive import read_torch_file

ENERGON = "energon"  # Bridge DATALOADER_STATE_SUBDIR
BRIDGE_RANK_FILE = re.compile(r"train_dataloader_dprank(\d{3,})\.pt")
TITAN_RANK_KEY = re.compile(r"dataloader\.dp_rank_(\d+)(?:\.|$)")
TITAN_WORLD_KEYS = ("dataloader.world_size", "dataloader.dp_world_size")


def bridge_dataloader(ckpt: Checkpoint, path: Path, label: str,
                      config: Mapping[str, Any] | None) -> tuple[DataloaderState | None, list[Finding]]:
    """The Energon sidecars of Bridge checkpoint dir `path`, and CK540-CK543; (None, []) without an Energon dir."""
    root = _bridge_root(path, config)
    if root is None:
        return None, []
    name = f"iter_{ckpt.iteration:07d}" if ckpt.iteration is not None else path.name
    it_dir = root / name
    where = Path(os.path.relpath(it_dir, path)).as_posix()
    dp = ckpt.topology.dp
    try:
        if not it_dir.is_dir():
            others = sorted(d.name for d in root.iterdir() if d.name.startswith("iter_") and d.is_dir())
            if not others:
                return None, []
            return None, [Finding(
                "CK543", f"{where} does not exist while {Path(os.path.relpath(root, path)).as_posix()} holds the "
                f"dataloader state of {len(others)} other iteration(s): Bridge <=0.6.0 refuses to resume from this "
                "checkpoint (RuntimeError: the per-DP-rank file is missing), later versions restart the data order "
                "from the beginning", where, label, {"iterations": others[-8:]})]
        files = {int(m.group(1)): e for e in it_dir.iterdir() if (m := BRIDGE_RANK_FILE.fullmatch(e.name))}
    except OSError as e:
        return None, [Finding("CK542", f"{where}: cannot list the dataloader state ({e.strerror or e})", where, label)]
    findings: list[Finding] = []
    unreadable: list[int] = []
    for rank in sorted(files):
        bad = _check_bridge_file(files[rank], f"{where}/{files[rank].name}", label)
        if any(f.code == "CK542" for f in bad):
            unreadable.append(rank)
        findings.extend(bad)
    state = DataloaderState(Stack.MEGATRON_BRIDGE.value, where, tuple(sorted(files)), dp, tuple(unreadable))
    return state, findings + rank_findings(state, label, "train_dataloader_dprank{:03d}.pt")


def titan_dataloader(ckpt: Checkpoint, path: Path, label: str) -> tuple[DataloaderState | None, list[Finding]]:
    """torchtitan's `dataloader.dp_rank_*` items of a DCP save, and CK540 / CK541 / CK542 / CK544."""
    keys = [o.key for o in ckpt.objects] + [t.key for t in ckpt.tensors]
    ranks = sorted({int(m.group(1)) for k in keys if (m := TITAN_RANK_KEY.match(k))})
    worlds = [o for o in ckpt.objects if o.key in TITAN_WORLD_KEYS]
    if not ranks and not worlds:
        return None, []
    findings: list[Finding] = []
    recorded: int | None = None
    for item in worlds:
        value = _item_value(path, item.storage) if item.storage is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            recorded = value
        else:
            findings.append(Finding("CK542", f"{item.key}: not a readable positive int (the storage and safety "
                                    "checks say why when its bytes are missing, cut or hostile)", item.key, label))
    stored = ({_rank_of(o.key) for o in ckpt.objects if o.storage is not None}
              | {_rank_of(t.key) for t in ckpt.tensors})
    no_bytes = tuple(r for r in ranks if r not in stored)
    dp = recorded if recorded is not None else ckpt.topology.dp
    mismatch = _recorded_mismatch(recorded, ckpt.topology.dp, ckpt.topology.world_size)
    if mismatch is not None:
        findings.append(Finding("CK544", f"the dataloader state was written for DP {recorded} but {mismatch}",
                                worlds[0].key, label, {"recorded_dp": recorded, "checkpoint_dp": ckpt.topology.dp,
                                                       "world_size": ckpt.topology.world_size}))
    state = DataloaderState(Stack.TORCHTITAN.value, "dataloader.", tuple(ranks), dp, no_bytes)
    return state, findings + rank_findings(state, label, "dataloader.dp_rank_{}")


def rank_findings(state: DataloaderState, label: str, pattern: str) -> list[Finding]:
    """CK540 (a DP rank without its state) and CK541 (state of a rank at or beyond DP) for `state`."""
    if state.dp is None:
        return []
    out: list[Finding] = []
    missing = [r for r in range(state.dp) if r not in state.ranks]
    if missing:
        names = ", ".join(f"{r} ({pattern.format(r)})" for r in missing[:8]) + (", ..." if len(missing) > 8 else "")
        out.append(Finding("CK540", f"{state.location}: no dataloader state for DP rank(s) {names} of DP "
                           f"{state.dp}: a resume at this DP cannot restore the data position of those ranks "
                           f"({_consequence(state.stack)})", state.location, label,
                           {"missing_ranks": missing, "dp": state.dp, "present_ranks": list(state.ranks)}))
    extra = [r for r in state.ranks if r >= state.dp]
    if extra:
        out.append(Finding("CK541", f"{state.location}: dataloader state of DP rank(s) {extra[:8]} beyond DP "
                           f"{state.dp} (left by a run with a larger DP, or the DP is misread): no rank loads it",
                           state.location, label, {"extra_ranks": extra, "dp": state.dp}))
    return out


def _recorded_mismatch(recorded: int | None, dp: int | None, world: int | None) -> str | None:
    """Why the recorded DP cannot be this checkpoint's: it differs from the known DP, or (DP unknown: a plain DCP
    save says only its world size) it exceeds or does not divide the world size."""
    if recorded is None:
        return None
    if dp is not None:
        return f"the checkpoint's DP is {dp}" if recorded != dp else None
    if world is not None and (recorded > world or world % recorded):
        return f"the checkpoint was written by {world} rank(s) (DP divides the world size)"
    return None


def _consequence(stack: str) -> str:
    if stack == Stack.MEGATRON_BRIDGE.value:
        return "Bridge raises RuntimeError at load on each such rank"
    # torchtitan's dcp.load runs torch's DefaultLoadPlanner strict (no allow_partial_load): a key the rank's
    # dataloader asks for and the checkpoint lacks raises before ParallelAwareDataloader.load_state_dict runs
    return "torchtitan's dcp.load raises 'Missing key in checkpoint state_dict' on each such rank"


def _rank_of(key: str) -> int:
    m = TITAN_RANK_KEY.match(key)
    return int(m.group(1)) if m else -1


def _bridge_root(path: Path, config: Mapping[str, Any] | None) -> Path | None:
    """The dir Bridge saves Energon state under: `dataset.dataloader_save` when set and present here, else
    `{save}/energon` beside the iteration dirs (v0.6.0 `save_checkpoint`)."""
    dataset = config.get("dataset") if isinstance(config, Mapping) else None
    chosen = dataset.get("dataloader_save") if isinstance(dataset, Mapping) else None
    candidates = [Path(chosen)] if isinstance(chosen, str) and chosen else []
    candidates.append(path.parent / ENERGON)
    for c in candidates:
        try:
            if c.is_dir():
                return c
        except OSError:
            continue
    return None


def _check_bridge_file(file: Path, subject: str, label: str) -> list[Finding]:
    """Read one `train_dataloader_dprank*.pt` with the allowlisting unpickler (never executed): CK542 when cut,
    unreadable or not `{"dataloader_state_dict": ...}`; the pickle's own safety findings."""
    try:
        archive = read_torch_file(file)
    except ReadError as e:
        return [Finding("CK542", f"{subject}: {e}", subject, label, {"cause": e.code})]
    out = pickle_findings(archive.report, subject, label)
    if archive.report.dangerous or any(f.severity is Severity.ERROR for f in out):
        return out  # the unpickler stopped at what it refused: the shape is not known, not wrong
    try:
        plain = to_plain(archive.obj)
    except ReadError as e:
        return out + [Finding("CK542", f"{subject}: {e}", subject, label, {"cause": e.code})]
    if not isinstance(plain, dict) or "dataloader_state_dict" not in plain:
        out.append(Finding("CK542", f"{subject} is not Bridge's dataloader state (no 'dataloader_state_dict' key)",
                           subject, label))
    return out


def _item_value(path: Path, storage: Any) -> Any:
    try:
        archive = read_item_archive(path, storage)
    except (ReadError, OSError):
        return None
    if archive.report.dangerous:
        return None
    try:
        return to_plain(archive.obj)
    except ReadError:
        return None
