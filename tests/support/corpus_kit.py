"""The acceptance corpus kit: sources, builders and mutation helpers shared by the case families.

The acceptance corpus: broken, half-written, hostile and healthy checkpoints, built at test time.

Every case copies a real checkpoint (the `sample_ckpts/` written by megatron-core 0.16.1 / torch DCP, or the
Megatron-Core 0.19.2 fixture) into a scratch dir and applies ONE mutation that mimics a real failure: a crash
during the save (reference §8.2), a lost or truncated file, a damaged `.metadata` (edited with torch's own DCP
classes), a tampered manifest, a hostile pickle. It declares what `ckptinspect audit` must say about it: the
status, the codes that must appear, the codes that must not, which path to audit and with which flags.

The cases live one module per check family (`corpus_<family>.py`); `tests/support/corpus.py` gathers them into `CASES`.
`tests/acceptance/test_acceptance.py` runs the CLI over `CASES` (case name = test id). Builders never touch the sources.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import io
import os
import pickle
import shlex
import shutil
import stat
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import FIXTURE_0192, SAMPLES

VALUES = SAMPLES.parent / "tests" / "data" / "values_ckpts"

# --- sources -----------------------------------------------------------------------------------------------------

# name -> (root to copy, files that must exist for the source to count as present)
SOURCES: dict[str, tuple[Path, tuple[str, ...]]] = {
    "torch_dist": (SAMPLES / "torch_dist", ("latest_checkpointed_iteration.txt", "iter_0000001/metadata.json",
                                            "iter_0000002/metadata.json", "iter_0000003/.metadata")),
    "torch_dist_fully": (SAMPLES / "torch_dist_fully", ("latest_checkpointed_iteration.txt",
                                                        "iter_0000001/metadata.json", "iter_0000001/.metadata")),
    "torch_dist_not_fully": (SAMPLES / "torch_dist_not_fully", ("latest_checkpointed_iteration.txt",
                                                                "iter_0000001/metadata.json", "iter_0000001/.metadata")),
    "legacy": (SAMPLES / "legacy", ("latest_checkpointed_iteration.txt",
                                    "iter_0000001/mp_rank_01_001/model_optim_rng.pt")),
    "dcp": (SAMPLES / "dcp", ("step-10/.metadata",)),
    # training stacks (tests/support/corpus_stacks.py)
    "bridge": (SAMPLES / "bridge", ("latest_train_state.pt", "iter_0000002/run_config.yaml")),
    "nemo2": (SAMPLES / "nemo2", ("checkpoints",)),
    "nvrx_local": (SAMPLES / "nvrx_local", ("0/iter_0000002_0_local.pt", "1/iter_0000002_1_local.pt")),
    "torchtitan": (SAMPLES / "torchtitan", ("step-2/.metadata",)),
    "torchtitan_dataloader": (SAMPLES / "torchtitan_dataloader", ("step-2/.metadata",)),
    "megatron_fsdp": (SAMPLES / "megatron_fsdp", ("latest_checkpointed_iteration.txt", "iter_0000001/.metadata")),
    "mcore_0_15_3_zarr": (SAMPLES / "mcore_0_15_3_zarr", ("latest_checkpointed_iteration.txt",
                                                          "iter_0000001/output_layer.weight/.zarray")),
    "mcore-0.19.2": (FIXTURE_0192, ("latest_checkpointed_iteration.txt", "iter_0000400/integrity.json")),
    # Hugging Face safetensors (tests/support/corpus_safetensors.py), written by safetensors.torch.save_file
    "safetensors": (SAMPLES / "safetensors", ("model.safetensors",)),
    "safetensors_sharded": (SAMPLES / "safetensors_sharded", ("model.safetensors.index.json",)),
    # megatron-core 0.16.1 saves with value faults put in before the save (tests/support/corpus_values.py)
    **{f"values_{n}": (VALUES / n, ("latest_checkpointed_iteration.txt", "iter_0000001/.metadata"))
       for n in ("weights", "moments", "desync", "healthy_tp2", "stale_lr0")},
    # another real run of stale_lr0's model (global batch 1), saved at iteration 3 only (tests/support/corpus_lineage.py)
    "values_restart_gbs1": (VALUES / "restart_gbs1", ("latest_checkpointed_iteration.txt", "iter_0000003/.metadata")),
}


def missing_source(name: str) -> str | None:
    """Why source `name` cannot be used (None when it is there)."""
    root, required = SOURCES[name]
    absent = [r for r in required if not (root / r).exists()]
    if absent:
        return f"{root} absent or incomplete (missing {absent[0]}; being regenerated?)"
    return None


@dataclass(frozen=True)
class Ctx:
    """Where a builder works: `work` (empty dir, the tree that is hashed) and `marker` (outside `work`: the file a
    hostile pickle would create if anything executed it)."""

    work: Path
    marker: Path


@dataclass(frozen=True)
class Case:
    """One acceptance case.

    build: makes the case under `ctx.work` and returns the path to audit (save dir, checkpoint dir or file).
    status: the audit status CONTRACT.md implies. codes: must appear. absent: must not appear.
    flags: extra `audit` options. sources: `SOURCES` it copies (skipped when one is missing).
    subprocess: run as a real `python -m ckptinspect` process (hostile pickles always are).
    """

    name: str
    build: Callable[[Ctx], Path]
    status: str
    codes: frozenset[str] = frozenset()
    absent: frozenset[str] = frozenset()
    flags: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    subprocess: bool = False


def copy_source(ctx: Ctx, name: str) -> Path:
    """A writable copy of source `name` under `ctx.work` (the fixture is read-only on disk)."""
    root, _ = SOURCES[name]
    dst = ctx.work / root.name
    shutil.copytree(root, dst, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(dst):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IRWXU)
        for n in filenames:
            p = os.path.join(dirpath, n)
            os.chmod(p, os.stat(p).st_mode | stat.S_IRUSR | stat.S_IWUSR)
    return dst


# --- mutation helpers ----------------------------------------------------------------------------------------------


def truncate(path: Path, keep: float = 0.5) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def read_metadata(ckpt: Path) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return FileSystemReader(str(ckpt)).read_metadata()


def write_metadata(ckpt: Path, md: Any) -> None:
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)


@contextlib.contextmanager
def edit_metadata(ckpt: Path) -> Iterator[Any]:
    """Load `ckpt/.metadata` with torch's classes, let the caller change it, pickle it back."""
    md = read_metadata(ckpt)
    yield md
    write_metadata(ckpt, md)


