#!/usr/bin/env python3
"""Write a REAL `torch.distributed.checkpoint.save` of very many tiny tensors: encoding (d) of issue 31.

The benchmark's other encodings are pickled by generators of this project; this one is torch's own writer end to
end (`dcp.save` with `DefaultSavePlanner` and `FileSystemWriter`): `.metadata` is whatever torch 2.13's
planner and `pickle` make of the state dict, with torch's own object sharing and field order, no `all_local_plans`
(a plain DCP save has none).

* ``--world 1`` (default): one process, no process group (`dcp.save` runs `no_dist`): one `__0_0.distcp`.
* ``--world 2``: two spawned processes on gloo, each a rank: `--dtensor-every K` makes every K-th tensor a
  `Shard(0)` DTensor over the 2 ranks (two chunks in `.metadata`, one per rank), the others plain tensors only
  rank 0 writes (every rank saves them; DCP's dedup keeps one copy).

Tensors have `--numel` elements (1 or 4 make the metadata, not the data, the size) and names like a model's
(`layers.{i}.{param}`) with a few dtypes. Deterministic for a given command line (values are arange).

    python tools/make_real_dcp_many.py /tmp/dcp100k --tensors 100000
    python tools/make_real_dcp_many.py /tmp/dcp100k2 --tensors 100000 --world 2 --dtensor-every 4 --numel 4
    python tools/make_real_dcp_many.py tests/data/dcp_real_300 --tensors 300 --world 2 --dtensor-every 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

PARAMS = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight", "norm.weight", "norm.bias",
          "attn.qkv.bias", "mlp.fc1.bias")


def _state(n: int, numel: int, world: int, rank: int, every: int) -> dict[str, Any]:
    import torch

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float32)
    mesh = None
    if world > 1 and every > 0:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
    sd: dict[str, Any] = {}
    for i in range(n):
        name = f"layers.{i // len(PARAMS)}.{PARAMS[i % len(PARAMS)]}"
        dtype = dtypes[i % len(dtypes)]
        if mesh is not None and i % every == 0:
            from torch.distributed.tensor import Shard, distribute_tensor

            full = torch.arange(numel * world, dtype=torch.float32).to(dtype)
            sd[name] = distribute_tensor(full, mesh, [Shard(0)])
        else:
            sd[name] = torch.arange(numel, dtype=torch.float32).to(dtype) + i
    sd["step"] = 7  # a byte item, as training loops save
    return sd


def _save(rank: int, world: int, out: str, n: int, numel: int, every: int, port: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sd = _state(n, numel, world, rank, every)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(out, thread_count=1))
    finally:
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tensors", type=int, default=100000)
    ap.add_argument("--numel", type=int, default=1, help="elements per tensor (per rank for a DTensor)")
    ap.add_argument("--world", type=int, choices=(1, 2), default=1)
    ap.add_argument("--dtensor-every", type=int, default=4, help="with --world 2: every K-th tensor a DTensor")
    ap.add_argument("--json", help="write a summary here")
    # the benchmark's generator interface (bench_read_metadata.py --generate N --generator real_dcp)
    ap.add_argument("--chunks", type=int, help="alias of --tensors")
    ap.add_argument("--seed", type=int, default=0, help="ignored (the save is deterministic)")
    args = ap.parse_args(argv)
    n = args.chunks if args.chunks is not None else args.tensors
    out = str(Path(args.out_dir).resolve())
    Path(out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.world == 1:
        _save(0, 1, out, n, args.numel, 0, 0)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_worker, args=(args.world, out, n, args.numel, args.dtensor_every, _free_port()),
                 nprocs=args.world, join=True)
    dt = time.perf_counter() - t0
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(out).read_metadata()
    chunks = sum(len(v.chunks) for v in md.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata))
    summary = {"chunks": chunks, "keys": len(md.state_dict_metadata), "storage_entries": len(md.storage_data),
               "world": args.world, "save_s": round(dt, 1),
               "metadata_bytes": (Path(out) / ".metadata").stat().st_size}
    if args.json:
        Path(args.json).write_text(json.dumps(summary))
    print(json.dumps(summary))
    return 0


def _worker(rank: int, world: int, out: str, n: int, numel: int, every: int, port: int) -> None:
    _save(rank, world, out, n, numel, every, port)


if __name__ == "__main__":
    sys.exit(main())
