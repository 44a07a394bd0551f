"""The acceptance corpus: broken, half-written, hostile and healthy checkpoints, built at test time.

Every case copies a real checkpoint (the `sample_ckpts/` written by megatron-core 0.16.1 / torch DCP, or the
Megatron-Core 0.19.2 fixture) into a scratch dir and applies ONE mutation that mimics a real failure: a crash
during the save (reference §8.2), a lost or truncated file, a damaged `.metadata` (edited with torch's own DCP
classes), a tampered manifest, a hostile pickle. It declares what `ckptinspect audit` must say about it: the
status, the codes that must appear, the codes that must not, which path to audit and with which flags.

`tests/test_acceptance.py` runs the CLI over `CASES` (case name = test id). Builders never touch the sources.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import io
import os
import pickle
import random
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
    # training stacks (tests/corpus_stacks.py)
    "bridge": (SAMPLES / "bridge", ("latest_train_state.pt", "iter_0000002/run_config.yaml")),
    "nemo2": (SAMPLES / "nemo2", ("checkpoints",)),
    "nvrx_local": (SAMPLES / "nvrx_local", ("0/iter_0000002_0_local.pt", "1/iter_0000002_1_local.pt")),
    "torchtitan": (SAMPLES / "torchtitan", ("step-2/.metadata",)),
    "megatron_fsdp": (SAMPLES / "megatron_fsdp", ("latest_checkpointed_iteration.txt", "iter_0000001/.metadata")),
    "mcore_0_15_3_zarr": (SAMPLES / "mcore_0_15_3_zarr", ("latest_checkpointed_iteration.txt",
                                                          "iter_0000001/output_layer.weight/.zarray")),
    "mcore-0.19.2": (FIXTURE_0192, ("latest_checkpointed_iteration.txt", "iter_0000400/integrity.json")),
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


def _tracker(text: bytes) -> Callable[[Path, Ctx], None]:
    def mutate(save: Path, ctx: Ctx) -> None:
        (save / "latest_checkpointed_iteration.txt").write_bytes(text)

    return mutate


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


def _metadata_tmp(ckpt: Path, ctx: Ctx) -> None:
    (ckpt / "metadata.json").unlink()
    (ckpt / ".metadata").rename(ckpt / ".metadata.tmp")


def _stale_distcp(ckpt: Path, ctx: Ctx) -> None:
    shutil.copyfile(ckpt / "__0_0.distcp", ckpt / "__9_0.distcp")


def _drop_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        md.state_dict_metadata[EMBEDDING].chunks.pop(1)


def _overlap_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        move_chunk(md, EMBEDDING, 1, (32, 0))  # rows 32..96: overlaps chunk 0, leaves 96..128 uncovered


def _out_of_bounds_chunk(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        move_chunk(md, EMBEDDING, 1, (96, 0))  # rows 96..160 of a 128-row tensor


def _unstored_chunk(ckpt: Path, ctx: Ctx) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    with edit_metadata(ckpt) as md:
        chunk = md.state_dict_metadata[EMBEDDING].chunks[0]
        del md.storage_data[MetadataIndex(EMBEDDING, chunk.offsets)]


def _drop_rng_cell(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        drop_object(md, RNG_CELL)


def _inconsistent_rng_grid(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        rename_object(md, RNG_CELL, "rng_state/shard_0.0_4.4")


def _overlapping_items(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        (_, first), (k, second) = items_in(md, "__0_0.distcp", tensors=True)[:2]
        md.storage_data[k] = dataclasses.replace(second, offset=first.offset + first.length // 2)


def _garbage_item(ckpt: Path, ctx: Ctx) -> None:
    _, info = items_in(read_metadata(ckpt), "__1_0.distcp", tensors=True)[0]
    with open(ckpt / info.relative_path, "r+b") as f:
        f.seek(info.offset)
        f.write(random.Random(205).randbytes(info.length))


def _wrong_dtype(ckpt: Path, ctx: Ctx) -> None:
    import torch

    with edit_metadata(ckpt) as md:
        md.state_dict_metadata["model.output.weight"].properties.dtype = torch.float16


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


def _hostile_metadata_bare(ckpt: Path, ctx: Ctx) -> None:
    (ckpt / ".metadata").write_bytes(pickle.dumps(Hostile(ctx.marker), protocol=2))


def _hostile_in_planner_data(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        md.planner_data["payload"] = Hostile(ctx.marker)


def _hostile_common_pt(ckpt: Path, ctx: Ctx) -> None:
    edit_torch_file(ckpt / "common.pt", lambda common: common.__setitem__("payload", Hostile(ctx.marker)))


def _timeit_common_pt(ckpt: Path, ctx: Ctx) -> None:
    edit_torch_file(ckpt / "common.pt", lambda common: common.__setitem__("payload", CallsTimeit(ctx.marker)))


def _timeit_in_planner_data(ckpt: Path, ctx: Ctx) -> None:
    with edit_metadata(ckpt) as md:
        if md.planner_data is None:  # Megatron's saves carry none; plain DCP's is a dict
            md.planner_data = {}
        md.planner_data["payload"] = CallsTimeit(ctx.marker)


def _broken_zarray(it: Path, ctx: Ctx) -> None:
    (it / "output_layer.weight" / ".zarray").write_text("{not json")


def _item_outside_dir(ckpt: Path, ctx: Ctx) -> None:
    """DCP's reader opens `relative_path` joined to the checkpoint dir as it stands: `../` leaves it. Move the
    data file of one stored item next to the checkpoint and point the item there."""
    import dataclasses
    import shutil

    outside = ckpt.parent / "outside_data"
    outside.mkdir(exist_ok=True)
    with edit_metadata(ckpt) as md:
        key = sorted(md.storage_data, key=lambda k: k.fqn)[0]
        info = md.storage_data[key]
        shutil.copy(ckpt / info.relative_path, outside / info.relative_path)
        md.storage_data[key] = dataclasses.replace(info, relative_path=f"../outside_data/{info.relative_path}")


def _hostile_legacy_pt(it: Path, ctx: Ctx) -> None:
    edit_torch_file(it / "mp_rank_01_000" / "model_optim_rng.pt",
                    lambda sd: sd.__setitem__("payload", Hostile(ctx.marker)))


def _hostile_item(key: str) -> Callable[[Path, Ctx], None]:
    """Megatron byte items are `torch.save([obj])` archives (strategies/torch.py): store a hostile one as `key`."""

    def mutate(ckpt: Path, ctx: Ctx) -> None:
        with edit_metadata(ckpt) as md:
            append_item(ckpt, md, key, torch_bytes([Hostile(ctx.marker)]))

    return mutate


def _empty_dir(ctx: Ctx) -> Path:
    (ctx.work / "empty").mkdir()
    return ctx.work / "empty"


def _garbage_file(name: str) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        path = ctx.work / name
        path.write_bytes(random.Random(name).randbytes(4096))
        return path

    return build


def _flip_byte(ckpt: Path, ctx: Ctx) -> None:
    with open(ckpt / "__3_0.distcp", "r+b") as f:
        f.seek(100_000)
        b = f.read(1)
        f.seek(100_000)
        f.write(bytes([b[0] ^ 0xFF]))


def _stale_manifest(ckpt: Path, ctx: Ctx) -> None:
    """A second save into the same dir rewrote the data and metadata.json but left the old integrity.json
    (Megatron's save() deletes nothing; the manifest is written last): data changed, manifest a minute older."""
    _flip_byte(ckpt, ctx)
    mj = ckpt / "metadata.json"
    now = mj.stat().st_mtime
    os.utime(ckpt / "integrity.json", (now - 60, now - 60))


def _plain(name: str, sub: str = "") -> Callable[[Ctx], Path]:
    return lambda ctx: copy_source(ctx, name) / sub


# --- the table -----------------------------------------------------------------------------------------------------

TD, FULLY, LEG, DCP, M19 = ("torch_dist",), ("torch_dist_fully",), ("legacy",), ("dcp",), ("mcore-0.19.2",)
NOT_FULLY = ("torch_dist_not_fully",)
MANIFEST_CODES = frozenset({"CK401", "CK402", "CK403", "CK404"})
S = frozenset

CASES: tuple[Case, ...] = (
    # healthy checkpoints: every sample and the 0.19.2 fixture
    Case("ok_torch_dist_save_dir", td_save, "complete", S({"CK506"}), S({"CK504", "CK505", "CK801"}), sources=TD,
         subprocess=True),
    Case("ok_torch_dist_checkpoint", td_iter2, "complete", S({"CK400"}), sources=TD),
    Case("ok_torch_dist_checkpoint_deep", td_iter2, "complete", absent=S({"CK205"}), flags=("--deep",), sources=TD),
    Case("ok_torch_dist_fully_save_dir", _plain("torch_dist_fully"), "complete", absent=S({"CK801"}), sources=FULLY),
    # saved with --no-ckpt-fully-parallel-save: DP rank 0 wrote every weight (info only, still complete)
    Case("ok_torch_dist_not_fully_save_dir", _plain("torch_dist_not_fully"), "complete", S({"CK801"}),
         sources=NOT_FULLY),
    Case("ok_torch_dist_not_fully_ignored", _plain("torch_dist_not_fully", "iter_0000001"), "complete",
         absent=S({"CK801"}), flags=("--ignore", "CK8"), sources=NOT_FULLY),
    Case("ok_legacy_save_dir", _plain("legacy"), "complete", absent=S({"CK112", "CK602"}), sources=LEG,
         subprocess=True),
    Case("ok_legacy_checkpoint", _plain("legacy", "iter_0000001"), "complete", sources=LEG),
    Case("ok_dcp_checkpoint", _plain("dcp", "step-10"), "complete", sources=DCP),
    Case("ok_dcp_run_dir", _plain("dcp"), "complete", absent=S({"CK501"}), sources=DCP),
    Case("ok_mcore_0192_save_dir", _plain("mcore-0.19.2"), "complete", absent=MANIFEST_CODES | {"CK400"}, sources=M19,
         subprocess=True),
    Case("ok_mcore_0192_deep", _plain("mcore-0.19.2", "iter_0000400"), "complete", absent=S({"CK205", "CK400"}),
         flags=("--deep",), sources=M19),
    # storage
    Case("truncated_distcp", td2(lambda c, x: truncate(c / "__0_1.distcp")), "corrupt", S({"CK202"}), sources=TD),
    Case("truncated_distcp_in_save_dir", td_dir(lambda s, x: truncate(s / ITER2 / "__1_1.distcp")), "corrupt",
         S({"CK202"}), sources=TD, subprocess=True),
    Case("deleted_distcp", td2(_rm("__0_1.distcp")), "corrupt", S({"CK201"}), sources=TD),
    Case("stale_distcp", td2(_stale_distcp), "complete", S({"CK204"}), sources=TD),
    Case("overlapping_items", dcp(_overlapping_items), "corrupt", S({"CK203"}), S({"CK202"}), sources=DCP),
    Case("garbage_item_deep", dcp(_garbage_item), "corrupt", S({"CK205"}), flags=("--deep",), sources=DCP),
    Case("garbage_item_shallow", dcp(_garbage_item), "complete", absent=S({"CK205"}), sources=DCP),
    Case("wrong_dtype_deep", dcp(_wrong_dtype), "corrupt", S({"CK205"}), flags=("--deep",), sources=DCP),
    # coverage and objects (.metadata surgery with torch's classes)
    Case("dropped_chunk", td2(_drop_chunk), "corrupt", S({"CK301"}), sources=TD),
    Case("shifted_chunk_overlap", td2(_overlap_chunk), "corrupt", S({"CK302"}), S({"CK304"}), sources=TD),
    Case("shifted_chunk_out_of_bounds", td2(_out_of_bounds_chunk), "corrupt", S({"CK303"}), S({"CK304"}),
         sources=TD),
    Case("chunk_without_storage", td2(_unstored_chunk), "corrupt", S({"CK304"}), sources=TD),
    Case("missing_rng_cell", td2(_drop_rng_cell), "corrupt", S({"CK305"}), sources=TD),
    Case("inconsistent_rng_grid", td2(_inconsistent_rng_grid), "corrupt", S({"CK306"}), sources=TD),
    # half-written saves and damaged metadata files
    Case("no_metadata_json", td2(_rm("metadata.json")), "incomplete", S({"CK101"}), sources=TD),
    Case("metadata_tmp", td2(_metadata_tmp), "incomplete", S({"CK103"}), sources=TD),
    Case("data_files_only", td2(_rm(".metadata", "metadata.json")), "incomplete", S({"CK102"}), sources=TD),
    Case("garbage_metadata_json", td2(_write("metadata.json", b"{not json")), "corrupt", S({"CK104"}), sources=TD),
    Case("unknown_backend", td2(_write("metadata.json", b'{"sharded_backend": "hdf5"}')), "corrupt", S({"CK104"}),
         sources=TD),
    Case("garbage_metadata", td2(_write(".metadata", random.Random(106).randbytes(2048))), "corrupt", S({"CK106"}),
         sources=TD),
    Case("missing_common_pt", td2(_rm("common.pt")), "corrupt", S({"CK105"}), sources=TD),
    # integrity manifest (the 0.19.2 fixture has integrity.json)
    # audit hashes only with --hash / --deep (issue 18: work proportional to the verdict)
    Case("manifest_byte_flip", m19(_flip_byte), "corrupt", S({"CK401"}), flags=("--hash",), sources=M19),
    Case("manifest_stale", m19(_stale_manifest), "corrupt", S({"CK401", "CK405"}), flags=("--hash",), sources=M19),
    Case("manifest_file_deleted", m19(_rm("__7_0.distcp")), "corrupt", S({"CK402", "CK201"}), sources=M19),
    Case("manifest_extra_file", m19(_write("notes.txt", b"hello\n")), "complete", S({"CK403"}), sources=M19),
    Case("manifest_garbage", m19(_write("integrity.json", b"\x00garbage")), "corrupt", S({"CK404"}), sources=M19),
    # trackers (0.16.1 save dir: iter 1, 2 complete, 3 half-written, tracker = 2)
    Case("tracker_garbage", td_dir(_tracker(b"abc")), "corrupt", S({"CK502"}), sources=TD),
    Case("tracker_empty", td_dir(_tracker(b"")), "corrupt", S({"CK502"}), sources=TD, subprocess=True),
    Case("tracker_names_missing_iteration", td_dir(_tracker(b"7")), "corrupt", S({"CK503"}), sources=TD),
    Case("tracker_names_unfinished_iteration", td_dir(_tracker(b"3")), "incomplete", S({"CK504", "CK101"}),
         sources=TD),
    Case("tracker_deleted", td_dir(_rm("latest_checkpointed_iteration.txt", "iter_0000003")), "complete",
         S({"CK501"}), sources=TD),
    Case("tracker_deleted_newest_unfinished", td_dir(_rm("latest_checkpointed_iteration.txt")), "incomplete",
         S({"CK501", "CK101"}), sources=TD),
    Case("tracker_behind_complete_iteration", td_dir(_tracker(b"1")), "complete", S({"CK505", "CK506"}),
         sources=TD),
    # hostile pickles: never executed (the marker file must not appear), status unsafe
    Case("hostile_metadata", td2(_hostile_metadata_bare), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_metadata_planner_data", dcp(_hostile_in_planner_data), "unsafe", S({"CK601"}), sources=DCP,
         subprocess=True),
    Case("hostile_common_pt", td2(_hostile_common_pt), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_common_pt_timeit", td2(_timeit_common_pt), "unsafe", S({"CK604"}), sources=TD, subprocess=True),
    # .metadata is read once, by sniff, and handed to the reader: the call must survive the hand-over
    Case("hostile_metadata_timeit_dcp", dcp(_timeit_in_planner_data), "unsafe", S({"CK604"}), sources=DCP,
         subprocess=True),
    Case("hostile_metadata_timeit_torch_dist", td2(_timeit_in_planner_data), "unsafe", S({"CK604"}), sources=TD,
         subprocess=True),
    Case("zarr_broken_zarray", _mutated(lambda ctx: copy_source(ctx, "mcore_0_15_3_zarr") / "iter_0000001",
                                        _broken_zarray, lambda p: p.parent), "corrupt", S({"CK113"}),
         sources=("mcore_0_15_3_zarr",)),
    Case("storage_item_outside_dir", td2(_item_outside_dir), "unsafe", S({"CK207"}), sources=TD, subprocess=True),
    Case("hostile_legacy_model_pt", legacy(_hostile_legacy_pt), "unsafe", S({"CK601"}), sources=LEG,
         subprocess=True),
    Case("hostile_common_state_item", m19(_hostile_item("common_state/shard_0_1")), "unsafe", S({"CK601", "CK401"}),
         flags=("--hash",), sources=M19, subprocess=True),
    Case("hostile_rng_item", td2(_hostile_item(RNG_CELL)), "unsafe", S({"CK601"}), sources=TD, subprocess=True),
    Case("hostile_rng_item_deep", td2(_hostile_item(RNG_CELL)), "unsafe", S({"CK601"}), flags=("--deep",),
         sources=TD, subprocess=True),
    # an unknown class only referenced (the class object itself) is opaque, a warning; an INSTANCE of it is built
    # by NEWOBJ, a call of a global that is not an inert constructor: torch.load would run it, so unsafe (CK604)
    Case("unknown_global_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", lambda sd: sd.__setitem__(
        "extra", Harmless))), "complete", S({"CK602"}), S({"CK601", "CK604"}), sources=LEG),
    Case("unknown_class_called_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", lambda sd: sd.__setitem__(
        "extra", Harmless()))), "unsafe", S({"CK604"}), S({"CK601"}), sources=LEG),
    Case("deeply_nested_legacy_pt", legacy(_legacy_pt("mp_rank_00_001", _nest(600))), "corrupt", S({"CK603"}), sources=LEG,
         subprocess=True),
    # legacy format
    Case("legacy_missing_shard_dir", legacy(_rm("mp_rank_01_001")), "corrupt", S({"CK110"}), sources=LEG),
    Case("legacy_missing_distrib_optim", legacy(_rm("mp_rank_00_001/distrib_optim.pt")), "corrupt", S({"CK111"}),
         sources=LEG),
    Case("legacy_args_differ", legacy(_legacy_pt("mp_rank_01_000", _set_args(lr=0.5))), "complete", S({"CK112"}),
         sources=LEG),
    Case("legacy_truncated_pt", legacy(lambda it, x: truncate(it / "mp_rank_00_001" / "model_optim_rng.pt")),
         "corrupt", S({"CK206"}), sources=LEG),
    # args
    Case("args_tp_disagrees_with_layout", td2(_common(_set_args(tensor_model_parallel_size=4))), "complete",
         S({"CK702"}), sources=TD),
    Case("no_args", td2(_common(lambda common: common.pop("args"))), "complete", S({"CK701"}), sources=TD),
    # not a checkpoint
    Case("empty_dir", _empty_dir, "unrecognized", S({"CK100"}), subprocess=True),
    Case("garbage_file", _garbage_file("garbage.bin"), "unrecognized", S({"CK100"})),
    Case("garbage_pt_file", _garbage_file("model.pt"), "corrupt", S({"CK206"})),
)
