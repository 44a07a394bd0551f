"""`render/json_doc.dumps` writes exactly `json.dumps(doc, indent=2, ensure_ascii=True, allow_nan=False)`.

Its fast form (`_indented`) spells plain documents itself; anything else goes to `json.dumps`. Both must give the
same text: compared on the real documents of every sample (`audit`, `info`, `ls` as the CLI builds them) and on
random documents with the values the fast form inlines or refuses (non-ASCII and control characters, lone
surrogates, huge ints, NaN, tuple keys, int keys, empty containers, deep nesting, objects with `to_dict`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ckptinspect import api
from ckptinspect.render import json_doc
from conftest import SAMPLES


def _reference(doc: Any) -> str:
    return json.dumps(doc, indent=2, default=json_doc._default, ensure_ascii=True, allow_nan=False)


def _random(rng: random.Random, depth: int) -> Any:
    leaves = [0, -1, 2**63, 10**40, 3.5, -0.0, 1e300, True, False, None, "", "plain", "tab\there", "é ü", "\udcff",
              "\x1b[31m", "quote\"back\\slash", "雪"]
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return [_random(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if rng.random() < 0.2:
        return tuple(_random(rng, depth + 1) for _ in range(rng.randrange(0, 3)))
    return {rng.choice(leaves[12:]) + str(i): _random(rng, depth + 1) for i in range(rng.randrange(0, 5))}


def test_plain_documents_take_the_fast_form_and_match_json() -> None:
    rng = random.Random(11)
    for _ in range(400):
        doc = {"root": _random(rng, 0)}
        assert json_doc._indented(doc) == _reference(doc)
        assert json_doc.dumps(doc) == _reference(doc)


@pytest.mark.parametrize("doc", [
    {"nan": float("nan")}, {"inf": [1, float("inf")]}, {1: "int key"}, {("a", 1): "tuple key"},
    {"big": 10**5000}, {"set": {3, 1, 2}}, {"bytes": b"\x00\x01"}, {"path": Path("/x")},
], ids=["nan", "inf", "int-key", "tuple-key", "huge-int", "set", "bytes", "path"])
def test_what_the_fast_form_refuses_is_written_as_before(doc: dict[Any, Any]) -> None:
    with pytest.raises((json_doc._Unsupported, ValueError)):
        json_doc._indented(doc)
    try:
        want = _reference(doc)
    except (TypeError, ValueError):
        want = json.dumps(json_doc._str_keys(doc, 0), indent=2, default=json_doc._default, ensure_ascii=True,
                          allow_nan=False)
    assert json_doc.dumps(doc) == want


def test_deep_nesting_falls_back_like_json() -> None:
    doc: Any = []
    for _ in range(5000):
        doc = [doc]
    assert json_doc.dumps({"deep": doc}).startswith("{\n  \"deep\": ")


@pytest.mark.parametrize("path", sorted(p for p in SAMPLES.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_every_sample_document_is_json_dumps_text(path: Path) -> None:
    docs = [api.audit(path).to_dict(), api.info(path).to_dict()]
    for doc in docs:
        assert json_doc._indented(doc) == _reference(doc)  # the fast form, not its fallback
        assert json_doc.dumps(doc) == _reference(doc)
