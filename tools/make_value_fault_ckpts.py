#!/usr/bin/env python
"""Rebuild tests/data/values_ckpts/: real Megatron-Core 0.16.1 torch_dist saves with value faults put into the live
model / optimizer before the save (tools/_value_faults.py), a healthy TP1/TP2 pair of the same model, and the same
healthy model as a plain PyTorch DCP save.

    python tools/make_value_fault_ckpts.py                 # all samples
    python tools/make_value_fault_ckpts.py --only weights moments
    python tools/make_value_fault_ckpts.py --check         # compare healthy_tp1 / healthy_tp2 / healthy_dcp model tensors

Each Megatron sample is one make_sample_ckpts.make_checkpoint call (one process per rank, gloo, CPU); the kwargs
are in SAMPLES.  healthy_dcp is not a Megatron run: the model tensors of healthy_tp1 are loaded with
torch.distributed.checkpoint into CPU tensors and written again by torch.distributed.checkpoint.save (one process,
no process group), with the same keys.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TOOLS_DIR)
ROOT = os.path.join("tests", "data", "values_ckpts")  # relative to the repo root (args.save records it as given)

_BASE = dict(format="torch_dist", pp=1, dp=1, layers=2, hidden=16, heads=4, vocab_size=100,
             make_vocab_size_divisible_by=64, iterations=(1,), seed=1234)
SAMPLES = {
    "weights": dict(_BASE, tp=2, optim_sharding="fully_reshardable", value_faults="weights"),
    "moments": dict(_BASE, tp=2, optim_sharding="fully_reshardable", value_faults="moments"),
    "desync": dict(_BASE, tp=1, optim_sharding="fully_reshardable", bf16=True, value_faults="desync"),
    # lr=0: the one real optimizer step leaves the weights bit-equal to the (TP-independent, use_cpu_initialization)
    # init, so both topologies hold the same model tensors
    "healthy_tp1": dict(_BASE, tp=1, optim_sharding="dp_reshardable", lr=0.0),
    "healthy_tp2": dict(_BASE, tp=2, optim_sharding="dp_reshardable", lr=0.0),
    # a stale save: two iterations of one run with lr=0, a real optimizer step between them that leaves the weights
    # bit-equal (what `audit --all --values` must call CK524); the moments do change
    "stale_lr0": dict(_BASE, tp=1, optim_sharding="dp_reshardable", lr=0.0, iterations=(1, 2)),
    # another run of the same model with a global batch of 1, saved at iteration 3 (consumed_train_samples 3,
    # opt_param_scheduler.num_steps 3): its iter_0000003 put beside stale_lr0's iterations 1 and 2 (4 samples) is two
    # runs in one save dir, where the counters go backwards (CK527, CK529; tests/unit/commands/test_lineage.py)
    "restart_gbs1": dict(_BASE, tp=1, optim_sharding="dp_reshardable", micro_batch_size=1, iterations=(3,)),
}
DERIVED = ("healthy_dcp",)


def _iter_dir(save_dir: str) -> str:
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt")) as f:
        return os.path.join(save_dir, f"iter_{int(f.read().strip()):07d}")


def load_model_tensors(ckpt_dir: str, model_only: bool = False) -> dict:
    """Every tensor of a DCP/torch_dist checkpoint dir as full CPU tensors (``model_only``: not ``optimizer.*``;
    Megatron's torch_dist model keys carry no ``model.`` prefix)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(ckpt_dir)
    md = reader.read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items()
          if isinstance(v, TensorStorageMetadata) and not (model_only and k.startswith("optimizer."))}
    dcp.load(sd, storage_reader=reader, no_dist=True)
    return sd


def make_dcp_copy(src_save_dir: str, out_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    sd = load_model_tensors(_iter_dir(src_save_dir), model_only=True)
    os.makedirs(out_dir, exist_ok=True)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(out_dir), no_dist=True)


