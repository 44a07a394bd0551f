"""DCP checkpoints as torch's own writers produce them, and torch's own load of each (issue 25 §4).

Writes one checkpoint dir per case with the real `torch.distributed.checkpoint` (torch 2.13.0 CPU; the Hugging Face
writer needs `safetensors`), each rank a spawned process on gloo, and loads a case back with torch's `dcp.load` in the
world size that wrote it (every rank loads its own part into a template of the same sharding, then compares the
values with what was saved): the oracle the tests compare ckptinspect's verdict with.

    python tools/_dcp_writers.py write OUT [CASE ...]     # every case when none is named
    python tools/_dcp_writers.py load DIR CASE [DIR CASE ...]   # prints {DIR: null | "the error"} as JSON

Cases (`CASES`):
- ``per_rank``: `dcp.save(..., use_collectives=False)` on 2 ranks: each rank writes `__R_0.distcp` and its own
  `__R.metadata` (no `.metadata`); a Shard(0) DTensor, a replicated one, a plain tensor every rank saves and a byte item.
- ``per_rank_no_dist``: the same in one process without a process group (`no_dist`): `__0.metadata` only.
- ``unflattened``: `DefaultSavePlanner(flatten_state_dict=False)` on 2 ranks over a 2-D (2, 1) mesh: the nested
  `model` dict (DTensors with Shard / Replicate / `_StridedShard` placements) is one pickled byte item.
- ``unflattened_top``: the same planner with Shard / Replicate DTensors at the top level (tensor items; `planner_data`
  None; torch's planner refuses a top-level `_StridedShard` chunk of this mesh as overlapping).
- ``hf_rank0``: `HuggingFaceStorageWriter` rank-0 mode (`no_dist`), two files by `fqn_to_index_mapping`:
  `model-0000{1,2}-of-00002.safetensors` + `model.safetensors.index.json`.
- ``hf_distributed``: `save_distributed=True` on 2 ranks: `shard-0000{1,2}-model-00001-of-00001.safetensors`, no index.
- ``hf_consolidated``: `save_distributed=True, enable_consolidation=True`: the shards under `sharded/`, the
  consolidated `model-00001-of-00001.safetensors` and the index at the top.
- ``safetensors_distcp``: `FileSystemWriter(serialization_format=SAFETENSORS)` on 2 ranks: `.distcp` files whose
  tensors are one safetensors blob after the byte items (torch 2.13's `FileSystemReader` cannot read them back).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import traceback
import warnings
from typing import Any

# case -> world size (1: one process, no process group)
CASES = {
    "per_rank": 2, "per_rank_no_dist": 1, "unflattened": 2, "unflattened_top": 2, "hf_rank0": 1,
    "hf_distributed": 2, "hf_consolidated": 2, "safetensors_distcp": 2,
}


def _full() -> dict[str, Any]:
    import torch

    return {"w": torch.arange(32, dtype=torch.float32).reshape(8, 4), "r": torch.full((3,), 2.0),
            "s": torch.arange(16, dtype=torch.float32).reshape(8, 2) / 4}


def _state(case: str, rank: int, world: int, template: bool = False) -> dict[str, Any]:
    """What `case` saves on `rank` (zeros of the same sharding when `template`: what `dcp.load` fills)."""
    import torch

    full = {k: torch.zeros_like(v) if template else v for k, v in _full().items()}
    if world == 1:
        if case.startswith("hf_"):
            return {"w": full["w"], "r": full["r"]}
        return {"w": full["w"], "r": full["r"], "plain": full["r"] * 0 if template else full["r"] + 1,
                "step": 0 if template else 5}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    w = distribute_tensor(full["w"], mesh, [Shard(0), Replicate()])
    r = distribute_tensor(full["r"], mesh, [Replicate(), Replicate()])
    s = distribute_tensor(full["s"], mesh, [_StridedShard(0, split_factor=2), Replicate()])
    if case.startswith("hf_"):
        return {"w": w, "r": r}
    if case == "per_rank":
        plain = torch.zeros(2) if template else torch.full((2,), float(rank))  # each rank saves (and loads) its own
        return {"w": w, "r": r, "plain": plain, "step": 0 if template else 5}
    if case == "unflattened":
        return {"model": {"w": w, "r": r, "s": s}, "step": 0 if template else 5}
    return {"w": w, "r": r, "step": 0 if template else 5}  # a top-level `_StridedShard` chunk: torch refuses it


def _save(case: str, out: str, rank: int, world: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    sd = _state(case, rank, world)
    no_dist = world == 1
    if case in ("per_rank", "per_rank_no_dist"):
        dcp.save(sd, checkpoint_id=out, use_collectives=False, no_dist=no_dist)
    elif case.startswith("unflattened"):
        dcp.save(sd, checkpoint_id=out, planner=dcp.DefaultSavePlanner(flatten_state_dict=False))
    elif case == "hf_rank0":
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, fqn_to_index_mapping={"w": 1, "r": 2}),
                 no_dist=True)
    elif case == "hf_distributed":
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
    elif case == "hf_consolidated":
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=True))
    elif case == "safetensors_distcp":
        dcp.save(sd, storage_writer=FileSystemWriter(out, serialization_format=SerializationFormat.SAFETENSORS))
    else:
        raise ValueError(case)


def _load(case: str, path: str, rank: int, world: int) -> None:
    """torch's own load of `path` into a template of the sharding `case` saved; raises when it fails or the values
    differ from what was saved."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd = _state(case, rank, world, template=True)
    # `dcp.load` without its Stateful wrapping (`_stateful_to_state_dict` copies the dict): byte items land in `sd`
    reader = HuggingFaceStorageReader(path) if case.startswith("hf_") else FileSystemReader(path)
    planner = dcp.DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False) \
        if case.startswith("unflattened") else None
    _load_state_dict(sd, storage_reader=reader, planner=planner, no_dist=world == 1)
    want = _state(case, rank, world)
    if case == "unflattened" and rank > 0:
        # the nested dict is one byte item, pickled by the coordinator: every rank loads rank 0's DTensors (their
        # local shards included): torch's own semantics, compared on rank 0
        if set(sd["model"]) != {"w", "r", "s"} or sd["step"] != 5:
            raise AssertionError(f"rank {rank}: loaded {sorted(sd['model'])}, step {sd['step']}")
        return
    flat_sd = sd["model"] | {"step": sd["step"]} if case == "unflattened" else sd
    flat_want = want["model"] | {"step": want["step"]} if case == "unflattened" else want
    for k, v in flat_want.items():
        got = flat_sd[k]
        if hasattr(v, "to_local"):
            v, got = v.to_local(), got.to_local()
        if isinstance(v, torch.Tensor):
            if not torch.equal(v, got):
                raise AssertionError(f"rank {rank}: {k} differs after load")
        elif v != got:
            raise AssertionError(f"rank {rank}: {k} = {got!r}, saved {v!r}")


