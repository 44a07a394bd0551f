"""Reader for NVRx local (non-persistent) checkpoints: one `torch.save` pickle per rank on node-local storage.

Layout (nvidia-resiliency-ext `checkpointing/local/ckpt_managers/local_manager.py`, 0.4.x):
`{root}/{session_id}/{rank}/iter_{iteration:07d}_{rank}_local.pt` (session '' by default, as Megatron uses it), written
as `…_local.dirty.pt` with an exclusive open and renamed when complete. With replication a rank dir also holds other
ranks' files (`iter_N_{other}_local.pt`). `BaseCheckpointManager.find_latest` (`base_manager.py`) treats an iteration
as complete only when every rank's file exists somewhere. The payload is Megatron's `MCoreTensorAwareStateDict`
(`common` = the common state with `args`, `sharded_state_dict`, tensors popped) which users load with
`torch.load(weights_only=False)`: every file goes through the allowlisting unpickler here.

Tensors: each file's `sharded_state_dict` holds Megatron `ShardedTensor`s whose `data` is the rank's local tensor,
or None where the save's deduplication left that replica's bytes to another rank (`MCoreTensorAwareStateDict`
spreads the replicas' data over the replica group: in the 2-rank sample rank 0 holds layer 0, rank 1 layer 1 with
`replica_id` (0, 0, 1) — so which copy holds the bytes is the data, not the replica id). Each `ShardedTensor` with
data is a chunk of the global tensor `key` at `global_offset`, sized `local_shape` with `prepend_axis_num` leading
axes of size 1 (as `torch_dist` stores it), its bytes the local tensor's view in the file's storage record; a box
held twice counts once. So `values`, `coverage`, `diff` read an NVRx iteration like any global format. An
iteration missing a rank's complete file (CK512; NVRx's `find_latest` skips it) gets no tensors. A tensor with `flattened_range` (a slice of the flattened local shard, Megatron
0.8–0.15's DistributedOptimizer state) is not placed; `extra["unplaced_tensors"]` counts them.

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
from ckptinspect.model import Checkpoint, Chunk, FileInfo, FileRole, Format, StoredItem, dtype_size
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.pickling.builders import TensorRef
from ckptinspect.pickling.plain import to_plain
from ckptinspect.pickling.torch_archive import TorchArchive, read_torch_file
from ckptinspect.pickling.unpickle import MAX_NESTING, Obj
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
    placed: dict[str, TensorEntry] = {}
    unplaced = 0
    owners_read: set[int] = set()
    # one file per owner for the tensors: its own rank dir's before a replica's (NVRx replication copies files)
    for f in sorted(mine, key=lambda x: x.holder != str(x.owner)):
        size = regular_size(root.path / f.rel)
        files.append(FileInfo(f.rel, size, FileRole.LOCAL_DIRTY if f.dirty else FileRole.LOCAL))
        if f.dirty:
            findings.append(Finding("CK513", f"{f.rel}: NVRx local save still being written or crashed (.dirty file "
                                    "never renamed)", f.rel, label, {"rank": f.owner}))
        got = _read_one(root.path / f.rel, f.rel, label, findings)
        if got is None:
            continue
        state, archive = got
        if common is None and not f.dirty and state is not None:
            common = state
        if not f.dirty and f.owner not in owners_read:
            owners_read.add(f.owner)
            unplaced += _place(archive, f.rel, placed)
    world = root.world_size
    have = {f.owner for f in mine if not f.dirty}
    if len(have) < world:
        # NVRx's own rule: an iteration without every rank's complete file is not complete (find_latest skips it),
        # so its chunks are not placed: the gaps would only restate the missing ranks (CK512) as corruption
        placed, unplaced = {}, 0
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
        iteration=iteration, files=tuple(files), args=args, table=ChunkTable.of(placed.values()),
        common={k: v for k, v in common.items() if k != "args"} if isinstance(common, dict) else None,
        topology=topology, findings=tuple(findings),
        extra={"stack": "nvrx-local", "layout": layout, "rank_dirs": list(root.rank_dirs), "replicas": replicas,
               "unplaced_tensors": unplaced,
               "evidence": [f"NVRx local files iter_{iteration:07d}_<rank>_local.pt in {len(root.rank_dirs)} "
                            "rank dir(s)"]},
    )


def _read_one(path: Path, rel: str, label: str, findings: list[Finding]
              ) -> tuple[dict[str, Any] | None, TorchArchive] | None:
    """The file's common state (None when unreadable as plain data) and its archive; None when it cannot be read or
    would run code."""
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
        return None, archive
    return (plain if isinstance(plain, dict) else None), archive


@dataclass(frozen=True, slots=True)
class Placed:
    """One `ShardedTensor` with data of a local file: the global tensor, the chunk's box, its local view."""

    key: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    ref: TensorRef


