"""Frozen means frozen: the model and every public result carry no mutable dict or list, and the mappings they
hold refuse writes. Walks everything reachable from real results on the bundled samples."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

import ckptinspect

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"

# Known and deliberate: a diff change's A / B values are the JSON values the renderer formats (lists, dicts), and
# the chunk table's per-tensor side tables are the columnar reader's internals (never part of a document).
ALLOWED = {"Change.a", "Change.b", "ChunkTable.orig_shapes", "ChunkTable.transforms"}


def _mutable_fields(root: Any) -> set[str]:
    out: set[str] = set()
    seen: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                v = getattr(o, f.name)
                if o.__dataclass_params__.frozen and isinstance(v, (dict, list, set)):  # type: ignore[attr-defined]
                    out.add(f"{type(o).__name__}.{f.name}")
                stack.append(v)
        elif isinstance(o, (tuple, list)):
            stack.extend(o[:200])
        elif isinstance(o, dict) or type(o).__name__ == "mappingproxy":
            stack.extend(list(o.values())[:200])
    return out


def _results() -> list[Any]:
    s = SAMPLES
    return [
        ckptinspect.audit(s / "torch_dist", all_iterations=True), ckptinspect.audit(s / "legacy"),
        ckptinspect.audit(s / "bridge"), ckptinspect.ls(s / "torch_dist"), ckptinspect.info(s / "legacy"),
        ckptinspect.info(s / "mcore_0_15_3_zarr"), ckptinspect.estimate(checkpoint=s / "moe_ep2"),
        ckptinspect.scan(s / "dcp"), ckptinspect.coverage(s / "dcp"),
        ckptinspect.diff(s / "torch_dist", s / "torch_dist_fully"), ckptinspect.resume(s / "torch_dist", tp=1, pp=1),
        ckptinspect.sniff(s / "nemo2"), ckptinspect.verify_manifest(s / "mcore_0_19_2"),
        ckptinspect.retain(s / "torch_dist", keep_last=1, keep=(1, 9)),
        *ckptinspect.watch(s / "torch_dist", max_polls=1, interval=0),
    ]


def test_no_mutable_dict_or_list_inside_frozen_results() -> None:
    found = set()
    for r in _results():
        found |= _mutable_fields(r)
    assert found <= ALLOWED, sorted(found - ALLOWED)


def test_checkpoint_mappings_refuse_writes() -> None:
    ckpt = ckptinspect.read(SAMPLES / "torch_dist")
    assert ckpt.args is not None and ckpt.common is not None
    for m in (ckpt.args, ckpt.common, ckpt.extra, ckpt.layout, ckpt.topology.sources):
        with pytest.raises(TypeError):
            m["x"] = 1  # type: ignore[index]
    info = ckptinspect.info(SAMPLES / "legacy")
    assert info.checkpoint.shard_args
    with pytest.raises(TypeError):
        next(iter(info.checkpoint.shard_args.values()))["lr"] = 0.5  # type: ignore[index]
    with pytest.raises(TypeError):
        info.summary.by_component["model"] = 0  # type: ignore[index]
    finding = ckptinspect.Finding("CK201", "m", "s", "p", {"a": 1})
    with pytest.raises(TypeError):
        finding.details["a"] = 2  # type: ignore[index]
    assert pickle.loads(pickle.dumps(finding)) == finding  # a finding still travels between processes


def test_a_builder_dict_is_copied_once() -> None:
    """The reader's dict is copied (a later change to it does not reach the model), and `replace` does not copy
    again."""
    args = {"tensor_model_parallel_size": 2}
    ckpt = ckptinspect.read(SAMPLES / "dcp")
    c2 = dataclasses.replace(ckpt, args=args)
    args["tensor_model_parallel_size"] = 4
    assert c2.args == {"tensor_model_parallel_size": 2}
    assert dataclasses.replace(c2, iteration=7).args is c2.args