def worker(rank: int, cfg: dict[str, Any]) -> None:
    """Run every (case, dir) job of `cfg` on `rank`; each job's error (or None) is written to `cfg["result"].R`. A job
    that fails on one rank does not stop the others: every rank meets the barrier after every job."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), OMP_NUM_THREADS="1")
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    world = cfg["world"]
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    errors: list[str | None] = []
    for case, path in cfg["jobs"]:
        error = None
        try:
            if cfg["mode"] == "write":
                if rank == 0:
                    shutil.rmtree(path, ignore_errors=True)
                if world > 1:
                    dist.barrier()
                if case != "hf_rank0" or rank == 0:
                    _save(case, path, rank, world)
            else:
                _load(case, path, rank, world)
        except BaseException as e:  # noqa: BLE001 - reported by the parent (a failed load is a result)
            error = f"rank {rank}: {type(e).__name__}: {str(e)[-600:]}"
            if cfg["mode"] == "write":
                traceback.print_exc()
        errors.append(error)
        if world > 1 and len(cfg["jobs"]) > 1:
            dist.barrier()
    with open(f"{cfg['result']}.{rank}", "w") as f:
        json.dump(errors, f)
    if world > 1:
        try:
            dist.destroy_process_group()
        except RuntimeError:
            pass  # a peer whose load failed has gone already


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(mode: str, jobs: list[tuple[str, str]], world: int, timeout: float = 600.0) -> list[str | None]:
    """Run `jobs` ((case, dir) pairs, all of one world size) in `world` processes (`world` 1: in this process, no
    process group); per job, the ranks' errors joined, or None when every rank succeeded."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory(prefix="dcp_writers_") as tmp:
        cfg = {"mode": mode, "jobs": jobs, "world": world, "port": _free_port(), "result": os.path.join(tmp, "r")}
        if world == 1:
            worker(0, cfg)
        else:
            import torch.multiprocessing as mp

            ctx = mp.start_processes(worker, args=(cfg,), nprocs=world, join=False, start_method="spawn")
            deadline = time.monotonic() + timeout
            try:
                while not ctx.join(timeout=1.0):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{mode} of {[c for c, _ in jobs]} exceeded {timeout:.0f}s")
            except mp.ProcessRaisedException:
                pass  # a rank died after its result (or without one: "died without a result" below)
            finally:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
        per_rank = []
        for r in range(world):
            try:
                with open(f"{cfg['result']}.{r}") as f:
                    per_rank.append(json.load(f))
            except (OSError, ValueError):
                per_rank.append([f"rank {r}: died without a result"] * len(jobs))
        return ["; ".join(e for e in errs if e) or None for errs in zip(*per_rank)]


