"""Tests of `ckptinspect.commands.diff.diff`, `ckptinspect.commands.diff.values` and `ckptinspect.render.diff_text` on real checkpoints.

Sources: the Megatron-Core 0.19.2 fixture (read-only; copied to `tmp_path` before any byte is flipped), the sample
save dirs under `sample_ckpts/` (when present), small PyTorch DCP checkpoints written in-process by
`torch.distributed.checkpoint.save` (one chunk per tensor, any dtype), and — marked slow — Megatron-Core 0.16.1
and multi-rank DCP checkpoints written by `tools/make_sample_ckpts.py`, each once per session.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckptinspect.commands.diff.args import BLOCKING_ARGS, Category, categorize, diff_args
from ckptinspect.commands.diff.diff import DiffResult, What, diff_checkpoints, diff_paths
from ckptinspect.errors import UsageError
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.files import read_item_archive
from ckptinspect.model import Checkpoint, Tensor
from ckptinspect.commands.diff import values
from ckptinspect.render.diff_text import render_diff

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "sample_ckpts"
FIXTURE_019 = SAMPLES / "mcore_0_19_2"


# --- helpers ---------------------------------------------------------------------------------------------------------


def render_text(r: DiffResult) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render_diff(r))
    return console.export_text()


def tensor(ckpt: Checkpoint, key: str) -> Tensor:
    return next(t for t in ckpt.tensors if t.key == key)


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def flip(ckpt_dir: Path, key: str, chunk_index: int, local: tuple[int, ...], new: float) -> tuple[float, tuple[int, ...]]:
    """Overwrite one float32 element of a DCP chunk in place, located through the chunk archive's `data/<key>`
    record. Returns the old value and the element's global index."""
    ckpt = read_checkpoint(ckpt_dir, str(ckpt_dir))
    t = tensor(ckpt, key)
    assert t.dtype == "float32"
    chunk = t.chunks[chunk_index]
    assert chunk.storage is not None
    archive = read_item_archive(ckpt_dir, chunk.storage)
    ref = archive.obj
    rec = archive.records[f"data/{ref.storage_key}"]
    flat = sum(i * s for i, s in zip(local, ref.stride))
    pos = chunk.storage.offset + rec.data_offset + (ref.storage_offset + flat) * 4
    with open(ckpt_dir / chunk.storage.file, "r+b") as f:
        f.seek(pos)
        (old,) = struct.unpack("<f", f.read(4))
        f.seek(pos)
        f.write(struct.pack("<f", new))
    return old, tuple(o + i for o, i in zip(chunk.offsets, local))


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


# --- args ------------------------------------------------------------------------------------------------------------


def test_categories() -> None:
    assert categorize("num_layers") is Category.ARCHITECTURE
    assert categorize("padded_vocab_size") is Category.ARCHITECTURE
    assert categorize("tensor_model_parallel_size") is Category.PARALLELISM
    assert categorize("lr") is Category.OPTIMIZER
    assert categorize("train_iters") is Category.SCHEDULE
    assert categorize("seq_length") is Category.DATA
    assert categorize("iteration") is Category.PROGRESS
    assert categorize("consumed_valid_samples") is Category.PROGRESS
    assert categorize("save") is Category.RUNTIME
    assert categorize("something_new") is Category.OTHER
    assert {"num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings",
            "make_vocab_size_divisible_by", "padded_vocab_size", "tokenizer_type"} <= BLOCKING_ARGS


