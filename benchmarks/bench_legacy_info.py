"""Benchmark 5: `ckptinspect info` on a legacy `model_optim_rng.pt` of ≥ 1 GB vs `torch.load(path, weights_only=False)`.

Target: ≤ 5% of torch's wall time and peak RSS (ckptinspect reads the archive's `data.pkl` and central directory,
never the tensor bytes). Both run as whole fresh processes, page cache warm, in the same run.

Usage: python benchmarks/bench_legacy_info.py [--size-gb 2] [--file PATH] [--keep]
The file is written with torch.save in Megatron's legacy layout (args Namespace, iteration, model state dict with
per-layer keys, optimizer, rng_state list) — needs torch (the test extra).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import load_note, measure  # noqa: E402


def write_file(path: Path, size_gb: float) -> None:
    import argparse as ap

    import torch

    hidden = 4096
    per_layer = 12 * hidden * hidden  # qkv + proj + fc1 + fc2 (4h)
    layers = max(1, int(size_gb * (1 << 30) / 4 / per_layer))
    g = torch.Generator().manual_seed(0)
    model = {}
    for i in range(layers):
        p = f"decoder.layers.{i}."
        model[p + "self_attention.linear_qkv.weight"] = torch.empty(3 * hidden, hidden).uniform_(generator=g)
        model[p + "self_attention.linear_proj.weight"] = torch.empty(hidden, hidden).uniform_(generator=g)
        model[p + "mlp.linear_fc1.weight"] = torch.empty(4 * hidden, hidden).uniform_(generator=g)
        model[p + "mlp.linear_fc2.weight"] = torch.empty(hidden, 4 * hidden).uniform_(generator=g)
        model[p + "input_layernorm.weight"] = torch.ones(hidden)
    args = ap.Namespace(num_layers=layers, hidden_size=hidden, num_attention_heads=32, tensor_model_parallel_size=1,
                        pipeline_model_parallel_size=1, padded_vocab_size=50304, use_distributed_optimizer=False)
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 1000, "model": model,
             "optimizer": {"param_groups": [{"lr": 1e-4, "params": list(range(len(model)))}], "state": {}},
             "opt_param_scheduler": {"num_steps": 1000}, "rng_state": [{"random_rng_state": (3, (1, 2), None),
                                                                        "torch_rng_state": torch.get_rng_state()}],
             "num_floating_point_operations_so_far": 1.0}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__)
    a.add_argument("--size-gb", type=float, default=2.0)
    a.add_argument("--file", type=Path)
    a.add_argument("--repeat", type=int, default=3)
    a.add_argument("--keep", action="store_true")
    args = a.parse_args()
    tmp = None
    path = args.file
    if path is None:
        tmp = tempfile.mkdtemp(prefix="bench_legacy_")
        path = Path(tmp) / "iter_0001000" / "mp_rank_00" / "model_optim_rng.pt"
        write_file(path, args.size_gb)
    size = path.stat().st_size
    with open(path, "rb") as f:  # warm the page cache for both sides
        while f.read(64 << 20):
            pass
    torch_cmd = [sys.executable, "-c", f"import torch; torch.load({str(path)!r}, weights_only=False)"]
    ours = [sys.executable, "-m", "ckptinspect", "info", str(path), "-o", "json"]
    t = measure(torch_cmd, args.repeat)
    o = measure(ours, args.repeat)
    print(load_note())
    print(f"file: {path} ({size / 2**30:.2f} GiB)")
    print(f"{'':32} {'wall s':>8} {'RSS MB':>9}")
    print(f"{'torch.load(weights_only=False)':32} {t['wall']:8.2f} {t['rss_mb']:9.1f}")
    print(f"{'ckptinspect info -o json':32} {o['wall']:8.2f} {o['rss_mb']:9.1f}   exit {o['rc']}")
    wr, rr = o["wall"] / t["wall"], o["rss_mb"] / t["rss_mb"]
    print(f"ratio ckptinspect/torch: wall {wr:.1%}, RSS {rr:.1%}  (target ≤ 5% each: "
          f"{'OK' if wr <= 0.05 and rr <= 0.05 else 'MISSED'})")
    if tmp and not args.keep:
        os.remove(path)
    return 0 if o["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
