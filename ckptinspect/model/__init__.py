"""The neutral checkpoint model every reader builds and every check consumes (this module), the `ChunkTable` that
holds every chunk as numpy columns (`chunk_table.py`), and which component (model / optimizer / rng / other) an item
key belongs to (`components.py`).

Frozen, slotted dataclasses of plain Python types (tuples of ints, dtype names as `str`). Readers translate their
format's objects into these at their boundary; nothing here knows about pickles, torch or Megatron classes.

Modules: this one (formats, enums, `StoredItem`, `Chunk`, `Tensor`, `ObjectItem`, `FileInfo`, `Topology`,
`Checkpoint`); `chunk_table.py` (`ChunkTable`, the one store of every chunk of a checkpoint, as columns:
`Checkpoint.tensors` are its `Tensor` views and each `Tensor.chunks` a read-only view of its rows); `dataloader.py`
(`DataloaderState`, `Checkpoint.dataloader`: a stack's per-DP-rank dataloader state).
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from ckptinspect.findings import Finding
from ckptinspect.model.dataloader import DataloaderState as DataloaderState  # re-exported

if TYPE_CHECKING:
    from ckptinspect.model.chunk_table import ChunkTable, TableChunks


class StrEnum(str, enum.Enum):
    """A closed set whose members read as their string values wherever text is made — `str()`, f-strings, JSON
    (`json.dumps` writes the value), comparisons with a plain string — like `enum.StrEnum`, which Python 3.10 lacks.
    Turning a closed set of strings into one of these changes no output."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Format(enum.Enum):
    """On-disk checkpoint formats (names as Megatron's `--ckpt-format` spells them)."""

    TORCH_DIST = "torch_dist"
    TORCH = "torch"  # legacy per-rank mp_rank_* files
    TORCH_DCP = "torch_dcp"
    FSDP_DTENSOR = "fsdp_dtensor"
    NVRX_LOCAL = "nvrx_local"  # Megatron `--non-persistent-ckpt-type local`: NVRx per-rank `*_local.pt` files
    SAFETENSORS = "safetensors"  # Hugging Face safetensors files / sharded sets (a release artifact, not a save)


class ShardedBackend(StrEnum):
    """Megatron-Core's `metadata.json` `sharded_backend`: how a torch_dist save stored its tensors."""

    TORCH_DIST = "torch_dist"
    ZARR = "zarr"  # megatron-core <=0.15: one zarr array dir per tensor key, no .metadata
    FSDP_DTENSOR = "fsdp_dtensor"


class Stack(enum.Enum):
    """The training stack that wrote a checkpoint around (or instead of) a Megatron / DCP payload."""

    MEGATRON_BRIDGE = "megatron-bridge"
    NEMO2 = "nemo2"
    TORCHTITAN = "torchtitan"
    MEGATRON_FSDP = "megatron-fsdp"
    NVRX_LOCAL = "nvrx-local"
    MEGATRON_NON_PERSISTENT = "megatron-non-persistent"


class Kind(enum.Enum):
    """What a path given by the user is."""

    SAVE_DIR = "save_dir"
    CHECKPOINT = "checkpoint"


# Element sizes (torch's `dtype.itemsize`) of every dtype torch 2.13 defines, by the short name used throughout the
# model ("float32", "bfloat16"). Sub-byte types are stored one element per byte (`uint1`..`uint7`, `int1`..`int7`,
# `bits1x8`, ...) or two per byte in one element (`float4_e2m1fn_x2`, `quint4x2`): itemsize 1 either way, which is
# what DCP multiplies `numel` by for a stored chunk.
DTYPE_SIZES: Mapping[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"uint{i}": 1 for i in range(1, 8)}, **{f"int{i}": 1 for i in range(1, 8)},
}


def dtype_size(dtype: str) -> int | None:
    """Bytes per element of `dtype`, or None when unknown."""
    return DTYPE_SIZES.get(dtype)


def numel(shape: tuple[int, ...]) -> int:
    """Number of elements of `shape` (1 for a 0-dim tensor)."""
    return math.prod(shape)