def storage_keys(md: Any, fqn: str) -> list[Any]:
    return [k for k in md.storage_data if k.fqn == fqn]


def rename_object(md: Any, old: str, new: str) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    md.state_dict_metadata[new] = md.state_dict_metadata.pop(old)
    for k in storage_keys(md, old):
        md.storage_data[MetadataIndex(new, k.offset, k.index)] = md.storage_data.pop(k)


def drop_object(md: Any, key: str) -> None:
    del md.state_dict_metadata[key]
    for k in storage_keys(md, key):
        del md.storage_data[k]


def move_chunk(md: Any, fqn: str, index: int, offsets: tuple[int, ...]) -> None:
    """Move chunk `index` of tensor `fqn` to `offsets`, storage entry included (only the geometry breaks)."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex

    chunk = md.state_dict_metadata[fqn].chunks[index]
    info = md.storage_data.pop(MetadataIndex(fqn, chunk.offsets))
    chunk.offsets = torch.Size(offsets)
    md.storage_data[MetadataIndex(fqn, chunk.offsets)] = info


def items_in(md: Any, file: str, tensors: bool) -> list[tuple[Any, Any]]:
    """(MetadataIndex, _StorageInfo) of the tensor (or byte) items stored in `file`, by offset."""
    found = [(k, v) for k, v in md.storage_data.items()
             if v.relative_path == file and (k.offset is not None) == tensors]
    return sorted(found, key=lambda kv: kv[1].offset)


def append_item(ckpt: Path, md: Any, key: str, payload: bytes) -> None:
    """Store `payload` as byte item `key`: appended to the end of the item's data file, `.metadata` re-pointed."""
    (k, info), = ((k, v) for k, v in md.storage_data.items() if k.fqn == key)
    data = ckpt / info.relative_path
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(payload)
    md.storage_data[k] = dataclasses.replace(info, offset=offset, length=len(payload))


def torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _StandIn:
    """Stands in for a Megatron class while a `.pt` is round-tripped, so re-saving writes the same global."""

    def __new__(cls, *args: Any) -> _StandIn:
        self = object.__new__(cls)
        self.__dict__.update(_args=args, _state=None)
        return self

    def __init__(self, *args: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state

    def __reduce__(self) -> tuple[Any, ...]:  # Megatron's enums pickle as `EnumClass(value)`
        return (type(self), self.__dict__["_args"], self.__dict__["_state"])


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (_StandIn,), {"__module__": self.__name__, "__qualname__": name})
        setattr(self, name, cls)
        return cls


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "megatron" or name.startswith("megatron."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def _megatron_stand_ins() -> Iterator[None]:
    """Importing megatron-core costs ~7 s and is not needed to rewrite a `common.pt`: serve stand-in modules for
    `megatron.*` while the context is open (unless the real package is already imported)."""
    if "megatron" in sys.modules:
        yield
        return
    finder = _StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "megatron" or n.startswith("megatron.")]:
            del sys.modules[name]


