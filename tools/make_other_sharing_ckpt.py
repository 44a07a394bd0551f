#!/usr/bin/env python3
"""Write a torch_dist-style checkpoint whose ``.metadata`` shares objects OTHERWISE than ``make_synthetic_ckpt.py``.

The benchmark's generator (b) of issue 31: the reader's fast path must not depend on one writer's object sharing.
``.metadata`` is a real ``torch.distributed.checkpoint.metadata.Metadata`` of torch's own classes, pickled with plain
``pickle.dump`` at the protocol asked (2..5), with Megatron-style ``all_local_plans`` (one ``SavePlan`` per rank)
attached as the last attribute. What differs from ``make_synthetic_ckpt.py``:

* every plan ``WriteItem`` carries its OWN ``ChunkStorageMetadata`` (and its own ``torch.Size`` objects): no plan
  chunk is a memo reference to a ``state_dict_metadata`` chunk;
* ``--strings one`` (default): each key string is ONE object, used by ``state_dict_metadata``, ``storage_data`` and
  every rank's plan (the pickle spells it once, GETs it everywhere after); ``--strings fresh``: no string sharing
  at all, every use of a key or a file name is a new object (spelled every time);
* each plan item's ``TensorProperties`` is the tensor's one object (shared with ``state_dict_metadata``), each
  ``TensorWriteData.size`` a new ``torch.Size``; ``SavePlan(planner_data=None)``; ``MetadataIndex.index`` set on
  every chunk of the 1-D optimizer buckets.

The layout is Megatron-like but simple: TP-split 2-D model weights and 1-D layer norms, and DistributedOptimizer
buckets (three states each) cut into many 1-D pieces with index hints, spread round-robin over the ranks; a few
byte items per rank. The ``__{rank}_0.distcp`` files are sparse (``truncate``) to the size the storage entries
give; ``common.pt`` and ``metadata.json`` are the minimal ones of a finalized save. Deterministic for a given command line.

    python tools/make_other_sharing_ckpt.py /tmp/b2k --chunks 2000 --protocol 4
    python tools/make_other_sharing_ckpt.py /tmp/b200k --chunks 200000 --protocol 5 --strings fresh
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

OPT_STATES = ("param", "exp_avg", "exp_avg_sq")


def _fresh(s: str) -> str:
    """A new str object equal to ``s``."""
    return "".join([s[:1], s[1:]]) if len(s) > 1 else "".join(["", s, ""])


def build(chunks: int, ranks: int, strings: str, seed: int, checkpoint_id: str) -> tuple[Metadata, dict[str, int]]:
    """The Metadata (with ``all_local_plans``) and the size of each data file."""
    rng = random.Random(seed)
    one = strings == "one"
    keys: dict[str, str] = {}

    def key(s: str) -> str:
        if one:
            return keys.setdefault(s, s)
        return _fresh(s)

    # (fqn, global shape, dtype, [(offsets, sizes, index hint)])
    tensors: list[tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...], tuple[int, ...], Any]]]] = []
    total = 0
    layer = 0
    while total < chunks:
        pre = f"decoder.layers.{layer}"
        hidden = 256 * ranks
        for name, shape in ((f"{pre}.self_attention.linear_qkv.weight", (3 * hidden, hidden)),
                            (f"{pre}.self_attention.linear_proj.weight", (hidden, hidden)),
                            (f"{pre}.mlp.linear_fc1.weight", (4 * hidden, hidden))):
            step = shape[0] // ranks
            tensors.append((name, shape, torch.bfloat16,
                            [((r * step, 0), (step, shape[1]), None) for r in range(ranks)]))
            total += ranks
        tensors.append((f"{pre}.self_attention.linear_qkv.layer_norm_weight", (hidden,), torch.bfloat16,
                        [((0,), (hidden,), None)]))
        total += 1
        bucket = rng.randint(4, 40) * ranks
        numel = bucket * 64
        for state in OPT_STATES:
            fqn = f"optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32).bucket_idx_{layer}.{state}"
            tensors.append((fqn, (numel,), torch.float32, [((i * 64,), (64,), i) for i in range(bucket)]))
            total += bucket
        layer += 1

    sdm: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    items: list[list[WriteItem]] = [[] for _ in range(ranks)]
    pos = [0] * ranks
    files = [f"__{r}_0.distcp" for r in range(ranks)]
    turn = 0
    for r in range(ranks):  # byte items first in every file, as Megatron writes them
        for name in (f"rng_state/shard_0.{r}_1.{ranks}", f"optimizer.distributed.dp_group_idx_0.optimizer/shard_{r}"):
            length = 1000 + rng.randrange(5000)
            sdm[key(name)] = BytesStorageMetadata()
            storage[MetadataIndex(key(name))] = _StorageInfo(key(files[r]), pos[r], length)
            pos[r] += length
            items[r].append(WriteItem(index=MetadataIndex(key(name)), type=WriteItemType.BYTE_IO))
    for fqn, shape, dtype, cuts in tensors:
        props = TensorProperties(dtype=dtype)
        md_chunks = []
        for off, size, hint in cuts:
            md_chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size)))
            r = turn % ranks
            turn += 1
            length = 64 * (1 + (size[0] * (size[1] if len(size) > 1 else 1)) // 16)
            storage[MetadataIndex(key(fqn), off, hint)] = _StorageInfo(key(files[r]), pos[r], length)
            pos[r] += length
            own = ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size))  # not the sdm chunk
            items[r].append(WriteItem(index=MetadataIndex(key(fqn), off, hint), type=WriteItemType.SHARD,
                                      tensor_data=TensorWriteData(chunk=own, properties=props,
                                                                  size=torch.Size(shape))))
        sdm[key(fqn)] = TensorStorageMetadata(properties=props, size=torch.Size(shape), chunks=md_chunks)
    md = Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=storage,
                  storage_meta=StorageMeta(checkpoint_id=checkpoint_id, save_id=f"other-{seed}", load_id=None),
                  version="1.0.0")
    md.all_local_plans = [SavePlan(items=it, storage_data=None, planner_data=None, usable=True)  # type: ignore
                          for it in items]
    return md, dict(zip(files, pos))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--chunks", type=int, default=2000, help="tensor chunks, at least (default 2000)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--protocol", type=int, choices=(2, 3, 4, 5), default=pickle.DEFAULT_PROTOCOL)
    ap.add_argument("--strings", choices=("one", "fresh"), default="one",
                    help="one: each key string one object everywhere; fresh: a new object at every use")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-id", help="StorageMeta.checkpoint_id (default: OUT_DIR as given)")
    ap.add_argument("--json", help="write a summary here")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, sizes = build(args.chunks, args.ranks, args.strings, args.seed,
                      args.checkpoint_id if args.checkpoint_id is not None else args.out_dir)
    with open(out / ".metadata", "wb") as f:
        pickle.dump(md, f, protocol=args.protocol)
    for name, size in sizes.items():
        with open(out / name, "wb") as f:
            f.truncate(size)
    # a finalized Megatron-Core save: its common state and its backend record
    torch.save({"checkpoint_version": 3.0, "iteration": 1}, out / "common.pt")
    (out / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                   "common_backend": "torch", "common_backend_version": 1}))
    n = sum(len(v.chunks) for v in md.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata))
    summary = {"chunks": n, "keys": len(md.state_dict_metadata), "storage_entries": len(md.storage_data),
               "plans": len(md.all_local_plans), "protocol": args.protocol, "strings": args.strings,  # type: ignore
               "metadata_bytes": (out / ".metadata").stat().st_size}
    if args.json:
        Path(args.json).write_text(json.dumps(summary))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
