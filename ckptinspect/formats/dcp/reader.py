"""Reader for DCP checkpoint dirs: plain PyTorch DCP (`torch_dcp`, `fsdp_dtensor`) and the DCP part of torch_dist.

`read_dcp_dir` returns the `.metadata` content plus the dir's files and the findings of reading it; the torch_dist
reader (`torch_dist.py`) builds on it and adds the Megatron common state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckptinspect.errors import ReadError, read_code
from ckptinspect.findings import Finding
from ckptinspect.formats.files import list_files, pickle_findings
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.formats.dcp.hf import hf_layout, read_hf
from ckptinspect.formats.dcp.metadata import DcpMetadata
from ckptinspect.formats.dcp.ranks import rank_files, read_rank_metadata
from ckptinspect.formats.dcp.stream import SeenMetadata, read_metadata
from ckptinspect.model import Checkpoint, FileInfo, Format, Topology
from ckptinspect.model.chunk_table import ChunkTable

METADATA = ".metadata"


@dataclass(frozen=True, slots=True)
class DcpDir:
    """A DCP dir as read: its files, its parsed `.metadata` (None when absent/unreadable), reading findings."""

    files: tuple[FileInfo, ...]
    metadata: DcpMetadata | None
    findings: tuple[Finding, ...]
    rank_metadata: tuple[str, ...] = ()  # the `__R.metadata` files merged when there is no `.metadata`


def read_dcp_dir(path: Path, label: str, seen: SeenMetadata | None = None) -> DcpDir:
    """Read `path/.metadata` (if any) and list the files. Never raises for a broken checkpoint. `seen`: what the
    sniff of this read parsed already (`stream.SeenMetadata`)."""
    files = list_files(path)
    findings: list[Finding] = []
    md: DcpMetadata | None = None
    mpath = path / METADATA
    if mpath.exists() or mpath.is_symlink():
        report = PickleReport()
        try:
            # the sniff may have read it already: `seen` hands over what it kept
            md = read_metadata(mpath, report, seen=seen)
        except OSError as e:
            findings.append(Finding(read_code(e, "CK106"), f".metadata unreadable: {e.strerror or e}", METADATA, label))
        except ReadError as e:
            findings.append(Finding(e.code, f".metadata: {e}", METADATA, label))
        # Also after a failed parse: the pickle may have referenced dangerous globals before failing.
        findings.extend(pickle_findings(report, METADATA, label))
    else:
        # `dcp.load` reads `.metadata` first and each rank's `__R.metadata` only without one (`ranks.py`)
        rf = rank_files(path)
        if rf.metadata:
            md, more = read_rank_metadata(path, rf, label)
            if rf.missing:
                # an unfinished save (the sniff's CK102 / CK103 names the ranks): like a save without `.metadata`,
                # its tensors are not checked (the missing ranks' chunks would read as gaps, their files as stale)
                md = None
            return DcpDir(files, md, tuple(more), tuple(rf.metadata.values()))
    return DcpDir(files, md, tuple(findings))


def read_dcp(path: Path, label: str, seen: SeenMetadata | None = None, *,
             fmt: Format = Format.TORCH_DCP) -> Checkpoint:
    """Read a plain PyTorch DCP checkpoint dir (torchtitan `step-N/`, fsdp_dtensor), or the Hugging Face storage
    writer's safetensors (`hf.py`). `seen`: as for `read_dcp_dir`."""
    if not (path / METADATA).exists() and not rank_files(path).metadata and hf_layout(path) is not None:
        return read_hf(path, label)
    d = read_dcp_dir(path, label, seen)
    md = d.metadata
    extra: dict[str, object] = {}
    world = None
    if md is not None:
        extra["metadata_root"] = md.root_class
        extra["planner_keys"] = md.planner_keys
        if md.unknown_attrs:
            extra["unknown_metadata_attrs"] = list(md.unknown_attrs)
        if d.rank_metadata:
            extra["rank_metadata"] = list(d.rank_metadata)
        world = _world_from_files(d.files)
    return Checkpoint(
        path=label,
        format=fmt,
        generation="torch.distributed.checkpoint" + (f" (metadata version {md.version})" if md and md.version else "")
        + (f", per-rank metadata of {len(d.rank_metadata)} rank(s) (use_collectives=False)" if d.rank_metadata else ""),
        iteration=_iteration_from_name(path.name),
        objects=md.objects if md else (),
        files=d.files,
        topology=Topology(world_size=world, sources={"world_size": "data file names"} if world else {}),
        rank_items=md.rank_items if md else (),
        findings=d.findings,
        extra=extra,
        table=md.table if md else ChunkTable.empty(),
        rank_metadata=d.rank_metadata,
    )


def _world_from_files(files: tuple[FileInfo, ...]) -> int | None:
    """Plain DCP names files `__{rank}_{i}.distcp` (torch `prepare_global_plan`), one per rank at least."""
    ranks = set()
    for f in files:
        if f.name.startswith("__") and f.name.endswith(".distcp"):
            head = f.name[2:].split("_", 1)[0]
            if head.isdigit():
                ranks.add(int(head))
    return max(ranks) + 1 if ranks else None


def _iteration_from_name(name: str) -> int | None:
    for prefix in ("iter_", "step-", "step_", "global_step"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return None
