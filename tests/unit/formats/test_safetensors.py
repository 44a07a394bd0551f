"""Hugging Face safetensors (`formats/safetensors.py`): the real samples written by `safetensors.torch.save_file`
(`tools/make_safetensors_samples.py`) audit complete; hostile files made by editing those samples' bytes each give
their code, through the CLI, with exit 1 and no traceback."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _unprivileged import unprivileged  # noqa: F401 - the fixture
from ckptinspect.cli.app import app
from ckptinspect.findings import CODES
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.safetensors_header import MAX_HEADER_BYTES
from ckptinspect.model import Format

SAMPLES = Path(__file__).resolve().parents[3] / "sample_ckpts"
SINGLE = SAMPLES / "safetensors"
SHARDED = SAMPLES / "safetensors_sharded"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
runner = CliRunner()


def audit(path: Path, code: int = 1) -> dict[str, Any]:
    r = runner.invoke(app, ["audit", str(path), "-o", "json"], env={"CKPTINSPECT_WIDTH": "200"})
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def codes(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"]}


def only(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["code"] == code]


def split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, data) of a safetensors file's bytes, parsed here without the reader under test."""
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join(header: dict[str, Any], data: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the library pads its header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


@pytest.fixture
def single(tmp_path: Path) -> Path:
    shutil.copytree(SINGLE, tmp_path / "st")
    return tmp_path / "st" / "model.safetensors"


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    shutil.copytree(SHARDED, tmp_path / "sharded")
    return tmp_path / "sharded"


def edit_header(path: Path, **entries: Any) -> None:
    """Set header entries of the file at `path` (None removes one); its data stays as the library wrote it."""
    header, data = split(path.read_bytes())
    for name, value in entries.items():
        name = name.replace("__", ".")
        if value is None:
            del header[name]
        else:
            header[name] = value
    path.write_bytes(join(header, data))


def edit_index(path: Path, fn: Any) -> None:
    doc = json.loads((path / INDEX).read_text())
    fn(doc["weight_map"])
    (path / INDEX).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


# --- the healthy samples ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [SINGLE, SINGLE / "model.safetensors", SHARDED], ids=["dir", "file", "sharded"])
def test_healthy_samples_are_complete_without_findings(path: Path) -> None:
    doc = audit(path, code=0)
    assert doc["status"] == "complete"
    assert [f["code"] for f in doc["findings"] if f["severity"] != "info"] == []
    sniff = runner.invoke(app, ["sniff", str(path), "-o", "json"])
    assert json.loads(sniff.stdout)["format"] == "safetensors"


def test_the_model_is_the_headers_spans() -> None:
    c = read_checkpoint(SHARDED, str(SHARDED))
    assert c.format is Format.SAFETENSORS and c.raw_tensor_items
    assert len(c.tensors) == 20 and not c.findings
    header, _ = split((SHARDED / SHARD1).read_bytes())
    n = struct.unpack("<Q", (SHARDED / SHARD1).read_bytes()[:8])[0]
    t = {x.key: x for x in c.tensors}["transformer.wte.weight"]
    begin, end = header["transformer.wte.weight"]["data_offsets"]
    (chunk,) = t.chunks
    assert chunk.offsets == (0, 0) and chunk.sizes == (100, 16) and t.dtype == "float32"
    assert chunk.storage is not None and (chunk.storage.file, chunk.storage.offset, chunk.storage.length) == \
        (SHARD1, 8 + n + begin, end - begin)
    roles = {f.name: f.role.value for f in c.files}
    assert roles == {SHARD1: "data", SHARD2: "data", INDEX: "metadata"}
    assert c.common is not None and c.common["__metadata__"][SHARD1] == {"format": "pt"}
    assert c.common["index_metadata"] == {"total_size": 31944}
    assert {x.key: x.dtype for x in c.tensors}["transformer.wpe.weight"] == "bfloat16"


def test_a_zero_element_tensor_is_legal() -> None:
    header, _ = split((SINGLE / "model.safetensors").read_bytes())
    begin, end = header["transformer.unused_experts"]["data_offsets"]
    assert begin == end and header["transformer.unused_experts"]["shape"] == [0, 16]
    c = read_checkpoint(SINGLE, str(SINGLE))
    assert {t.key: t.shape for t in c.tensors}["transformer.unused_experts"] == (0, 16) and not c.findings


def test_a_dcp_hf_layout_stays_torch_dcp() -> None:
    hf = SAMPLES / "dcp_writers" / "hf_rank0"
    if not hf.exists():
        pytest.skip("no DCP HF sample")
    assert read_checkpoint(hf, str(hf)).format is Format.TORCH_DCP


# --- hostile headers ----------------------------------------------------------------------------------------------


def test_header_length_2_to_the_63(single: Path) -> None:
    raw = single.read_bytes()
    single.write_bytes(struct.pack("<Q", 2 ** 63) + raw[8:])
    doc = audit(single.parent)
    assert doc["status"] == "corrupt" and codes(doc) >= {"CK140"}
    assert only(doc, "CK140")[0]["subject"] == "model.safetensors"


def test_header_length_past_eof_and_over_the_bound(single: Path) -> None:
    raw = single.read_bytes()
    single.write_bytes(struct.pack("<Q", len(raw) - 7) + raw[8:])
    assert "CK140" in codes(audit(single.parent))
    single.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 8) + raw[8:] + b" " * (MAX_HEADER_BYTES + 8))
    f = only(audit(single.parent), "CK140")
    assert f and "bound" in f[0]["message"]