def sharded_tensors(obj: Any) -> tuple[list[Placed], int]:
    """The `ShardedTensor`s with data in a local file's payload (`obj`: the unpickled stand-in), and
    how many others with data could not be placed (a `flattened_range`, or fields out of shape). Iterative and
    bounded in depth: a hostile nesting is not followed past `MAX_NESTING`."""
    root = getattr(obj, "__dict__", {}).get("sharded_state_dict") if isinstance(obj, Obj) else None
    out: list[Placed] = []
    unplaced = 0
    stack: list[tuple[Any, int]] = [(root, 0)]
    seen: set[int] = set()
    while stack:
        x, depth = stack.pop()
        if depth > MAX_NESTING or id(x) in seen:
            continue
        if isinstance(x, dict):
            seen.add(id(x))
            stack.extend((v, depth + 1) for v in reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            seen.add(id(x))
            stack.extend((v, depth + 1) for v in reversed(x))
        elif isinstance(x, Obj) and x.qualname.endswith("ShardedTensor"):
            d = x.__dict__
            ref = d.get("data")
            if not isinstance(ref, TensorRef):
                continue
            p = _placed(d, ref)
            if p is None:
                unplaced += 1
            else:
                out.append(p)
    return out, unplaced


def _ints(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        return tuple(v)
    return None


def _placed(d: dict[str, Any], ref: TensorRef) -> Placed | None:
    key, shape, offsets, local = d.get("key"), _ints(d.get("global_shape")), _ints(d.get("global_offset")), \
        _ints(d.get("local_shape"))
    prepend = d.get("prepend_axis_num", 0)
    if d.get("flattened_range") is not None or not isinstance(key, str) or None in (shape, offsets, local) \
            or not isinstance(prepend, int) or prepend < 0:
        return None
    assert shape is not None and offsets is not None and local is not None
    sizes = (1,) * prepend + local
    if tuple(ref.shape) != local or not (len(sizes) == len(offsets) == len(shape)):
        return None
    return Placed(key, shape, offsets, sizes, ref)


def _place(archive: TorchArchive, rel: str, placed: dict[str, TensorEntry]) -> int:
    """Add the file's chunks to `placed` (by global key, a box once); the count of tensors not placed."""
    found, unplaced = sharded_tensors(archive.obj)
    for p in found:
        item = dtype_size(p.ref.dtype) or 0
        rec = archive.records.get(f"data/{p.ref.storage_key}")
        stored = (StoredItem(rel, rec.data_offset + p.ref.storage_offset * item, p.ref.nbytes)
                  if rec is not None and rec.data_offset >= 0 else None)
        entry = placed.get(p.key)
        if entry is None:
            placed[p.key] = TensorEntry(p.key, p.global_shape, p.ref.dtype, [Chunk(p.offsets, p.sizes, stored)])
        elif entry.shape == p.global_shape and entry.dtype == p.ref.dtype:
            if not any(c.offsets == p.offsets and c.sizes == p.sizes for c in entry.chunks):
                list.append(entry.chunks, Chunk(p.offsets, p.sizes, stored))  # type: ignore[arg-type]
        else:
            unplaced += 1  # one key, two global shapes or dtypes across ranks: not placed (the load would fail)
    return unplaced
