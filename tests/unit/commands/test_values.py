"""Tests of `ckptinspect.commands.values` (the value scan: report, rules, shards) and the `values` CLI, on real
checkpoints: the committed samples (written by megatron-core 0.13-0.19 and torch DCP) and DCP saves written here by
`torch.distributed.checkpoint.save` with the fault put into the tensors BEFORE the save (never bytes edited after).
Statistics are checked against torch's own reading of the same files (`dcp.load`, `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from ckptinspect.api import audit, merge_values_reports, read, values
from ckptinspect.cli.app import app
from ckptinspect.commands.values.report import values_report
from schemas import validate_document

torch = pytest.importorskip("torch")
from dcp_io import load_dcp, save_dcp  # noqa: E402 - needs torch

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "sample_ckpts"
VALUE_CODES = {f"CK9{n:02d}" for n in range(1, 20)}


def by_key(r: Any) -> dict[str, Any]:
    return {(f"{t.shard}/{t.key}" if t.shard else t.key): t for t in r.report.tensors}


def sample_dirs() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if p.is_dir() and p.name not in ("dcp_writers", "nemo2"))


@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_no_value_finding_on_a_healthy_sample(sample: Path) -> None:
    """Every committed sample is a real, healthy save: the scan reads every tensor whole and finds nothing (the
    0.19.2 sample's DistOpt bucket pads hold uninitialized memory: not judged, counted in pad_elements)."""
    r = values(sample)
    validate_document(r.to_dict())
    codes = sorted({f.code for f in r.findings} & VALUE_CODES)
    assert codes == [], [(f.code, f.message) for f in r.findings if f.code in VALUE_CODES][:3]
    scanned = [t for t in r.report.tensors if t.unsupported is None]
    assert all(t.values.complete and t.values.fingerprint for t in scanned), [t.key for t in scanned
                                                                               if not t.values.complete][:3]


def test_pads_of_the_0_19_2_sample_hold_garbage_outside_the_judged_stats() -> None:
    r = values(SAMPLES / "mcore_0_19_2")
    buckets = [t for t in r.report.tensors if ".bucket_idx_" in t.key]
    assert buckets and all(t.values.stats.count == t.judged.count + (t.values.stats.count - t.judged.count)
                           for t in buckets)
    padded = [t for t in buckets if t.values.stats.count > t.judged.count]
    assert padded, "the 0.19.2 buckets have alignment pads"
    # the garbage is real: counted over every element, a negative exp_avg_sq and subnormals appear; judged, none
    sq = [t for t in padded if t.key.endswith("exp_avg_sq")]
    assert any(t.values.stats.min < 0 for t in sq) and all(t.judged.min >= 0 for t in sq)


@pytest.mark.parametrize("name", ["dcp", "torch_dist", "swiglu_bf16", "dcp_zstd", "mcore_0_19_2"])
def test_stats_equal_torch(name: str) -> None:
    """Counts, min, max exactly and mean / std / L2 closely equal to torch's reading of the same checkpoint."""
    r = values(SAMPLES / name)
    ckpt = read(SAMPLES / name)
    state = load_dcp(Path(ckpt.data_dir))
    seen = 0
    for key, t in by_key(r).items():
        if key not in state or t.unsupported:
            continue
        x = state[key].float().double().flatten() if state[key].dtype == torch.bfloat16 else (
            state[key].double().flatten())
        s = t.judged if t.values.stats.count == t.judged.count else None
        if s is None:
            continue
        assert s.count == x.numel()
        assert s.nan == int(torch.isnan(x).sum()) and s.zeros == int((x == 0).sum())
        fin = x[torch.isfinite(x)]
        if fin.numel():
            assert s.min == float(fin.min()) and s.max == float(fin.max())
            # float32 block sums: within ~1e-6 of the tensor's scale (|mean| + std), as the contract says
            scale = abs(float(fin.mean())) + float(fin.std(correction=0))
            assert s.mean == pytest.approx(float(fin.mean()), abs=1e-6 * scale + 1e-12)
            assert s.std == pytest.approx(float(fin.std(correction=0)), abs=1e-6 * scale + 1e-12)
            assert s.l2 == pytest.approx(float(fin.norm()), rel=1e-6)
        seen += 1
    assert seen >= 4


def test_legacy_stats_equal_torch_load() -> None:
    r = values(SAMPLES / "legacy")
    ts = by_key(r)
    f = next((SAMPLES / "legacy").glob("iter_*/mp_rank_00_000/model_optim_rng.pt"))
    sd = torch.load(f, map_location="cpu", weights_only=False)["model"]
    seen = 0
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            continue
        t = ts[f"mp_rank_00_000/model.{k}"]
        assert t.judged.count == v.numel() and t.judged.min == float(v.min()) and t.judged.max == float(v.max())
        seen += 1
    assert seen > 5


def test_fingerprint_same_weights_other_chunking_and_format(tmp_path: Path) -> None:
    """The torch_dist sample's tensors (TP2-sharded chunks, Megatron's writer) re-saved by plain DCP in one chunk
    each: every fingerprint equal; a one-element change gives another one."""
    src = SAMPLES / "torch_dist"
    ckpt = read(src)
    state = load_dcp(Path(ckpt.data_dir))
    chunked = {k for k, t in ((t.key, t) for t in ckpt.tensors) if len(t.chunks) > 1}
    assert chunked, "the sample has tensors in several chunks"
    save_dcp(tmp_path / "plain", state)
    a, b = by_key(values(src)), by_key(values(tmp_path / "plain"))
    for k in state:
        assert a[k].values.fingerprint == b[k].values.fingerprint, k
    key = sorted(chunked)[0]
    changed = dict(state)
    changed[key] = state[key].clone()
    flat = changed[key].view(-1)
    flat[flat.numel() // 2] = torch.nextafter(flat[flat.numel() // 2], torch.tensor(math.inf, dtype=flat.dtype))
    save_dcp(tmp_path / "changed", changed)
    c = by_key(values(tmp_path / "changed"))
    assert c[key].values.fingerprint != a[key].values.fingerprint
    assert all(c[k].values.fingerprint == a[k].values.fingerprint for k in state if k != key)


def _element_at(path: Path, place: dict[str, Any], dtype: str) -> float:
    raw = (path / place["file"]).read_bytes()[place["byte_offset"]:]
    return float(np.frombuffer(raw[:4], dtype="<f4")[0]) if dtype == "float32" else float("nan")


def test_faults_put_in_before_a_real_save(tmp_path: Path) -> None:
    """NaN, Inf and denormals in a weight, a zeroed matrix, a negative exp_avg_sq and a missing moment, put into
    a real model + AdamW state before `dcp.save`: each its code, at the element torch holds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8), torch.nn.Linear(8, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    with torch.no_grad():
        w = model[0].weight
        w[3, 5] = math.nan
        w[4, 1] = math.inf
        w[0, :8] = 1e-42  # float32 denormals: 8 of 512 > 0.1 %
        model[2].weight.zero_()
    osd = opt.state_dict()
    names = [n for n, _ in model.named_parameters()]
    state: dict[str, Any] = {f"model.{n}": p.detach().clone() for n, p in model.named_parameters()}
    for i, n in enumerate(names):
        st = osd["state"][i]
        state[f"optimizer.state.{n}.exp_avg"] = st["exp_avg"].clone()
        if n != "1.bias":  # one parameter's second moment not saved
            state[f"optimizer.state.{n}.exp_avg_sq"] = st["exp_avg_sq"].clone()
    state["optimizer.state.1.weight.exp_avg_sq"][2, 7] = -1.0
    path = save_dcp(tmp_path / "faults", state)

    r = values(path)
    validate_document(r.to_dict())
    audited = audit(path, values=True)
    doc = audited.to_dict()
    validate_document(doc)
    assert {f.code for f in audited.findings} >= {"CK901", "CK902", "CK903", "CK904", "CK905", "CK910"}
    assert len(doc["values"]["tensors"]) == len(r.report.tensors) and audited.status.value == "corrupt"
    assert {f.code for f in audit(path).findings}.isdisjoint(VALUE_CODES)  # metadata-level audit reads no value
    got = {(f.code, f.subject) for f in r.findings}
    assert ("CK901", "model.0.weight") in got and ("CK902", "model.0.weight") in got
    assert ("CK903", "model.0.weight") in got and ("CK905", "model.2.weight") in got
    assert ("CK904", "optimizer.state.1.weight.exp_avg_sq") in got and ("CK910", "1.bias") in got
    assert r.status.value == "corrupt" and r.exit_code() == 1
    by = {(f.code, f.subject): f for f in r.findings}
    nan = by[("CK901", "model.0.weight")].details["first"]
    assert nan["index"] == [3, 5] and math.isnan(_element_at(path, nan, "float32"))
    inf = by[("CK902", "model.0.weight")].details["first"]
    assert inf["index"] == [4, 1] and _element_at(path, inf, "float32") == math.inf
    neg = by[("CK904", "optimizer.state.1.weight.exp_avg_sq")].details["first"]
    assert neg["index"] == [2, 7] and _element_at(path, neg, "float32") == -1.0
    sub = by[("CK903", "model.0.weight")].details
    assert sub["subnormal"] == 8 and sub["first"]["index"] == [0, 0]
    # nothing else: the healthy tensors of the same save are not flagged
    assert {c for c, _ in got} == {"CK901", "CK902", "CK903", "CK904", "CK905", "CK910"}
    assert len([1 for c, s in got if c == "CK905"]) == 1


def test_zeroed_moment_is_a_warning(tmp_path: Path) -> None:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = torch.optim.AdamW([p])
    (p * p).sum().backward()
    opt.step()
    st = opt.state_dict()["state"][0]
    state = {"model.w": p.detach().clone(), "optimizer.state.w.exp_avg": torch.zeros_like(st["exp_avg"]),
             "optimizer.state.w.exp_avg_sq": st["exp_avg_sq"].clone()}
    r = values(save_dcp(tmp_path / "z", state))
    assert [(f.code, f.subject) for f in r.findings] == [("CK906", "optimizer.state.w.exp_avg")]
    assert r.exit_code() == 0 and r.exit_code("warning") == 1


@pytest.mark.parametrize("n", [2, 3])
def test_shards_merge_to_the_unsharded_scan(n: int) -> None:
    src = SAMPLES / "torch_dist_fully"
    whole = values(src).to_dict()
    docs = [values(src, shard=(k, n)).to_dict() for k in range(n)]
    for d in docs:
        validate_document(d)
    assert sum(d["bytes_read"] for d in docs) == whole["bytes_read"]
    _same_scan(whole, merge_values_reports(docs).to_dict())


def _same_scan(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal but for the float rounding of mean / std / L2 (merged in another order)."""
    strip = ("mean", "std", "l2")
    assert len(a["tensors"]) == len(b["tensors"])
    for x, y in zip(a["tensors"], b["tensors"]):
        assert {k: v for k, v in x.items() if k not in strip} == {k: v for k, v in y.items() if k not in strip}
        for k in strip:
            assert x[k] == pytest.approx(y[k], rel=1e-12)
    assert a["status"] == b["status"] and a["findings"] == b["findings"]


def test_workers_equal_one_process() -> None:
    ckpt = read(SAMPLES / "torch_dist")
    _same_scan(values_report(ckpt, workers=1).to_dict(), values_report(ckpt, workers=2).to_dict())


def test_zarr_values_equal_the_chunk_files() -> None:
    """Megatron's zarr chunk files read by numpy (C order, edge chunks padded to the full chunk shape)."""
    root = SAMPLES / "mcore_0_15_3_zarr"
    ckpt = read(root)
    r = by_key(values(root))
    seen = 0
    for t in ckpt.tensors:
        meta = json.loads((Path(ckpt.data_dir) / t.key / ".zarray").read_text())
        full = tuple(meta["chunks"])
        parts = []
        for c in t.chunks:
            a = np.fromfile(Path(ckpt.data_dir) / c.storage.file, dtype=meta["dtype"]).reshape(full)
            parts.append(a[tuple(slice(0, n) for n in c.sizes)].astype(np.float64).ravel())
        x = np.concatenate(parts)
        s = r[t.key].judged
        assert s.count == x.size and s.min == x.min() and s.max == x.max(), t.key
        seen += 1
    assert seen == len(ckpt.tensors) > 10


def test_truncated_file_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    dst = tmp_path / "ckpt"
    shutil.copytree(SAMPLES / "dcp", dst)
    f = next(dst.rglob("*.distcp"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    res = CliRunner().invoke(app, ["values", str(dst), "-o", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert any(x["code"] == "CK908" for x in doc["findings"])
    assert "Traceback" not in res.output


def test_cli_json_and_csv() -> None:
    res = CliRunner().invoke(app, ["values", str(SAMPLES / "legacy"), "-o", "json", "--progress", "none"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["command"] == "values" and doc["status"] == "complete"
    t = doc["tensors"][0]
    for k in ("key", "dtype", "shape", "count", "nan", "posinf", "neginf", "zeros", "subnormal", "min", "max",
              "mean", "std", "l2", "absmax", "fingerprint", "shard"):
        assert k in t
    csv = CliRunner().invoke(app, ["values", str(SAMPLES / "legacy"), "-o", "csv", "--progress", "none"])
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0].startswith("key,shard,dtype,shape")
    assert len(csv.stdout.splitlines()) == len(doc["tensors"]) + 1


def test_merge_refuses_what_is_not_one_scan(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    a.write_text(values(SAMPLES / "legacy", shard=(0, 2)).to_json())
    res = CliRunner().invoke(app, ["values-merge", str(a)])
    assert res.exit_code == 2 and "0..N-1" in res.output
    whole = tmp_path / "w.json"
    whole.write_text(values(SAMPLES / "legacy").to_json())
    res = CliRunner().invoke(app, ["values-merge", str(whole)])
    assert res.exit_code == 2


@pytest.mark.parametrize("name", ["safetensors", "safetensors_sharded"])
def test_safetensors_values_equal_the_library(name: str) -> None:
    """Hugging Face safetensors spans read raw: counts, min, max and fingerprints against `safetensors.numpy`'s
    reading (bf16 widened by torch); the sharded set equals the single file where they hold the same tensors."""
    st = pytest.importorskip("safetensors.torch")
    root = SAMPLES / name
    r = by_key(values(root))
    seen = 0
    for f in sorted(root.glob("*.safetensors")):
        for k, v in st.load_file(str(f)).items():
            x = v.double().flatten()
            s = r[k].judged
            assert s.count == x.numel() and r[k].values.complete, k
            if x.numel():
                assert s.min == float(x.min()) and s.max == float(x.max()), k
            seen += 1
    assert seen == len(r)
    single = by_key(values(SAMPLES / "safetensors"))
    for k, t in r.items():
        if k in single:
            assert t.values.fingerprint == single[k].values.fingerprint


def test_bf16_weight_desynced_from_its_fp32_main_param(tmp_path: Path) -> None:
    """Megatron's per-parameter layout (`optimizer.state.param.<key>` beside `<key>`), written by `dcp.save`: a
    bf16 weight equal to the nearest-even rounding of its main param is fine (ties included), one element off is
    CK911 at that element."""
    torch.manual_seed(2)
    main = torch.randn(16, 8)
    main[0, 0] = 1.0 + 2.0 ** -8  # a tie between two bf16 values: nearest-even keeps 1.0
    main[0, 1] = math.nan
    healthy = {"decoder.w": main.to(torch.bfloat16), "optimizer.state.param.decoder.w": main.clone()}
    r = values(save_dcp(tmp_path / "ok", healthy))
    assert not [f for f in r.findings if f.code == "CK911"]
    off = dict(healthy)
    off["decoder.w"] = main.to(torch.bfloat16)
    off["decoder.w"][3, 4] += 1.0
    r = values(save_dcp(tmp_path / "off", off))
    (f,) = [f for f in r.findings if f.code == "CK911"]
    assert f.details["first_index"] == [3, 4] and f.details["mismatched"] == 1 and r.status.value == "corrupt"
    assert f.details["compared"] == 128
    docs = [values(tmp_path / "off", shard=(k, 2)).to_dict() for k in range(2)]
    assert sum(1 for d in docs for x in d["findings"] if x["code"] == "CK911") == 1
    assert [x["code"] for x in merge_values_reports(docs).to_dict()["findings"]].count("CK911") == 1


def test_a_huge_expanded_legacy_view_is_not_scanned_element_by_element(tmp_path: Path) -> None:
    """`torch.save` keeps `zeros(1).expand(2**33)` as 4 stored bytes and a zero stride: the scan refuses to walk
    8 Gi logical elements (CK908, no status change) instead of hanging; diff compares it as stored."""
    d = tmp_path / "iter_0000001" / "mp_rank_00"
    d.mkdir(parents=True)
    shutil.copy(next((SAMPLES / "legacy").glob("iter_*/mp_rank_00_000/model_optim_rng.pt")), d / "model_optim_rng.pt")
    sd = torch.load(d / "model_optim_rng.pt", map_location="cpu", weights_only=False)
    sd["model"]["huge"] = torch.zeros(1).expand(1 << 33)
    sd["args"].tensor_model_parallel_size = 1
    sd["args"].pipeline_model_parallel_size = 1
    torch.save(sd, d / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    r = values(tmp_path)
    (f,) = [f for f in r.findings if f.code == "CK908" and f.details["tensor"] == "model.huge"]
    assert "repeats" in f.message and r.status.value != "corrupt"


def test_per_rank_dcp_copies_are_read_once_and_not_compared() -> None:
    """`dcp.save(use_collectives=False)`: each rank its own metadata; "plain" is saved by both ranks with other
    values (torch.full(2, rank)), each rank's own state: read once (rank 0's), no finding."""
    r = values(SAMPLES / "dcp_writers" / "per_rank")
    assert r.status.value == "complete" and not {f.code for f in r.findings} & VALUE_CODES
    plain = by_key(r)["plain"]
    assert plain.values.complete and plain.judged.count == 2 and plain.judged.max == 0.0  # rank 0's copy