def test_header_not_json(single: Path) -> None:
    raw = single.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    single.write_bytes(raw[:8] + b"{not json" + b" " * (n - 9) + raw[8 + n:])
    doc = audit(single.parent)
    assert codes(doc) == {"CK141", "CK400"} and doc["status"] == "corrupt"
    single.write_bytes(struct.pack("<Q", 8) + b"[1, 2]  ")
    assert "CK141" in codes(audit(single.parent))


def test_header_nested_10000_deep(single: Path) -> None:
    _, data = split(single.read_bytes())
    deep = b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}"
    single.write_bytes(struct.pack("<Q", len(deep)) + deep + data)
    doc = audit(single.parent)
    assert "CK142" in codes(doc) and doc["status"] == "corrupt"


@pytest.mark.parametrize("offsets", [[-1, 63], [0, 2 ** 63], [64, 0], [0, 64, 128]])
def test_entry_malformed(single: Path, offsets: list[int]) -> None:
    """Negative, past int64 (once an OverflowError out of the chunk table), reversed, three offsets."""
    edit_header(single, transformer__ln_f__weight={"dtype": "F32", "shape": [16], "data_offsets": offsets})
    assert codes(audit(single.parent)) == {"CK143", "CK400"}


def test_a_zero_element_shape_with_a_huge_dim_is_malformed(single: Path) -> None:
    """[0, 2**70] has no element, but its dim fits no int64 (once an OverflowError out of the chunk table)."""
    header, _ = split(single.read_bytes())
    edit_header(single, transformer__unused_experts={**header["transformer.unused_experts"], "shape": [0, 2 ** 70]})
    assert codes(audit(single.parent)) == {"CK143", "CK400"}


# --- spans --------------------------------------------------------------------------------------------------------


def test_overlapping_spans(single: Path) -> None:
    header, _ = split(single.read_bytes())
    w = header["transformer.h.0.ln_1.weight"]
    edit_header(single, transformer__h__0__ln_1__bias=dict(w))  # same dtype and shape, the weight's span
    f = only(audit(single.parent), "CK147")
    assert f and {f[0]["subject"], f[0]["details"]["other"]} == {"transformer.h.0.ln_1.weight",
                                                                  "transformer.h.0.ln_1.bias"}
    assert f[0]["details"]["file"] == "model.safetensors"


def test_gap(single: Path) -> None:
    header, _ = split(single.read_bytes())
    # a tensor removed from the header: its bytes stay, held by no tensor
    middle = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"] if kv[0] != "__metadata__" else [-1])[5][0]
    edit_header(single, **{middle.replace(".", "__"): None})
    doc = audit(single.parent)
    assert codes(doc) == {"CK148", "CK400"} and doc["status"] == "corrupt"
    assert only(doc, "CK148")[0]["details"]["file"] == "model.safetensors"


def test_trailing_garbage(single: Path) -> None:
    single.write_bytes(single.read_bytes() + b"\0garbage")
    doc = audit(single.parent)
    assert codes(doc) == {"CK149", "CK400"} and only(doc, "CK149")[0]["details"]["trailing_bytes"] == 8


def test_wrong_dtype_size_and_unknown_dtype(single: Path) -> None:
    header, _ = split(single.read_bytes())
    edit_header(single, transformer__ln_f__weight={**header["transformer.ln_f.weight"], "dtype": "F16"})
    f = only(audit(single.parent), "CK145")
    assert f and f[0]["subject"] == "transformer.ln_f.weight" and f[0]["details"]["expected_bytes"] == 32
    edit_header(single, transformer__ln_f__weight={**header["transformer.ln_f.weight"], "dtype": "F33"})
    assert codes(audit(single.parent)) == {"CK144", "CK400"}


