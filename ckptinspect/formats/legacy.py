"""Reader for Megatron's legacy `torch` format: `iter_*/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`.

Each (TP, PP[, EP]) shard dir holds one `torch.save` of the whole local state dict (args, iteration, model,
optimizer, rng_state list, ...) and, with the distributed optimizer, `distrib_optim.pt` (reference §7). Tensors are
local shards: they are modelled as one chunk each, tagged with their shard dir. Tensor bytes are never read.

`mp_rank_01_002` is ambiguous ((tp, pp) or (tp, ep)); the args in the files resolve it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import list_files, pickle_findings
from ckptinspect.pickling.plain import to_plain, walk_tensors
from ckptinspect.pickling.builders import TensorRef
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.pickling.torch_archive import TorchArchive, read_torch_file
from ckptinspect.formats.args_values import arg_int
from ckptinspect.formats.topology import topology_from
from ckptinspect.model import Checkpoint, Chunk, Format, StoredItem, dtype_size, frozen
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.io.local import note_unread

MODEL_FILE = "model_optim_rng.pt"
DISTOPT_FILE = "distrib_optim.pt"
_SHARD_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


@dataclass(frozen=True, slots=True)
class ShardName:
    """A parsed `mp_rank_*` dir name, before the TP/PP/EP ambiguity is resolved."""

    name: str
    tp: int
    second: int | None
    third: int | None


def parse_shard_dir(name: str) -> ShardName | None:
    m = _SHARD_DIR.match(name)
    if m is None:
        return None
    return ShardName(name, int(m.group(1)), _opt(m.group(2)), _opt(m.group(3)))


def _opt(v: str | None) -> int | None:
    return int(v) if v is not None else None


def shard_coords(s: ShardName, pp: int, ep: int) -> tuple[int, int, int]:
    """(tp, pp, ep) of a shard dir, using the args' PP and EP sizes (`get_checkpoint_name`)."""
    if s.third is not None:
        return s.tp, s.second or 0, s.third
    if s.second is None:
        return s.tp, 0, 0
    if pp > 1:
        return s.tp, s.second, 0
    if ep > 1:
        return s.tp, 0, s.second
    return s.tp, s.second, 0


def expected_shard_dirs(tp: int, pp: int, ep: int) -> list[str]:
    """Shard dir names Megatron writes for this topology (`training/checkpointing.py:230-276`)."""
    return list(iter_shard_dirs(tp, pp, ep))


def iter_shard_dirs(tp: int, pp: int, ep: int) -> Iterator[str]:
    """`expected_shard_dirs`, lazily: args may name a grid far larger than the dirs on disk."""
    for t in range(tp):
        for p in range(pp):
            for e in range(ep):
                name = f"mp_rank_{t:02d}"
                if pp > 1:
                    name += f"_{p:03d}"
                if ep > 1:
                    name += f"_{e:03d}"
                yield name


def is_legacy_dir(path: Path) -> bool:
    try:
        return any(parse_shard_dir(p.name) is not None for p in path.iterdir() if p.is_dir())
    except OSError:
        return False


def read_legacy(path: Path, label: str) -> Checkpoint:
    """Read a legacy iteration dir (or a single `.pt` file). Never raises for a broken checkpoint."""
    findings: list[Finding] = []
    tensors: list[TensorEntry] = []
    shard_args: dict[str, dict[str, Any]] = {}
    shard_files: dict[str, list[str]] = {}
    first_state: dict[str, Any] | None = None
    if path.is_file():
        base, shards = path.parent, [("", path.name)]
        files = tuple(f for f in list_files(base) if f.name == path.name)
    else:
        base = path
        names = sorted(p.name for p in _dirs(path) if parse_shard_dir(p.name) is not None)
        shards = []
        for name in names:
            present = sorted(p.name for p in _files(path / name))
            shard_files[name] = present
            shards.extend((name, f) for f in present if f.endswith(".pt"))
        files = list_files(path, recursive=True)
    for shard, fname in shards:
        rel = f"{shard}/{fname}" if shard else fname
        try:
            archive = read_torch_file(base / rel)
        except ReadError as e:
            findings.append(Finding(e.code, f"{rel}: {e}", rel, label))
            if isinstance(e.report, PickleReport):  # what it referenced / called before failing still counts
                findings.extend(pickle_findings(e.report, rel, label))
            continue
        findings.extend(pickle_findings(archive.report, rel, label))
        if archive.report.unsafe:
            continue  # the stand-ins of a hostile pickle are no state dict
        try:
            state = to_plain(archive.obj)
            prefix = "" if fname == MODEL_FILE else fname.removesuffix(".pt") + "."
            tensors.extend(_tensors(archive, state, rel, shard or None, prefix))
        except ReadError as e:
            findings.append(Finding(e.code, f"{rel}: {e}", rel, label))
            continue
        if fname == MODEL_FILE and isinstance(state, dict):
            if first_state is None:
                first_state = state
            if isinstance(state.get("args"), dict):
                shard_args[shard or fname] = state["args"]
    args = first_state.get("args") if first_state else None
    args = args if isinstance(args, dict) else None
    grid = _shard_grid(shard_files, args)
    chunks = _model_chunks(first_state)
    if chunks:
        grid["model_chunks"] = chunks
    topology, layout = topology_from(args, None, grid)
    iteration = first_state.get("iteration") if first_state else None
    common = (
        {k: v for k, v in first_state.items()
         if isinstance(k, str) and k not in ("args", "model", "optimizer") and not k.startswith("model")}
        if first_state
        else None
    )
    return Checkpoint(
        path=label,
        data_dir=str(base) if base != path else "",  # a single `.pt` file: its names are relative to its dir
        format=Format.TORCH,
        generation=_generation(first_state),
        iteration=iteration if isinstance(iteration, int) else None,
        table=ChunkTable.of(tensors),
        files=files,
        args=args,
        common=common,
        topology=topology,
        optimizer_sharding="legacy distrib_optim.pt" if any(DISTOPT_FILE in v for v in shard_files.values()) else None,
        findings=tuple(findings),
        layout=frozen(layout),
        shard_files=frozen({k: tuple(v) for k, v in shard_files.items()}),
        shard_args=frozen({k: frozen(v) for k, v in shard_args.items()}),
    )


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError as e:
        note_unread(path, e, "list")  # CK209; the legacy check does not judge a dir it could not list
        return []