@dataclass(frozen=True, slots=True)
class StoredItem:
    """Where one item's bytes live.

    file: path relative to the checkpoint dir (e.g. ``__0_0.distcp``).
    offset: first byte inside `file`.
    length: number of bytes.
    transforms: stream transforms to undo before reading (DCP `transform_descriptors`, e.g. ``stream.zstd/1``).
    """

    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class Chunk:
    """One stored piece of a tensor.

    offsets: position of the chunk in the tensor's global index space.
    sizes: extent of the chunk along each axis.
    storage: its stored bytes, or None when the metadata has no storage entry for it (CK304).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    storage: StoredItem | None


@dataclass(frozen=True, slots=True)
class Tensor:
    """A (global) tensor of the checkpoint.

    key: the name on disk (a DCP fqn, a Megatron ShardedTensor key, or a legacy state-dict path).
    shape: the global shape, as stored (Megatron 0.8–0.15 N-D reformulated tensors keep their on-disk shape).
    dtype: torch dtype name without the ``torch.`` prefix.
    chunks: its stored pieces, a read-only view of its rows in the checkpoint's `ChunkTable` (the one chunk store;
      `chunk_table.TableChunks`: `Chunk`s made on access); for a legacy per-rank file one chunk that is the whole
      local tensor. Tensors are made by `ChunkTable.tensors`, never by a reader.
    shard: for legacy files, the shard dir it came from (``mp_rank_01_000``); None for global formats.
    orig_shape: the original shape of an N-D reformulated tensor (`mcore_data`), else None.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    chunks: TableChunks
    shard: str | None = None
    orig_shape: tuple[int, ...] | None = None

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's payload (numel × element size; 0 when the dtype is unknown)."""
        return self.numel * (dtype_size(self.dtype) or 0)

    @property
    def stored_bytes(self) -> int:
        """Bytes the chunks occupy on disk, archive overhead included."""
        return self.chunks.stored_bytes()

    @property
    def reformulated_local(self) -> tuple[int, ...] | None:
        """For an N-D reformulated tensor (Megatron-Core 0.8-0.15 flattened DistOpt state, `mcore_data`), stored as
        (*grid, local numel): the shape of one grid cell in the original tensor, so that original axis i is
        grid[i] blocks of local[i]. None when the tensor is not reformulated or the shapes do not fit together."""
        orig = self.orig_shape
        if orig is None or len(self.shape) != len(orig) + 1:
            return None
        grid = self.shape[:-1]
        if any(g < 1 or o % g for g, o in zip(grid, orig)):
            return None
        local = tuple(o // g for o, g in zip(orig, grid))
        return local if math.prod(local) == self.shape[-1] else None


@dataclass(frozen=True, slots=True)
class ObjectItem:
    """A byte item (pickled object) of the checkpoint.

    key: the full name on disk (``rng_state/shard_0.1_2.2``).
    family: the ShardedObject key before ``/shard_`` (``rng_state``), or `key` for plain byte items.
    offset / grid: parsed from ``shard_<offsets>_<shape>``; None for plain byte items.
    storage: where its bytes are, or None when missing.
    """

    key: str
    family: str
    offset: tuple[int, ...] | None
    grid: tuple[int, ...] | None
    storage: StoredItem | None


class FileRole(enum.Enum):
    """What a file of a checkpoint dir is (`FileInfo.role`; the JSON says its value)."""

    DATA = "data"  # *.distcp
    METADATA = "metadata"  # .metadata, .metadata.tmp, metadata.json
    COMMON = "common"  # common.pt
    MANIFEST = "manifest"  # integrity.json
    MODEL = "model"  # model_optim_rng.pt
    OPTIMIZER = "optimizer"  # distrib_optim.pt
    LOCAL = "local"  # NVRx local checkpoint file (iter_N_R_local.pt)
    LOCAL_DIRTY = "local-dirty"  # NVRx local file still being written (.dirty)
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A file of the checkpoint dir.

    name: path relative to the checkpoint dir.
    size: bytes on disk, or None when it is named by metadata but missing / not a regular file.
    role: what it is.
    """

    name: str
    size: int | None
    role: FileRole


@dataclass(frozen=True, slots=True)
class Topology:
    """Parallel layout of the save; None where unknown. `sources` says where each number came from.

    dp excludes CP (Megatron's `data_parallel_size`); the DistributedOptimizer shards over DP × CP.
    etp: expert tensor parallel size (None without experts). vpp: virtual pipeline stages per PP rank (1 = none).
    """

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    world_size: int | None = None
    sources: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    cp: int | None = None
    etp: int | None = None
    vpp: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", frozen(self.sources))

    def to_dict(self) -> dict[str, int | None]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "world_size": self.world_size,
                "cp": self.cp, "etp": self.etp, "vpp": self.vpp}


K = TypeVar("K")
V = TypeVar("V")


def frozen(d: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only view of a copy of `d`, for the mappings inside frozen results (`d` itself when it is already one
    of these views: a value is copied once, where it is built, not again at every `dataclasses.replace`)."""
    return d if isinstance(d, MappingProxyType) else MappingProxyType(dict(d))


def frozen2(d: Mapping[K, Mapping[str, V]]) -> Mapping[K, Mapping[str, V]]:
    """`frozen`, and each value too (a mapping of mappings)."""
    return d if isinstance(d, MappingProxyType) else MappingProxyType({k: frozen(v) for k, v in d.items()})


@functools.cache
def _empty_table() -> ChunkTable:
    """The table of a checkpoint without tensors (one, shared: a table is never changed)."""
    from ckptinspect.model.chunk_table import ChunkTable

    return ChunkTable.empty()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint (an ``iter_*`` dir, a DCP ``step-*`` dir, a legacy iteration dir).

    path: the dir, as given.
    data_dir: where its data lives, as a location like `path` (local path or URL, `storage.location` reads it):
        the dir that `files` names, `StoredItem.file` and the integrity manifest (`integrity.json`) are relative to.
        Set by the reader that knows it; `path` itself (the default) when the files are in the checkpoint dir.
        NeMo 2 keeps its payload in ``<ckpt>/weights/``; an NVRx iteration's files are in the rank dirs of its
        root; a single legacy `.pt` file's dir is its parent. Checks and services open data through it only.
    format: its format, or None when unrecognized.
    generation: producer generation, e.g. ``megatron-core<=0.18 (common.pt)``; None when unknown.
    iteration: from the common state / dir name, or None.
    tensors: the tensors, made by `table` (a property: `table` is the one store).
    objects / files: the content.
    args: the training args as a plain dict (Megatron's `argparse.Namespace`), or None.
    common: the rest of the common state, plain data (``iteration``, ``content_metadata``, ...), or None.
    topology: TP/PP/DP/CP/EP/ETP/VPP/world size.
    optimizer_sharding: DistributedOptimizer ``distrib_optim_sharding_type`` (or inferred), None without one.
    rank_items: per save-time rank, how many items it wrote (Megatron's `all_local_plans`), () when unknown.
    findings: what the reader itself found (unreadable files, unsafe pickles, half-written state).
    layout: on-disk witnesses of the parallel layout the checks compare with the args: ``rng_tp`` / ``rng_pp``
        (rng_state grid), ``plans_world`` (all_local_plans), ``rerun_world``, ``shard_tp`` / ``shard_pp``
        (legacy mp_rank_* dirs); only the ones the checkpoint shows.
    shard_files: legacy: the files of each ``mp_rank_*`` dir (by dir name); empty for other formats.
    shard_args: legacy: the args each shard's ``model_optim_rng.pt`` holds (by dir name).
    reformulated: torch_dist 0.8-0.15: keys of N-D reformulated tensors (Megatron's ``mcore_data``).
    sharded_backend: torch_dist: `metadata.json`'s ``sharded_backend`` (zarr saves are read and resumed differently);
        None for other formats or without a readable `metadata.json`.
    extra: other format-specific facts, for display only (``metadata_json``, ``planner_keys``, ...): no check
        and no prediction reads it.
    All mappings are read-only (`types.MappingProxyType`): the model is built once and never changed; a reader or
    stack that adds a fact builds a new checkpoint (`dataclasses.replace`) from a copy.
    table: every tensor and chunk as columns (`ChunkTable`; `tensors[t].chunks` are views of its rows), so checks
      run vectorised over millions of chunks; every reader fills it (legacy: one row per tensor), empty without
      tensors.
    rank_metadata: DCP per-rank metadata (`dcp.save(..., use_collectives=False)`): the `__R.metadata` files read and
      merged (`formats/dcp/ranks.py`); every rank loads its own, so chunks several ranks wrote at the same place are
      replicas, not overlaps. Empty for a checkpoint with one `.metadata`.
    save_in_progress: the reader found a save being written here (a legacy `mp_rank_*` iteration the tracker does not
      name, whose newest file is within the age rule's grace, `formats/inflight.py`): what is missing or cut is the
      write in progress, so the checks report it as CK132 (incomplete), not as damage.
    dataloader: the per-DP-rank dataloader state its stack saved with it (Bridge `energon/`, torchtitan
      `dataloader.dp_rank_*`), None when the stack saved none (or none is known); `resume` reads it.
    raw_tensor_items: tensor chunks are raw element bytes (DCP's Hugging Face storage writer: safetensors data), not
      torch archives: `--deep` checks their place and length only, and there is no pickle in them to scan.
    """

    path: str
    format: Format | None
    generation: str | None = None
    iteration: int | None = None
    objects: tuple[ObjectItem, ...] = ()
    files: tuple[FileInfo, ...] = ()
    args: Mapping[str, Any] | None = None
    common: Mapping[str, Any] | None = None
    topology: Topology = field(default_factory=Topology)
    optimizer_sharding: str | None = None
    rank_items: tuple[int, ...] = ()
    findings: tuple[Finding, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: frozen({}))
    layout: Mapping[str, int] = field(default_factory=lambda: frozen({}))
    shard_files: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: frozen({}))
    shard_args: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: frozen({}))
    reformulated: tuple[str, ...] = ()
    table: ChunkTable = field(default_factory=_empty_table)
    sharded_backend: ShardedBackend | None = None
    rank_metadata: tuple[str, ...] = ()
    raw_tensor_items: bool = False
    data_dir: str = ""
    save_in_progress: bool = False
    dataloader: DataloaderState | None = None

    def __post_init__(self) -> None:
        # Readers hand over plain dicts; the model keeps read-only copies (made once: `frozen` keeps its own views).
        set_ = object.__setattr__
        if not self.data_dir:
            set_(self, "data_dir", self.path)
        if self.args is not None:
            set_(self, "args", frozen(self.args))
        if self.common is not None:
            set_(self, "common", frozen(self.common))
        set_(self, "extra", frozen(self.extra))
        set_(self, "layout", frozen(self.layout))
        set_(self, "shard_files", frozen(self.shard_files))
        set_(self, "shard_args", frozen2(self.shard_args))

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return self.table.tensors

    @property
    def data_bytes(self) -> int:
        """Total bytes of the files on disk."""
        return sum(f.size or 0 for f in self.files)
