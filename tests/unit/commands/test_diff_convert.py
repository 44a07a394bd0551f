"""Conversion diff (`commands/diff/convert.py`) over real exports: Megatron-LM core_v0.16.1's own HF -> Megatron
converter (tools/checkpoint/convert.py, loader llama_mistral, saver core) applied to tiny transformers Llama models
(tests/data/hf_exports/, rebuilt by tools/make_hf_export_samples.py). The healthy pairs must be proven equal with
every parameter accounted for; each damaged copy (a tmp_path copy rewritten by the small safetensors writer below)
must come out not-equal with its named finding."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptinspect.commands.diff.convert import compare_conversion
from ckptinspect.commands.diff.diff import diff_paths
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.resolve import resolve_checkpoint

DATA = Path(__file__).resolve().parents[2] / "data" / "hf_exports"
_CODES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8"}
_NAMES = {v: k for k, v in _CODES.items()}


def load_st(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=_CODES[e["dtype"]]).reshape(e["shape"]).copy()
        out[k] = (e["dtype"], arr)
    return out


def save_st(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, pos = [], 0
    for k in sorted(tensors):
        dt, arr = tensors[k]
        b = np.ascontiguousarray(arr).tobytes()
        header[k] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _read(p: Path) -> Any:
    path, label = resolve_checkpoint(p)
    return read_checkpoint(path, label)


def conv(src: Path, hf: Path) -> Any:
    return compare_conversion(_read(src), _read(hf))


def codes(r: Any) -> set[str]:
    return {f.code for f in r.findings}


@pytest.fixture
def untied(tmp_path: Path) -> Path:
    out = tmp_path / "hf"
    shutil.copytree(DATA / "llama_gqa_hf", out)
    return out


@pytest.fixture
def tied(tmp_path: Path) -> Path:
    out = tmp_path / "hf_tied"
    shutil.copytree(DATA / "llama_gqa_tied_hf", out)
    return out


def edit(hf: Path, fn: Any, name: str = "model.safetensors") -> None:
    t = load_st(hf / name)
    fn(t)
    save_st(hf / name, t)


SRC = DATA / "llama_gqa_mcore"
SRC_TIED = DATA / "llama_gqa_tied_mcore"


# --- healthy real exports ------------------------------------------------------------------------------------------

def test_real_import_is_equal_with_every_parameter_accounted_for() -> None:
    r = conv(SRC, DATA / "llama_gqa_hf")
    assert r.equal and not r.findings and r.architecture == "llama"
    m = _read(SRC)
    model = {t.key[len("model."):] for t in m.tensors if t.key.startswith("model.") and "_extra_state" not in t.key}
    assert {p.source for p in r.params} == model  # each source parameter mapped ...
    targets = [t for p in r.params for t in p.targets]
    hf = {t.key for t in _read(DATA / "llama_gqa_hf").tensors}
    assert sorted(targets) == sorted(hf)  # ... to exactly one target each, and every export tensor claimed once
    assert all(p.status == "equal" and p.mode == "exact" for p in r.params)
    emb = next(p for p in r.params if p.source == "embedding.word_embeddings.weight")
    assert emb.padding_rows == 28  # Megatron padded the 100-token vocabulary to 128 rows
    assert sum(p.compared_elements for p in r.params) == sum(t.numel for t in _read(DATA / "llama_gqa_hf").tensors)


def imported(hf: Path) -> Any:
    """The tied pair in its real direction: the fp32 HF model imported as bf16 (`--bf16`)."""
    return compare_conversion(_read(hf), _read(SRC_TIED))


def test_real_tied_sharded_bf16_import_is_exact_rounding() -> None:
    r = imported(DATA / "llama_gqa_tied_hf")
    assert r.equal, r.findings
    assert r.direction == "hf_to_megatron" and {p.mode for p in r.params} == {"rounding"}
    assert {p.source_dtype for p in r.params} == {"bfloat16"} and {d for p in r.params for d in p.target_dtypes} == {
        "float32"}
    assert "output_layer.weight" not in {p.source for p in r.params}
    assert len(list((DATA / "llama_gqa_tied_hf").glob("model-*.safetensors"))) > 1


def test_the_bf16_import_read_as_an_export_is_not_equal() -> None:
    # as an export (Megatron bf16 -> HF fp32) the HF values would have to be exact widenings: they are not
    r = conv(SRC_TIED, DATA / "llama_gqa_tied_hf")
    assert r.direction == "megatron_to_hf" and not r.equal and codes(r) == {"CK966"}


def test_reverse_direction_and_the_diff_result() -> None:
    r = diff_paths(DATA / "llama_gqa_hf", SRC)
    assert r.conversion is not None and r.conversion.direction == "hf_to_megatron"
    assert r.identical and not r.blocking
    d = r.to_dict()["conversion"]
    assert d["equal"] and d["counts"] == {"equal": 15} and d["unmapped"] == [] and d["extra"] == []


def test_torch_dist_source_with_stacked_layers_and_te_norm_names() -> None:
    # Megatron-LM's --ckpt-convert-format torch_dist of the converter's save: layers stacked along axis 0, the norms
    # under TE's fused names (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight)
    dist = DATA / "llama_gqa_dist" / "torch_dist"
    keys = {t.key for t in _read(dist).tensors}
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in keys
    r = conv(dist, DATA / "llama_gqa_hf")
    assert r.equal, r.findings
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in {p.source for p in r.params}
    assert sum(p.compared_elements for p in r.params) == sum(t.numel for t in _read(DATA / "llama_gqa_hf").tensors)


def test_torch_dist_source_catches_a_swapped_layer(untied: Path) -> None:
    def swap(t: dict[str, Any]) -> None:
        a, b = "model.layers.0.input_layernorm.weight", "model.layers.1.input_layernorm.weight"
        t[a], t[b] = t[b], t[a]
    edit(untied, swap)
    r = conv(DATA / "llama_gqa_dist" / "torch_dist", untied)
    assert codes(r) == {"CK966"} and {f.details["source"] for f in r.findings} == {
        "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
        "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"}


def test_tied_lm_head_present_and_equal_is_accepted(tied: Path) -> None:
    emb = next(f for f in tied.glob("model-*.safetensors") if "model.embed_tokens.weight" in load_st(f))
    edit(tied, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"]), emb.name)
    index = json.loads((tied / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = emb.name
    (tied / "model.safetensors.index.json").write_text(json.dumps(index))
    assert imported(tied).equal


# --- negative cases from the real exports --------------------------------------------------------------------------

def test_a_layer_tensor_missing(untied: Path) -> None:
    edit(untied, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    r = conv(SRC, untied)
    assert not r.equal and codes(r) == {"CK961"}
    assert [f.subject for f in r.findings] == ["decoder.layers.1.mlp.linear_fc2.weight"]


def test_ignore_leaves_keys_out_on_both_sides(untied: Path) -> None:
    edit(untied, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    r = compare_conversion(_read(SRC), _read(untied), ignore=("decoder.layers.1.mlp.linear_fc2.weight",))
    assert r.equal and len(r.params) == 14


def test_renamed_keys(untied: Path) -> None:
    def rename(t: dict[str, Any]) -> None:
        for k in [k for k in t if ".self_attn." in k and k.startswith("model.layers.0.")]:
            t[k.replace(".self_attn.", ".attention.")] = t.pop(k)
    edit(untied, rename)
    r = conv(SRC, untied)
    assert not r.equal and codes(r) == {"CK961", "CK962"}
    assert "model.layers.0.attention.q_proj.weight" in r.extra


def test_qkv_not_deinterleaved(untied: Path) -> None:
    def naive(t: dict[str, Any]) -> None:  # the fused rows cut [q | k | v] without undoing the per-group interleave
        for layer in (0, 1):
            p = f"model.layers.{layer}.self_attn."
            q, k, v = (t[p + n + "_proj.weight"][1] for n in "qkv")
            groups = [np.concatenate([q[g * 32:(g + 1) * 32], k[g * 16:(g + 1) * 16], v[g * 16:(g + 1) * 16]])
                      for g in range(2)]
            fused = np.concatenate(groups)
            t[p + "q_proj.weight"] = ("F32", fused[:64])
            t[p + "k_proj.weight"] = ("F32", fused[64:96])
            t[p + "v_proj.weight"] = ("F32", fused[96:])
    edit(untied, naive)
    r = conv(SRC, untied)
    assert not r.equal and codes(r) == {"CK966"}
    assert {f.subject for f in r.findings} >= {"model.layers.0.self_attn.q_proj.weight"}


def test_gate_up_swapped(untied: Path) -> None:
    def swap(t: dict[str, Any]) -> None:
        g, u = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
        t[g], t[u] = t[u], t[g]
    edit(untied, swap)
    r = conv(SRC, untied)
    assert codes(r) == {"CK966"} and {f.subject for f in r.findings} == {"model.layers.0.mlp.gate_proj.weight",
                                                                         "model.layers.0.mlp.up_proj.weight"}


@pytest.mark.parametrize("rows", [90, 128])
def test_vocab_rows_truncated_or_padding_kept(untied: Path, rows: int) -> None:
    def cut(t: dict[str, Any]) -> None:
        dt, a = t["model.embed_tokens.weight"]
        t["model.embed_tokens.weight"] = (dt, a[:rows] if rows < len(a) else np.concatenate(
            [a, np.zeros((rows - len(a), a.shape[1]), a.dtype)]))
    edit(untied, cut)
    r = conv(SRC, untied)
    assert not r.equal and codes(r) == {"CK968"}


def test_tied_embedding_dropped(tied: Path) -> None:
    cfg = json.loads((tied / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (tied / "config.json").write_text(json.dumps(cfg))
    r = imported(tied)
    assert not r.equal and codes(r) == {"CK967"}


def test_tie_declared_for_an_untied_source(untied: Path) -> None:
    cfg = json.loads((untied / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (untied / "config.json").write_text(json.dumps(cfg))
    assert codes(conv(SRC, untied)) == {"CK967"}


def test_wrong_dtype(untied: Path) -> None:
    def half(t: dict[str, Any]) -> None:
        t["model.layers.1.self_attn.o_proj.weight"] = ("F16", t["model.layers.1.self_attn.o_proj.weight"][1]
                                                       .astype("<f2"))
    edit(untied, half)
    r = conv(SRC, untied)
    assert not r.equal and "CK965" in codes(r)


def test_shard_missing_from_the_index(tied: Path) -> None:
    index = json.loads((tied / "model.safetensors.index.json").read_text())
    dropped = "model-00002-of-00004.safetensors"
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != dropped}
    (tied / "model.safetensors.index.json").write_text(json.dumps(index))
    r = imported(tied)
    assert not r.equal and codes(r) == {"CK961"}
    assert all("not in model.safetensors.index.json" in f.message for f in r.findings)


def test_shard_file_deleted(tied: Path) -> None:
    (tied / "model-00003-of-00004.safetensors").unlink()
    r = imported(tied)
    assert not r.equal and "CK961" in codes(r)


def test_one_value_changed(untied: Path) -> None:
    def poke(t: dict[str, Any]) -> None:
        a = t["model.norm.weight"][1]
        a[3] = np.nextafter(a[3], np.float32(9))
    edit(untied, poke)
    r = conv(SRC, untied)
    assert codes(r) == {"CK966"}
    f = r.findings[0]
    assert f.details["mismatched_elements"] == 1 and f.details["first_row"] == 3


def test_unknown_architecture_is_unmapped_never_equal(untied: Path) -> None:
    cfg = json.loads((untied / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (untied / "config.json").write_text(json.dumps(cfg))
    r = conv(SRC, untied)
    assert not r.equal and r.architecture is None and codes(r) == {"CK960"}
    assert "embedding.word_embeddings.weight" in r.unmapped


# --- dtype narrowing: exact rounding -------------------------------------------------------------------------------

def _bf16(a: np.ndarray) -> np.ndarray:
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def _to_bf16_export(hf: Path, poke: bool = False) -> None:
    def narrow(t: dict[str, Any]) -> None:
        for k, (_, a) in list(t.items()):
            t[k] = ("BF16", _bf16(a))
        if poke:
            t["model.layers.0.mlp.up_proj.weight"][1][0, 0] ^= 1  # one ulp off the rounding
    edit(hf, narrow)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (hf / "config.json").write_text(json.dumps(cfg))


def test_fp32_to_bf16_export_is_exact_rounding(untied: Path) -> None:
    _to_bf16_export(untied)
    r = conv(SRC, untied)
    assert r.equal and {p.mode for p in r.params} == {"rounding"}


def test_fp32_to_bf16_one_ulp_off(untied: Path) -> None:
    _to_bf16_export(untied, poke=True)
    r = conv(SRC, untied)
    assert codes(r) == {"CK966"} and r.findings[0].subject == "model.layers.0.mlp.up_proj.weight"
    assert r.findings[0].details["mismatched_elements"] == 1


# --- the CLI: exit code and the JSON document against docs/schema/diff.schema.json ----------------------------------

def test_cli_exit_codes_and_schema(untied: Path) -> None:
    from typer.testing import CliRunner

    from ckptinspect.cli.app import app
    from schemas import validate_document

    ok = CliRunner().invoke(app, ["diff", str(SRC), str(DATA / "llama_gqa_hf"), "-o", "json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    validate_document(doc)
    assert doc["identical"] and doc["conversion"]["counts"] == {"equal": 15}
    edit(untied, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    bad = CliRunner().invoke(app, ["diff", str(SRC), str(untied), "-o", "json"])
    assert bad.exit_code == 1, bad.output
    doc = json.loads(bad.stdout)
    validate_document(doc)
    assert doc["blocking"] and [f["code"] for f in doc["conversion"]["findings"]] == ["CK961"]
    text = CliRunner().invoke(app, ["diff", str(SRC), str(untied)])
    assert text.exit_code == 1 and "CK961" in text.stdout
    html = CliRunner().invoke(app, ["diff", str(SRC), str(untied), "-o", "html"])
    assert html.exit_code == 1 and "conversion CK961" in html.stdout and 'data-verdict="blocking"' in html.stdout


def test_conversion_diff_never_imports_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from ckptinspect.commands.diff.diff import diff_paths; "
            f"r = diff_paths(Path({str(DATA / 'llama_gqa_dist' / 'torch_dist')!r}), Path({str(DATA / 'llama_gqa_hf')!r})); "
            "assert r.identical; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
