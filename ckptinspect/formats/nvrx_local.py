"""Reader for NVRx local (non-persistent) checkpoints: one `torch.save` pickle per rank on node-local storage.

Layout (nvidia-resiliency-ext `checkpointing/local/ckpt_managers/local_manager.py`, 0.4.x):
`{root}/{session_id}/{rank}/iter_{iteration:07d}_{rank}_local.pt` (session '' by default, as Megatron uses it), written
as `…_local.dirty.pt` with an exclusive open and renamed when complete. With replication a rank dir also holds other
ranks' files (`iter_N_{other}_local.pt`). `BaseCheckpointManager.find_latest` (`base_manager.py`) treats an iteration
as complete only when every rank's file exists somewhere. The payload is Megatron's `MCoreTensorAwareStateDict`
(`common` = the common state with `args`, `sharded_state_dict`, tensors popped) which users load with
`torch.load(weights_only=False)`: every file goes through the allowlisting unpickler here.

An iteration has no dir of its own: it is addressed as the virtual path `{root}/iter_{N:07d}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import pickle_findings, regular_size
from ckptinspect.formats.topology import topology_from
from ckptinspect.model import Checkpoint, FileInfo, FileRole, Format
from ckptinspect.pickling.plain import to_plain
from ckptinspect.pickling.torch_archive import read_torch_file
from ckptinspect.io.local import note_unread

LOCAL_FILE = re.compile(r"^iter_(\d+)_(\d+)_local(\.dirty)?\.pt$")
VIRTUAL = re.compile(r"^iter_(\d+)$")
MAX_RANK_DIRS = 1 << 16


@dataclass(frozen=True, slots=True)
class LocalFile:
    """One `iter_N_R_local[.dirty].pt` file: where it is (rank dir name / file name), whose it is, dirty or not."""

    rel: str
    iteration: int
    owner: int
    holder: str
    dirty: bool


@dataclass(frozen=True, slots=True)
class LocalRoot:
    """An NVRx local checkpoint dir (a session dir): its numeric rank dirs and every local file found in them."""

    path: Path
    rank_dirs: tuple[str, ...]
    files: tuple[LocalFile, ...]

    @property
    def iterations(self) -> tuple[int, ...]:
        return tuple(sorted({f.iteration for f in self.files}))

    @property
    def world_size(self) -> int:
        ranks = [int(d) for d in self.rank_dirs] + [f.owner for f in self.files]
        return max(ranks) + 1 if ranks else 0


def find_local_root(path: Path) -> LocalRoot | None:
    """The NVRx root at `path` (numeric rank dirs holding `iter_*_local*.pt` files), or None."""
    try:
        if not path.is_dir():
            return None
        subdirs = sorted((p for p in path.iterdir() if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name))
    except OSError:
        return None
    files: list[LocalFile] = []
    for d in subdirs[:MAX_RANK_DIRS]:
        try:
            names = sorted(n.name for n in d.iterdir())
        except OSError as e:
            note_unread(d, e, "list")  # CK209 for the rank dir (its files are not known to be missing)
            continue
        for n in names:
            m = LOCAL_FILE.match(n)
            if m:
                files.append(LocalFile(f"{d.name}/{n}", int(m.group(1)), int(m.group(2)), d.name, bool(m.group(3))))
    if not files:
        return None
    return LocalRoot(path, tuple(d.name for d in subdirs), tuple(files))


def virtual_iteration(path: Path) -> tuple[LocalRoot, int] | None:
    """`{root}/iter_{N}` → (root, N) when `root` is an NVRx dir and no such real path exists."""
    m = VIRTUAL.match(path.name)
    if m is None or path.exists() or path.is_symlink():
        return None
    root = find_local_root(path.parent)
    return (root, int(m.group(1))) if root is not None else None


def read_nvrx_local(root: LocalRoot, iteration: int, label: str) -> Checkpoint:
    """Read one iteration: every rank's file (own or replica), `.dirty` leftovers, each pickle scanned."""
    mine = [f for f in root.files if f.iteration == iteration]
    findings: list[Finding] = []
    files: list[FileInfo] = []
    common: dict[str, Any] | None = None
    for f in mine:
        size = regular_size(root.path / f.rel)
        files.append(FileInfo(f.rel, size, FileRole.LOCAL_DIRTY if f.dirty else FileRole.LOCAL))
        if f.dirty:
            findings.append(Finding("CK513", f"{f.rel}: NVRx local save still being written or crashed (.dirty file "
                                    "never renamed)", f.rel, label, {"rank": f.owner}))
        got = _read_one(root.path / f.rel, f.rel, label, findings)
        if common is None and not f.dirty and got is not None:
            common = got
    world = root.world_size
    have = {f.owner for f in mine if not f.dirty}
    for r in range(world):
        if r not in have:
            findings.append(Finding("CK512", f"iteration {iteration}: no complete file of rank {r} in any rank dir "
                                    f"(iter_{iteration:07d}_{r}_local.pt); NVRx find_latest skips this iteration",
                                    f"iter_{iteration:07d}_{r}_local.pt", label, {"rank": r, "world_size": world}))
    args = common.get("args") if isinstance(common, dict) else None
    args = args if isinstance(args, dict) else None
    topology, layout = topology_from(args, None)
    if topology.world_size is None:
        from dataclasses import replace

        topology = replace(topology, world_size=world, sources={**topology.sources, "world_size": "rank dirs"})
    replicas = sorted(f.rel for f in mine if f.holder != str(f.owner))
    return Checkpoint(
        path=label, data_dir=str(root.path), format=Format.NVRX_LOCAL,
        generation="nvidia-resiliency-ext LocalCheckpointManager",
        iteration=iteration, files=tuple(files), args=args,
        common={k: v for k, v in common.items() if k != "args"} if isinstance(common, dict) else None,
        topology=topology, findings=tuple(findings),
        extra={"stack": "nvrx-local", "layout": layout, "rank_dirs": list(root.rank_dirs), "replicas": replicas,
               "evidence": [f"NVRx local files iter_{iteration:07d}_<rank>_local.pt in {len(root.rank_dirs)} "
                            "rank dir(s)"]},
    )


def _read_one(path: Path, rel: str, label: str, findings: list[Finding]) -> dict[str, Any] | None:
    try:
        archive = read_torch_file(path)
    except ReadError as e:
        findings.append(Finding(e.code, f"{rel}: {e}", rel, label))
        return None
    except OSError as e:
        findings.append(Finding("CK206", f"{rel}: unreadable ({e.strerror or e})", rel, label))
        return None
    findings.extend(pickle_findings(archive.report, rel, label))
    if archive.report.dangerous:
        return None
    state = getattr(archive.obj, "__dict__", None)
    raw = state.get("common") if isinstance(state, dict) else None
    try:
        plain = to_plain(raw)
    except ReadError as e:
        findings.append(Finding(e.code, f"{rel}: {e}", rel, label))
        return None
    return plain if isinstance(plain, dict) else None