def write(out: str, cases: list[str]) -> None:
    for world in sorted({CASES[c] for c in cases}):
        jobs = [(c, os.path.join(out, c)) for c in cases if CASES[c] == world]
        failed = [(c, e) for (c, _), e in zip(jobs, run("write", jobs, world)) if e]
        if failed:
            raise RuntimeError(f"writing failed: {failed}")


def load_together(jobs: list[tuple[str, str]], timeout: float = 600.0) -> dict[str, str | None]:
    """`load` with the jobs of one world size in one run: for checkpoints expected to load (a failing one may leave
    the ranks out of step, and the jobs after it then fail or time out: still an answer of "not loaded")."""
    out: dict[str, str | None] = {}
    for world in sorted({CASES[c] for c, _ in jobs}):
        mine = [(c, d) for c, d in jobs if CASES[c] == world]
        try:
            out.update({d: e for (_, d), e in zip(mine, run("load", mine, world, timeout))})
        except TimeoutError as e:
            out.update({d: f"hung: {e}" for _, d in mine})
    return out


def load(jobs: list[tuple[str, str]], timeout: float = 180.0) -> dict[str, str | None]:
    """torch's own load of each (case, dir): {dir: None when it loaded and the values are what was saved, else the
    error}. Each job in its own processes: a load that fails on one rank leaves the others inside a collective of
    `dcp.load` (its closing barrier), so ranks cannot go on together; a load still waiting after `timeout` failed."""
    out: dict[str, str | None] = {}
    for case, d in jobs:
        try:
            (out[d],) = run("load", [(case, d)], CASES[case], timeout)
        except TimeoutError as e:
            out[d] = f"hung: {e}"
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "write":
        write(argv[1], argv[2:] or list(CASES))
        return 0
    if len(argv) >= 3 and argv[0] == "load" and len(argv) % 2 == 1:
        pairs = [(argv[i + 1], argv[i]) for i in range(1, len(argv), 2)]
        print(json.dumps(load(pairs)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