def _files(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_file()]
    except OSError as e:
        note_unread(path, e, "list")
        return []


def _tensors(archive: TorchArchive, state: Any, rel: str, shard: str | None, prefix: str) -> list[TensorEntry]:
    out: list[TensorEntry] = []
    for key, ref in walk_tensors(state):
        out.append(TensorEntry(prefix + key, ref.shape, ref.dtype, (Chunk((0,) * len(ref.shape), ref.shape,
                                                                           _stored(archive, ref, rel)),), shard))
    return out


def _stored(archive: TorchArchive, ref: TensorRef, rel: str) -> StoredItem | None:
    rec = archive.records.get(f"data/{ref.storage_key}")
    if rec is None or rec.data_offset < 0:
        return None
    item = dtype_size(ref.dtype) or 0
    return StoredItem(rel, rec.data_offset + ref.storage_offset * item, ref.nbytes)


def _model_chunks(state: dict[str, Any] | None) -> int:
    """Virtual pipeline chunks in a legacy state dict: `model` = 1, `model0..modelN` = N+1 (generate_state_dict)."""
    if not state:
        return 0
    if "model" in state:
        return 1
    return sum(1 for k in state if isinstance(k, str) and re.fullmatch(r"model\d+", k))


def _shard_grid(shard_files: dict[str, list[str]], args: dict[str, Any] | None) -> dict[str, int]:
    parsed = [s for s in (parse_shard_dir(n) for n in shard_files) if s is not None]
    if not parsed:
        return {}
    pp_arg = arg_int(args, "pipeline_model_parallel_size") or 1
    ep_arg = arg_int(args, "expert_model_parallel_size") or 1
    coords = [shard_coords(s, pp_arg, ep_arg) for s in parsed]
    return {
        "shard_tp": max(c[0] for c in coords) + 1,
        "shard_pp": max(c[1] for c in coords) + 1,
        "shard_ep": max(c[2] for c in coords) + 1,
        "shard_dirs": len(parsed),
    }


def _generation(state: dict[str, Any] | None) -> str:
    version = state.get("checkpoint_version") if state else None
    return f"megatron legacy torch (checkpoint_version {version})" if version is not None else "megatron legacy torch"


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip archive starts with a local file header


def with_save_in_progress(ckpt: Checkpoint, path: Path, megatron_context: bool) -> Checkpoint:
    """`ckpt` (read from the legacy iteration dir `path`) marked as a save being written when the age rule says so
    (`inflight.legacy_save_age`: an untracked Megatron iteration whose newest file is within the grace): a shard
    file cut short (what `torch.save` has written so far: empty, or the start of a zip archive) is then CK132
    with the age rule's verdict, not CK206; the legacy check reports the missing shard dirs and files as CK132 too.
    Anything else — a stale dir, the tracked iteration, a file no `torch.save` begins — is left as read."""
    from dataclasses import replace

    from ckptinspect.formats.inflight import legacy_save_age

    if ckpt.format is not Format.TORCH or not path.is_dir():
        return ckpt
    age = legacy_save_age(path, megatron_context)
    if age is None or age.in_progress is not True:
        return ckpt
    found: list[Finding] = []
    for f in ckpt.findings:
        if f.code == "CK206" and f.subject is not None and _being_written(path, f.subject):
            found.append(Finding("CK132", f"{f.subject}: being written ({age.describe()}): a torch.save archive cut "
                                 "short, the legacy save has not finished", f.subject, f.path,
                                 {"read_error": f.message, **age.to_dict()}))
        else:
            found.append(f)
    return replace(ckpt, findings=tuple(found), save_in_progress=True)


def _being_written(path: Path, rel: str) -> bool:
    """Whether `rel` is a shard file (`mp_rank_*/<name>.pt`) holding what a `torch.save` in progress would have
    written: nothing yet, or the first bytes of its zip archive. Never an object: an upload appears whole, so a
    short object is damage (CK206) however recent."""
    from ckptinspect.io.local import open_regular
    from ckptinspect.io.objpath import ObjectPath

    if isinstance(path, ObjectPath):
        return False

    parts = rel.split("/")
    if len(parts) != 2 or parse_shard_dir(parts[0]) is None or not parts[1].endswith(".pt"):
        return False
    try:
        with open_regular(path / rel) as f:
            head = f.read(len(_ZIP_MAGIC))
    except OSError:
        return False
    return _ZIP_MAGIC.startswith(head)  # b"" (just created) or a prefix of the magic, or the whole magic
