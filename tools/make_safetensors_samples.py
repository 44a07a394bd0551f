"""Write the Hugging Face safetensors samples: ``sample_ckpts/safetensors/`` and ``sample_ckpts/safetensors_sharded/``.

Usage (repo root; needs the `safetensors` package, 0.8.0 here, and torch, 2.13.0+cpu here):

    python tools/make_safetensors_samples.py

Every `.safetensors` file is written by the safetensors library itself, `safetensors.torch.save_file` (its Rust
serializer: 8-byte header length, JSON header padded to 8 bytes, tensors back to back in dtype-alignment order), with
`metadata={"format": "pt"}` as transformers' `save_pretrained` passes it. The tensors are a tiny GPT-2-style state
dict (vocab 100, hidden 16, 2 layers; float32, a bfloat16 and a float16 tensor, an int64 buffer, a 0-dim scalar and a
zero-element tensor), seeded, so a rebuild is byte-identical.

- `safetensors/model.safetensors`: the whole state dict in one file.
- `safetensors_sharded/`: the same state dict in 2 shards, split as huggingface_hub's
  `split_torch_state_dict_into_shards` splits (`split_state_dict_into_shards_factory`: tensors in order, a new shard
  when the next tensor would pass `max_shard_size`; `model-0000i-of-0000N.safetensors`), and
  `model.safetensors.index.json` as transformers' `save_pretrained` writes it: `{"metadata": {"total_size": N},
  "weight_map": {tensor: file}}`, `json.dumps(index, indent=2, sort_keys=True) + "\\n"`. huggingface_hub is not
  installed here, so the split is done by the few lines below that follow its source (huggingface_hub 0.26
  `serialization/_base.py`); total_size is the sum of the tensors' bytes (`numel × element size`), as it computes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import torch
from safetensors.torch import save_file

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METADATA = {"format": "pt"}
MAX_SHARD_SIZE = 20_000  # bytes: splits the ~33 KB state dict into 2 shards


def state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    sd: dict[str, torch.Tensor] = {
        "transformer.wte.weight": torch.randn(100, 16, generator=g),
        "transformer.wpe.weight": torch.randn(32, 16, generator=g).to(torch.bfloat16),
    }
    for i in range(2):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"] = torch.ones(16)
        sd[p + "ln_1.bias"] = torch.zeros(16)
        sd[p + "attn.c_attn.weight"] = torch.randn(16, 48, generator=g)
        sd[p + "attn.c_attn.bias"] = torch.zeros(48)
        sd[p + "attn.c_proj.weight"] = torch.randn(16, 16, generator=g).to(torch.float16)
        sd[p + "mlp.c_fc.weight"] = torch.randn(16, 64, generator=g)
        sd[p + "mlp.c_proj.weight"] = torch.randn(64, 16, generator=g)
    sd["transformer.ln_f.weight"] = torch.ones(16)
    sd["transformer.position_ids"] = torch.arange(32, dtype=torch.int64)
    sd["transformer.step"] = torch.tensor(7, dtype=torch.int64)  # 0-dim
    sd["transformer.unused_experts"] = torch.empty(0, 16)  # zero elements: span [x, x)
    return sd


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def split(sd: dict[str, torch.Tensor], max_shard_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """huggingface_hub's greedy split: in order, a new shard when the next tensor would pass the size."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for k, t in sd.items():
        if shard and size + _nbytes(t) > max_shard_size:
            yield shard
            shard, size = {}, 0
        shard[k] = t
        size += _nbytes(t)
    if shard:
        yield shard


def main() -> None:
    sd = state_dict()
    single = os.path.join(_ROOT, "sample_ckpts", "safetensors")
    sharded = os.path.join(_ROOT, "sample_ckpts", "safetensors_sharded")
    for d in (single, sharded):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    save_file(sd, os.path.join(single, "model.safetensors"), metadata=METADATA)
    shards = list(split(sd, MAX_SHARD_SIZE))
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(sharded, name), metadata=METADATA)
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": sum(_nbytes(t) for t in sd.values())}, "weight_map": weight_map}
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for d in (single, sharded):
        print(d, sorted((n, os.path.getsize(os.path.join(d, n))) for n in os.listdir(d)))


if __name__ == "__main__":
    main()