def check_equal(root: str = ROOT) -> int:
    """Compare every model tensor of healthy_tp1, healthy_tp2 and healthy_dcp; print and return the mismatches."""
    import torch

    a = load_model_tensors(_iter_dir(os.path.join(root, "healthy_tp1")), model_only=True)
    b = load_model_tensors(_iter_dir(os.path.join(root, "healthy_tp2")), model_only=True)
    c = load_model_tensors(os.path.join(root, "healthy_dcp"), model_only=True) if os.path.isdir(
        os.path.join(root, "healthy_dcp")) else {}
    bad = 0
    for name, other in (("healthy_tp2", b), ("healthy_dcp", c)):
        if not other:
            continue
        if set(a) != set(other):
            print(f"{name}: key sets differ: {sorted(set(a) ^ set(other))}")
            bad += 1
        for k in sorted(set(a) & set(other)):
            if a[k].shape != other[k].shape or not torch.equal(a[k], other[k]):
                diff = (a[k].float() - other[k].float()).abs().max().item() if a[k].shape == other[k].shape else None
                print(f"{name}: {k} differs (max abs diff {diff})")
                bad += 1
        print(f"healthy_tp1 vs {name}: {len(set(a) & set(other))} model tensors compared, {bad} mismatches so far")
    return bad


def print_facts(root: str = ROOT) -> None:
    """Load each fault sample back with torch and print the faulty elements (the README quotes this output)."""
    def load(name):
        return load_model_tensors(_iter_dir(os.path.join(root, name)))

    w = load("weights")
    for k in ("decoder.layers.mlp.linear_fc1.weight", "optimizer.state.param.decoder.layers.mlp.linear_fc1.weight"):
        t = w[k]
        print(f"weights {k} {tuple(t.shape)} [0,0,0:2]={t[0, 0, 0:2].tolist()} [0,1,0:5]={t[0, 1, 0:5].tolist()} "
              f"[0,32,0:2]={t[0, 32, 0:2].tolist()} [0,33,0:5]={t[0, 33, 0:5].tolist()} "
              f"nan at {t.isnan().nonzero().tolist()} inf at {t.isinf().nonzero().tolist()}")
    for k in ("decoder.layers.self_attention.linear_proj.weight",
              "optimizer.state.param.decoder.layers.self_attention.linear_proj.weight"):
        t = w[k]
        print(f"weights {k} {tuple(t.shape)} [1] all zero: {bool((t[1] == 0).all())}; zeros in [0]: "
              f"{int((t[0] == 0).sum())}")
    mo = load("moments")
    t = mo["optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"]
    print(f"moments optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight {tuple(t.shape)} [0] all zero: "
          f"{bool((t[0] == 0).all())}; zeros in [1]: {int((t[1] == 0).sum())}")
    k = "optimizer.state.exp_avg_sq.decoder.layers.self_attention.linear_qkv.layer_norm_weight"
    t = mo[k]
    print(f"moments {k} {tuple(t.shape)} negative at {(t < 0).nonzero().tolist()}; [1,0:3]={t[1, 0:3].tolist()}; "
          f"exp_avg_sq keys with a negative: {[n for n, v in mo.items() if 'exp_avg_sq' in n and (v < 0).any()]}")
    import torch

    de = load("desync")
    for k, v in sorted(de.items()):
        mk = k[len("optimizer.state.param."):]
        if k.startswith("optimizer.state.param.") and mk in de:
            off = de[mk] != v.to(de[mk].dtype)
            if off.any():
                print(f"desync {mk} {de[mk].dtype} != bf16({k}) at {off.nonzero().tolist()}: "
                      f"{de[mk][off].float().tolist()} vs fp32 {v[off].tolist()}")
    del torch


def build(root: str = ROOT, only=None, timeout: float = 900.0) -> dict:
    sys.path.insert(0, _TOOLS_DIR)
    import make_sample_ckpts

    times = {}
    for name in list(SAMPLES) + list(DERIVED):
        if only and name not in only:
            continue
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.monotonic()
        if name == "healthy_dcp":
            make_dcp_copy(os.path.join(root, "healthy_tp1"), out)
        else:
            make_sample_ckpts.make_checkpoint(out, timeout=timeout, **SAMPLES[name])
        times[name] = time.monotonic() - t0
        print(f"[make_value_fault_ckpts] {name}: {times[name]:.1f}s", flush=True)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=ROOT)
    p.add_argument("--only", nargs="+", choices=list(SAMPLES) + list(DERIVED))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--check", action="store_true", help="only compare the healthy samples' model tensors")
    p.add_argument("--facts", action="store_true", help="only print the faulty elements of the fault samples")
    a = p.parse_args(argv)
    os.chdir(_REPO_ROOT)
    if a.facts:
        print_facts(a.root)
        return 0
    if not a.check:
        build(a.root, a.only, a.timeout)
    if all(os.path.isdir(os.path.join(a.root, n)) for n in ("healthy_tp1", "healthy_tp2")):
        return 1 if check_equal(a.root) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
