"""Acceptance cases: Hugging Face safetensors (CK140-CK155), each a copy of the real samples (written by
`safetensors.torch.save_file`, tools/make_safetensors_samples.py) with one damage a truncated upload, a bad writer
or a hand-edited index makes. The byte-level detail of each code is in tests/unit/formats/test_safetensors.py.

Part of the corpus gathered in `tests/support/corpus.py`."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corpus_kit import Case, Ctx, S, copy_source

ST, SH = ("safetensors",), ("safetensors_sharded",)
INDEX = "model.safetensors.index.json"
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(header: dict[str, Any], data: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def single(edit: Callable[[Path], None]) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        d = copy_source(ctx, "safetensors")
        edit(d / "model.safetensors")
        return d
    return build


def sharded(edit: Callable[[Path], None]) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        d = copy_source(ctx, "safetensors_sharded")
        edit(d)
        return d
    return build


def _header(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(f: Path) -> None:
        h, data = _split(f.read_bytes())
        fn(h)
        f.write_bytes(_join(h, data))
    return edit


def _raw(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    return lambda f: f.write_bytes(fn(f.read_bytes()))


def _index(fn: Callable[[dict[str, str]], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        doc = json.loads((d / INDEX).read_text())
        fn(doc["weight_map"])
        (d / INDEX).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return edit


def _two_shards(d: Path) -> None:
    h1, d1 = _split((d / SHARD1).read_bytes())
    h2, d2 = _split((d / SHARD2).read_bytes())
    ent = h1["transformer.wte.weight"]
    b, e = ent["data_offsets"]
    h2["transformer.wte.weight"] = {**ent, "data_offsets": [len(d2), len(d2) + e - b]}
    (d / SHARD2).write_bytes(_join(h2, d2 + d1[b:e]))


def _gap(h: dict[str, Any]) -> None:
    middle = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])[5]
    del h[middle]


def _set(name: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda h: h.__setitem__(name, {**h[name], **fields})


LN = "transformer.ln_f.weight"
SAFETENSORS_CASES: tuple[Case, ...] = (
    Case("ok_safetensors", single(lambda f: None), "complete", absent=S({"CK140", "CK145", "CK148"}), sources=ST),
    Case("ok_safetensors_sharded", sharded(lambda d: None), "complete", absent=S({"CK150", "CK152"}), sources=SH),
    Case("st_header_length_huge", single(_raw(lambda r: struct.pack("<Q", 2 ** 63) + r[8:])), "corrupt",
         S({"CK140"}), sources=ST),
    Case("st_header_not_json", single(_raw(lambda r: r[:8] + b"{not json" + b" " * (struct.unpack("<Q", r[:8])[0] - 9)
                                             + r[8 + struct.unpack("<Q", r[:8])[0]:])), "corrupt", S({"CK141"}),
         sources=ST),
    Case("st_header_nested_deep", single(_raw(lambda r: (lambda deep: struct.pack("<Q", len(deep)) + deep
                                                          + _split(r)[1])(b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}"))),
         "corrupt", S({"CK142"}), sources=ST),
    Case("st_entry_malformed", single(_header(_set(LN, data_offsets=[64, 0]))), "corrupt", S({"CK143"}), sources=ST),
    Case("st_unknown_dtype", single(_header(_set(LN, dtype="F33"))), "corrupt", S({"CK144"}), sources=ST),
    Case("st_dtype_size", single(_header(_set(LN, dtype="F16"))), "corrupt", S({"CK145"}), sources=ST),
    Case("st_truncated", single(_raw(lambda r: r[:-4])), "corrupt", S({"CK146"}), S({"CK202"}), sources=ST),
    Case("st_overlap", single(_header(lambda h: h.__setitem__("transformer.h.0.ln_1.bias",
                                                              dict(h["transformer.h.0.ln_1.weight"])))),
         "corrupt", S({"CK147"}), sources=ST),
    Case("st_gap", single(_header(_gap)), "corrupt", S({"CK148"}), sources=ST),
    Case("st_trailing", single(_raw(lambda r: r + b"\0garbage")), "corrupt", S({"CK149"}), sources=ST),
    Case("st_index_names_absent_tensor", sharded(_index(lambda wm: wm.update({"lm_head.weight": SHARD1}))),
         "corrupt", S({"CK150"}), sources=SH),
    Case("st_tensor_in_two_shards", sharded(_two_shards), "corrupt", S({"CK151"}), sources=SH),
    Case("st_shard_missing", sharded(lambda d: (d / SHARD2).unlink()), "corrupt", S({"CK152"}), sources=SH),
    Case("st_shard_unlisted", sharded(_index(lambda wm: [wm.pop(k) for k in [k for k, v in wm.items() if v == SHARD2]])),
         "complete", S({"CK153"}), sources=SH),
    Case("st_index_malformed", sharded(lambda d: (d / INDEX).write_text("[]")), "corrupt", S({"CK154"}), sources=SH),
    Case("st_tensor_not_in_index", sharded(_index(lambda wm: wm.pop(LN))), "corrupt", S({"CK155"}), sources=SH),
)