def test_diff_args_rules() -> None:
    a = {"num_layers": 4, "hidden_size": 32, "iteration": 1, "save": "/a", "tensor_model_parallel_size": 2,
         "add_position_embedding": True, "swiglu": False, "lr": 1e-3}
    b = {"num_layers": 8, "iteration": 2, "save": "/b", "tensor_model_parallel_size": 1, "swiglu": True,
         "lr": 1e-3, "num_query_groups": 4}
    rows = {d.name: d for d in diff_args(a, b)}
    assert set(rows) == {"num_layers", "hidden_size", "iteration", "save", "tensor_model_parallel_size",
                         "add_position_embedding", "swiglu", "num_query_groups"}
    assert rows["num_layers"].blocking and rows["swiglu"].blocking
    assert rows["hidden_size"].missing == "b" and rows["hidden_size"].blocking  # Megatron would raise
    assert rows["add_position_embedding"].missing == "b" and not rows["add_position_embedding"].blocking
    assert "default" in (rows["add_position_embedding"].reason or "")
    assert rows["num_query_groups"].missing == "a" and not rows["num_query_groups"].blocking
    for name in ("iteration", "save", "tensor_model_parallel_size"):
        assert not rows[name].blocking
    assert rows["iteration"].category is Category.PROGRESS and rows["save"].category is Category.RUNTIME
    # blocking rows come first
    order = [d.blocking for d in diff_args(a, b)]
    assert order == sorted(order, reverse=True)
    # legacy checkpoints cannot be resharded: TP is compared by check_checkpoint_args
    legacy = {d.name: d for d in diff_args(a, b, both_legacy=True)}
    assert legacy["tensor_model_parallel_size"].blocking
    # global_batch_size is compared only with phase transitions
    gb = {d.name: d for d in diff_args({"global_batch_size": 4, "phase_transition_iterations": [10]},
                                       {"global_batch_size": 8, "phase_transition_iterations": [10]})}
    assert gb["global_batch_size"].blocking
    assert not diff_args({"global_batch_size": 4}, {"global_batch_size": 8})[0].blocking


# --- in-process PyTorch DCP checkpoints (one chunk per tensor, any dtype) ---------------------------------------------


def save_dcp(path: Path, state: dict[str, Any]) -> Path:
    """A real single-process DCP save (`no_dist`): one chunk per tensor, in `path/__0_0.distcp`."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return path


def test_values_every_dtype(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    a = {
        "bf": torch.randn(4, 8, generator=gen).to(torch.bfloat16),
        "h": torch.randn(10, generator=gen).to(torch.float16),
        "i": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "b": torch.tensor([True, False, True]),
        "f8": torch.randn(5, generator=gen).to(torch.float8_e4m3fn),
        "s": torch.tensor(3.5),
        "nan": torch.tensor([float("nan"), 1.0]),
        "same": torch.randn(3, 3, generator=gen),
    }
    b = {k: v.clone() for k, v in a.items()}
    b["bf"][1, 2] = torch.tensor(7.0, dtype=torch.bfloat16)
    b["h"][9] += 1
    b["i"][1, 1] += 5
    b["b"][0] = False
    b["f8"][4] = torch.tensor(0.0).to(torch.float8_e4m3fn) if float(a["f8"][4]) != 0 else torch.tensor(1.0).to(
        torch.float8_e4m3fn)
    b["s"] = torch.tensor(-0.5)
    r = diff_paths(save_dcp(tmp_path / "a", a), save_dcp(tmp_path / "b", b), values=True)
    assert not r.blocking and r.tensors.only_in_a == () and r.tensors.only_in_b == ()
    assert r.values is not None and r.values.skipped == ()
    assert set(r.values.identical) == {"nan", "same"}  # NaN equals NaN
    got = {c.key: c for c in r.tensors.changed}
    assert set(got) == {"bf", "h", "i", "b", "f8", "s"}
    assert all(c.what is What.VALUES and c.mismatched_elements == 1 and not c.blocking for c in got.values())
    assert got["bf"].first_mismatch == (1, 2) and got["bf"].b == 7.0
    assert got["bf"].max_abs_diff == pytest.approx(abs(7.0 - float(a["bf"][1, 2])))
    assert got["h"].first_mismatch == (9,)
    assert got["h"].max_abs_diff == pytest.approx(abs(float(b["h"][9]) - float(a["h"][9])))
    assert (got["i"].a, got["i"].b, got["i"].max_abs_diff) == (4, 9, 5.0)
    assert (got["b"].a, got["b"].b, got["b"].max_abs_diff) == (True, False, 1.0)
    assert got["f8"].max_abs_diff is None  # float8 compared bit for bit
    assert got["s"].first_mismatch == () and got["s"].max_abs_diff == 4.0
    assert json.loads(json.dumps(r.to_dict()))["values"]["identical"] == 2


def test_values_strided_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP keeps a transposed tensor's strides (`data.pkl` stride (1, 4)): the bytes are read through them."""
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = x.clone()
    y[2, 1] = 100.0  # element (1, 2) of the transpose
    monkeypatch.setattr(values, "SLAB_ELEMENTS", 5)  # several slabs per chunk
    a = save_dcp(tmp_path / "a", {"t": x.t(), "u": x.t()})
    b = save_dcp(tmp_path / "b", {"t": x.t().contiguous(), "u": y.t().contiguous()})
    r = diff_paths(a, b, values=True)
    assert r.values is not None and r.values.identical == ("t",)
    (c,) = r.tensors.changed
    assert (c.key, c.first_mismatch, c.a, c.b, c.max_abs_diff) == ("u", (1, 2), 9.0, 100.0, 91.0)