def test_span_past_the_data_area(single: Path) -> None:
    raw = single.read_bytes()
    single.write_bytes(raw[:-4])  # the last span loses its end
    doc = audit(single.parent)
    assert "CK146" in codes(doc) and "CK202" not in codes(doc) and doc["status"] == "corrupt"


def test_findings_of_one_kind_are_capped(single: Path) -> None:
    header, data = split(single.read_bytes())
    header.update({f"x{i}": {"dtype": "X9", "shape": [0], "data_offsets": [0, 0]} for i in range(30)})
    single.write_bytes(join(header, data))
    f = only(audit(single.parent), "CK144")
    assert len(f) == 21 and f[-1]["details"]["more"] == 10 and f[0]["subject"] == "x0"


# --- the index and its shards -------------------------------------------------------------------------------------


def test_index_names_a_missing_shard(sharded: Path) -> None:
    (sharded / SHARD2).unlink()
    doc = audit(sharded)
    f = only(doc, "CK152")
    assert doc["status"] == "corrupt" and [x["subject"] for x in f] == [SHARD2]
    assert "CK150" not in codes(doc)


def test_tensor_in_two_shards(sharded: Path) -> None:
    h1, d1 = split((sharded / SHARD1).read_bytes())
    h2, d2 = split((sharded / SHARD2).read_bytes())
    ent = h1["transformer.wte.weight"]
    b, e = ent["data_offsets"]
    h2["transformer.wte.weight"] = {**ent, "data_offsets": [len(d2), len(d2) + e - b]}
    (sharded / SHARD2).write_bytes(join(h2, d2 + d1[b:e]))
    doc = audit(sharded)
    f = only(doc, "CK151")
    assert codes(doc) == {"CK151", "CK400"}
    assert f[0]["subject"] == "transformer.wte.weight" and f[0]["details"]["file"] == SHARD2


def test_unlisted_shard(sharded: Path) -> None:
    edit_index(sharded, lambda wm: [wm.pop(k) for k in [k for k, v in wm.items() if v == SHARD2]])
    doc = audit(sharded, code=0)
    assert codes(doc) == {"CK153", "CK400"} and only(doc, "CK153")[0]["subject"] == SHARD2
    assert doc["status"] == "complete"  # a warning: loaders that follow the index never read it


def test_index_names_a_tensor_its_shard_lacks(sharded: Path) -> None:
    edit_index(sharded, lambda wm: wm.update({"lm_head.weight": SHARD1}))
    doc = audit(sharded)
    f = only(doc, "CK150")
    assert codes(doc) == {"CK150", "CK400"} and f[0]["subject"] == "lm_head.weight"
    assert f[0]["details"]["file"] == SHARD1


def test_shard_tensor_missing_from_the_index(sharded: Path) -> None:
    edit_index(sharded, lambda wm: wm.pop("transformer.ln_f.weight"))
    doc = audit(sharded)
    assert codes(doc) == {"CK155", "CK400"} and only(doc, "CK155")[0]["subject"] == "transformer.ln_f.weight"


@pytest.mark.parametrize("text", ["{", "[]", '{"weight_map": []}', '{"weight_map": {"a": "../x.safetensors"}}',
                                  "[" * 10000])
def test_index_malformed(sharded: Path, text: str) -> None:
    (sharded / INDEX).write_text(text)
    doc = audit(sharded)
    assert codes(doc) == {"CK154", "CK400"} and doc["status"] == "corrupt"


def test_every_safetensors_code_is_in_the_reserved_family() -> None:
    mine = {c for c, i in CODES.items() if i.family == "safetensors"}
    assert mine == {f"CK{n}" for n in range(140, 156)}
    assert all(CODES[c].status is not None for c in mine - {"CK153"})


def test_an_unreadable_shard_is_ck209_never_complete(unprivileged: Any) -> None:
    """A shard this user cannot open: not read, so incomplete (CK209), not a broken header (CK140) nor complete."""
    save = unprivileged.copy(SHARDED)
    (save / SHARD2).chmod(0)
    p = unprivileged.cli("audit", str(save), "-o", "json")
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["status"] == "incomplete", doc
    assert "CK209" in codes(doc) and not codes(doc) & {"CK140", "CK150", "CK152"}