def edit_torch_file(path: Path, change: Callable[[Any], object]) -> None:
    """`torch.load` a trusted sample `.pt`, let `change` edit the object in place, `torch.save` it back."""
    import torch

    with _megatron_stand_ins(), _recursion_limit(10_000):
        obj = torch.load(path, map_location="cpu", weights_only=False)
        change(obj)
        torch.save(obj, path)


class Hostile:
    """A pickle payload: unpickling it runs `touch <marker>`. The tool must flag it (CK601) and never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


class CallsTimeit:
    """A pickle payload through a callable no deny list names: `timeit.timeit(stmt, setup, timer, number)` execs
    `stmt`. The tool must flag the call (CK604) and never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import time
        import timeit

        return (timeit.timeit, (f"open({str(self.marker)!r}, 'w').close()", "pass", time.perf_counter, 1))


class Harmless:
    """An object of a class no allowlist knows (pickled as `corpus.Harmless`): kept opaque (CK602)."""


def _nest(depth: int) -> Callable[[dict[str, Any]], None]:
    """Add a list nested `depth` deep (torch's pickler recurses in Python per level: lift the recursion limit)."""

    def change(sd: dict[str, Any]) -> None:
        out: list[Any] = []
        for _ in range(depth):
            out = [out]
        sd["nested"] = out

    return change


@contextlib.contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


# --- builders ------------------------------------------------------------------------------------------------------

ITER2 = "iter_0000002"
RNG_CELL = "rng_state/shard_0.1_2.2"
EMBEDDING = "embedding.word_embeddings.weight"  # (128, 16) in two (64, 16) chunks in the 0.16.1 sample


def td_save(ctx: Ctx) -> Path:
    return copy_source(ctx, "torch_dist")


def td_iter2(ctx: Ctx) -> Path:
    return copy_source(ctx, "torch_dist") / ITER2


def _mutated(base: Callable[[Ctx], Path], mutate: Callable[[Path, Ctx], None],
             audit: Callable[[Path], Path] = lambda p: p) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        path = base(ctx)
        mutate(path, ctx)
        return audit(path)

    return build


def td2(mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    """A mutation of the 0.16.1 sample's complete iter_0000002, audited as a checkpoint."""
    return _mutated(td_iter2, mutate)


def td_dir(mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    """A mutation of the 0.16.1 save dir, audited as a save dir."""
    return _mutated(td_save, mutate)


def dcp(mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    return _mutated(lambda ctx: copy_source(ctx, "dcp") / "step-10", mutate)


def legacy(mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    """A mutation of the legacy TP2 PP2 sample (called with iter_0000001), audited as a save dir."""
    return _mutated(lambda ctx: copy_source(ctx, "legacy") / "iter_0000001", mutate, lambda p: p.parent)


def m19(mutate: Callable[[Path, Ctx], None]) -> Callable[[Ctx], Path]:
    """A mutation of the 0.19.2 fixture's iter_0000400, audited as a save dir."""
    return _mutated(lambda ctx: copy_source(ctx, "mcore-0.19.2") / "iter_0000400", mutate, lambda p: p.parent)


def _rm(*names: str) -> Callable[[Path, Ctx], None]:
    def mutate(path: Path, ctx: Ctx) -> None:
        for n in names:
            p = path / n
            shutil.rmtree(p) if p.is_dir() else p.unlink()

    return mutate


def _write(name: str, data: bytes) -> Callable[[Path, Ctx], None]:
    def mutate(path: Path, ctx: Ctx) -> None:
        (path / name).write_bytes(data)

    return mutate


def _common(change: Callable[[dict[str, Any]], object]) -> Callable[[Path, Ctx], None]:
    def mutate(ckpt: Path, ctx: Ctx) -> None:
        edit_torch_file(ckpt / "common.pt", change)

    return mutate


def _set_args(**values: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        for k, v in values.items():
            setattr(state["args"], k, v)

    return change


def _legacy_pt(shard: str, change: Callable[[dict[str, Any]], object]) -> Callable[[Path, Ctx], None]:
    def mutate(it: Path, ctx: Ctx) -> None:
        edit_torch_file(it / shard / "model_optim_rng.pt", change)

    return mutate


def _plain(name: str, sub: str = "") -> Callable[[Ctx], Path]:
    return lambda ctx: copy_source(ctx, name) / sub


# --- shared by the case tables ----------------------------------------------------------------------------------

TD, FULLY, LEG, DCP, M19 = ("torch_dist",), ("torch_dist_fully",), ("legacy",), ("dcp",), ("mcore-0.19.2",)
NOT_FULLY = ("torch_dist_not_fully",)
MANIFEST_CODES = frozenset({"CK401", "CK402", "CK403", "CK404"})
S = frozenset