def test_keys_shapes_dtypes_block(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    a = save_dcp(tmp_path / "a", {"x": torch.zeros(4), "y": torch.zeros(2, 2), "z": torch.zeros(1),
                                  "k": torch.ones(3)})
    b = save_dcp(tmp_path / "b", {"x": torch.zeros(5), "y": torch.zeros(2, 2, dtype=torch.float16),
                                  "w": torch.zeros(1), "k": torch.ones(3)})
    r = diff_paths(a, b, values=True)
    assert r.blocking and not r.identical
    assert r.tensors.only_in_a == ("z",) and r.tensors.only_in_b == ("w",)
    changes = {(c.key, c.what): c for c in r.tensors.changed}
    assert set(changes) == {("x", What.SHAPE), ("y", What.DTYPE)}
    assert changes[("x", What.SHAPE)].a == [4] and changes[("x", What.SHAPE)].b == [5]
    assert all(c.blocking for c in changes.values())
    assert r.values is not None and r.values.identical == ("k",)
    assert dict(r.values.skipped) == {"x": "shape or dtype differs", "y": "shape or dtype differs"}
    assert any("plain DCP" in n for n in r.notes)
    text = render_text(r)
    assert text.index("blocking") < text.index("only in A")
    d = r.to_dict()
    assert d["blocking"] is True and d["tensors"]["only_in_a"] == ["z"]
    assert {c["what"] for c in d["tensors"]["changed"]} == {"shape", "dtype"}


def test_unrecognized_side_and_missing_path(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    good = save_dcp(tmp_path / "good", {"x": torch.zeros(2)})
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a checkpoint")
    r = diff_paths(junk, good)
    assert r.blocking and not r.tensors.comparable
    assert any("not a recognized checkpoint" in n for n in r.notes)
    assert "not a recognized checkpoint" in render_text(r)
    with pytest.raises(UsageError):
        diff_paths(tmp_path / "nope", good)


# --- Megatron-Core 0.19.2 fixture ------------------------------------------------------------------------------------


def test_fixture_against_itself_values_identical() -> None:
    calls: list[tuple[int, int, str]] = []
    r = diff_paths(FIXTURE_019, FIXTURE_019 / "iter_0000400", values=True,
                   progress=lambda adv, total, desc: calls.append((adv, total, desc)))
    assert r.identical and not r.blocking
    assert r.a.path.endswith("iter_0000400")  # the save dir resolved to its tracked iteration
    assert r.values is not None and len(r.values.compared) == 29 == len(r.values.identical)
    assert r.values.skipped == ()
    ckpt = read_checkpoint(FIXTURE_019 / "iter_0000400", "x")
    total = sum(t.nbytes for t in ckpt.tensors)
    assert {c[1] for c in calls} == {total} and sum(c[0] for c in calls) == total
    assert {c[2] for c in calls} == set(r.values.compared)
    assert "common_state" not in {*r.objects.only_in_a, *r.objects.only_in_b}
    assert "identical" in render_text(r)


@pytest.mark.slow
def test_single_flipped_float_is_found(tmp_path: Path) -> None:
    src = FIXTURE_019 / "iter_0000400"
    copy = writable_copy(src, tmp_path / "iter_0000400")
    key = "decoder.layers.mlp.linear_fc1.weight"
    chunk_index = next(i for i, c in enumerate(tensor(read_checkpoint(copy, "c"), key).chunks) if any(c.offsets))
    old, where = flip(copy, key, chunk_index, (0, 3, 5), 0.25)
    r = diff_paths(src, copy, values=True)
    assert not r.blocking and not r.identical
    assert [c.key for c in r.tensors.changed] == [key]
    (c,) = r.tensors.changed
    assert c.what is What.VALUES and c.mismatched_elements == 1 and c.first_mismatch == where
    assert c.max_abs_diff == pytest.approx(abs(0.25 - old), rel=0, abs=1e-12)
    assert (c.a, c.b) == (f32(old), 0.25)
    assert r.values is not None and len(r.values.identical) == 28 and key not in r.values.identical
    d = r.to_dict()["tensors"]["changed"][0]
    assert d["what"] == "values" and d["mismatched_elements"] == 1 and d["max_abs_diff"] == c.max_abs_diff
    assert "1/" in render_text(r)


def test_args_missing_on_one_side() -> None:
    ckpt = read_checkpoint(FIXTURE_019 / "iter_0000400", "a")
    bare = Checkpoint(path="b", format=ckpt.format, table=ckpt.table, objects=ckpt.objects)
    r = diff_checkpoints(ckpt, bare)
    assert r.args == () and any("B has no training args" in n for n in r.notes)
    assert not r.identical and r.tensors.empty


# --- sample_ckpts/ (written by tools/make_sample_ckpts.py) ------------------------------------------------------------


def test_sample_iterations_progress_only() -> None:
    run = SAMPLES / "torch_dist"
    r = diff_paths(run / "iter_0000001", run / "iter_0000002")
    assert not r.blocking and not r.identical
    rows = {d.name: d for d in r.args}
    assert rows["iteration"].category is Category.PROGRESS and not rows["iteration"].blocking
    assert (rows["iteration"].a, rows["iteration"].b) == (1, 2)
    assert rows["consumed_train_samples"].category is Category.PROGRESS
    assert all(not d.blocking for d in r.args)
    assert r.tensors.empty and r.objects.empty
    d = r.to_dict()
    assert {"identical", "blocking", "args", "tensors"} <= set(d)
    assert set(d["args"][0]) >= {"name", "a", "b", "category", "blocking"}
    assert set(d["tensors"]) >= {"only_in_a", "only_in_b", "changed"}
    text = render_text(r)
    assert "none blocking" in text and "consumed_train_samples" in text


def test_legacy_vs_torch_dist_says_what_was_compared() -> None:
    r = diff_paths(SAMPLES / "legacy" / "iter_0000001", SAMPLES / "torch_dist" / "iter_0000001", values=True)
    assert not r.tensors.comparable and not r.objects.comparable
    assert r.tensors.only_in_a == () and r.tensors.only_in_b == ()
    assert any("not comparable across formats" in n for n in r.notes)
    assert {d.name for d in r.args} >= {"ckpt_format"}  # args were compared
    assert not r.blocking
    assert "tensors not compared" in render_text(r)


def test_legacy_values_against_itself() -> None:
    r = diff_paths(SAMPLES / "legacy", SAMPLES / "legacy" / "iter_0000001", values=True)
    assert r.identical and r.values is not None and r.values.compared
    assert r.values.compared == r.values.identical and r.values.skipped == ()
    assert all("/" in k and k.startswith("mp_rank_") for k in r.values.compared)  # legacy keys are per shard dir


# --- generated Megatron-Core 0.16.1 / DCP checkpoints (slow) ----------------------------------------------------------

# The model of the 0.19.2 fixture: 4 layers, hidden 32, 4 heads, ffn 128, max positions 64, padded vocab 256.
SAME_MODEL: dict[str, Any] = dict(format="torch_dist", tp=2, pp=2, dp=2, layers=4, hidden=32, heads=4,
                                  vocab_size=200, make_vocab_size_divisible_by=128, seq_length=64)


def _generate(tmp_path_factory: pytest.TempPathFactory, name: str, **kw: Any) -> Path:
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    from make_sample_ckpts import make_checkpoint

    out = tmp_path_factory.mktemp(name) / "run"
    make_checkpoint(out, **kw)
    return out


@pytest.fixture(scope="session")
def run_016(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's model, saved by megatron-core 0.16.1 at iterations 1 and 2."""
    return _generate(tmp_path_factory, "mcore016", iterations=(1, 2), **SAME_MODEL)


@pytest.fixture(scope="session")
def run_016_tp1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same model with TP=1 and make_vocab_size_divisible_by=8: padded vocab 200 instead of 256."""
    kw = {**SAME_MODEL, "tp": 1, "make_vocab_size_divisible_by": 8}
    return _generate(tmp_path_factory, "mcore016tp1", iterations=(1,), **kw)


@pytest.fixture(scope="session")
def dcp_grids(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """One plain-DCP run saved by 4 ranks on a 1-D mesh (Shard(0)) and on a 2×2 mesh (Shard(0), Shard(1))."""
    kw: dict[str, Any] = dict(format="dcp", dp=4, layers=2, hidden=16, heads=4, vocab_size=128, dcp_step=10)
    one = _generate(tmp_path_factory, "dcp1d", dcp_mesh="1d", **kw)
    two = _generate(tmp_path_factory, "dcp2d", dcp_mesh="2d", **kw)
    yield one / "step-10", two / "step-10"


@pytest.mark.live
def test_016_and_019_same_model_diff_clean(run_016: Path) -> None:
    r = diff_paths(FIXTURE_019, run_016)
    assert r.tensors.comparable and r.tensors.common == 29
    assert r.tensors.only_in_a == () and r.tensors.only_in_b == () and r.tensors.changed == ()
    assert not r.blocking
    assert not any(d.blocking for d in r.args)
    assert r.objects.changed == ()  # same TP/PP: same rng_state / _extra_state grids
    assert "common_state" not in r.objects.only_in_a  # the ≥0.19 common-state carrier is not a model object
    gen = {d.name: d for d in r.meta}["generation"]
    assert "0.19" in str(gen.a) and "0.18" in str(gen.b)


@pytest.mark.live
def test_two_iterations_of_one_run(run_016: Path) -> None:
    r = diff_paths(run_016 / "iter_0000001", run_016 / "iter_0000002", values=True)
    assert not r.blocking
    names = {d.name: d for d in r.args}
    assert set(names) == {"iteration", "consumed_train_samples"}
    assert all(d.category is Category.PROGRESS for d in r.args)
    assert r.values is not None and len(r.values.compared) == r.tensors.common
    assert {c.what for c in r.tensors.changed} == {What.VALUES}  # trained one more step: values only


@pytest.mark.live
def test_other_tp_and_vocab_padding_blocks(run_016: Path, run_016_tp1: Path) -> None:
    r = diff_paths(run_016, run_016_tp1)
    assert r.blocking
    args = {d.name: d for d in r.args}
    assert args["padded_vocab_size"].blocking and (args["padded_vocab_size"].a, args["padded_vocab_size"].b) == (
        256, 200)
    assert args["make_vocab_size_divisible_by"].blocking
    tp = args["tensor_model_parallel_size"]
    assert tp.category is Category.PARALLELISM and not tp.blocking  # torch_dist reshards
    changes = {(c.key, c.what): c for c in r.tensors.changed}
    emb = changes[("embedding.word_embeddings.weight", What.SHAPE)]
    assert emb.blocking and (emb.a, emb.b) == ([256, 32], [200, 32])
    fc1 = changes[("decoder.layers.mlp.linear_fc1.weight", What.LAYOUT)]
    assert not fc1.blocking and fc1.a["grid"] == [4, 2, 1] and fc1.b["grid"] == [4, 1, 1]
    rng = {c.key: c for c in r.objects.changed}["rng_state"]
    assert rng.what is What.LAYOUT and (rng.a, rng.b) == ([2, 2], [2, 1]) and not rng.blocking
    text = render_text(r)
    assert text.index("blocking") < text.index("padded_vocab_size") < text.index("tensors (")


@pytest.mark.slow
def test_values_across_chunk_grids(dcp_grids: tuple[Path, Path], tmp_path: Path) -> None:
    one, two = dcp_grids
    r = diff_paths(one, two, values=True)
    layouts = {c.key: c for c in r.tensors.changed if c.what is What.LAYOUT}
    assert layouts["model.norm.weight"].a == {"chunks": 4, "grid": [4]}  # 1-D: 4 chunks vs 2
    assert layouts["model.norm.weight"].b == {"chunks": 2, "grid": [2]}
    assert layouts["model.layers.0.w1.weight"].b["grid"] == [2, 2]  # 2-D: 4×1 vs 2×2
    assert not r.blocking and all(c.what is What.LAYOUT for c in r.tensors.changed)
    assert r.values is not None and r.values.skipped == ()
    assert r.values.compared == r.values.identical and len(r.values.compared) == r.tensors.common

    copy = writable_copy(two, tmp_path / "step-10")
    key = "model.layers.0.w1.weight"
    idx = next(i for i, c in enumerate(tensor(read_checkpoint(copy, "c"), key).chunks) if all(c.offsets))
    old, where = flip(copy, key, idx, (1, 2), 123.0)
    r2 = diff_paths(one, copy, values=True)
    (c,) = [c for c in r2.tensors.changed if c.what is What.VALUES]
    assert c.key == key and c.mismatched_elements == 1 and c.first_mismatch == where
    assert c.max_abs_diff == pytest.approx(abs(123.0 - old), rel=0, abs=1e-9)
    assert r2.values is not None and len(r2.values.identical) == len(r2.values.compared) - 1
