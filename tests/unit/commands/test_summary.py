"""Who wrote what (`commands/audit/summary.py`): the model / optimizer / rng / other split of a real save.

The checkpoint is written the way torchtitan's `CheckpointManager` and a DCP user write one: `dcp.save` of a dict of
Statefuls (torch's `get_state_dict` for the model and optimizer, a train state, and an `rng` Stateful holding the CPU
generator state `torch.get_rng_state()`, a data-loader `torch.Generator`'s state, `random.getstate()` and
`np.random.get_state()`); torch's own `dcp.load` puts every RNG back (the oracle), then the summary must count the
`rng.*` items, tensors and byte items alike, under "rng" and nothing of them under "model" or "other".
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.summary import summarize
from ckptinspect.model.components import component_of
from ckptinspect.formats import read_checkpoint


class _Rng:
    """An RNG Stateful as trainers write one (torchtitan-style `states["rng"]`)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def state_dict(self) -> dict[str, Any]:
        import numpy as np
        import torch

        return {"torch": torch.get_rng_state(), "dataloader_generator": self.gen.get_state(),
                "python": random.getstate(), "numpy": np.random.get_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        import numpy as np
        import torch

        torch.set_rng_state(sd["torch"])
        self.gen.set_state(sd["dataloader_generator"])
        random.setstate(sd["python"])
        np.random.set_state(sd["numpy"])


class _Train:
    def __init__(self) -> None:
        self.step = 7

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step = sd["step"]


def _states() -> tuple[dict[str, Any], Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    gen = torch.Generator().manual_seed(11)
    return {"model": msd, "optimizer": osd, "train_state": _Train(), "rng": _Rng(gen)}, gen


def test_rng_state_of_a_real_dcp_save_is_counted_as_rng(tmp_path: Path) -> None:
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp

    states, _ = _states()
    expected = states["rng"].state_dict()
    ckpt = tmp_path / "step-7"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(states, checkpoint_id=str(ckpt))
        # the oracle: torch's load puts every generator back
        torch.manual_seed(99)
        random.seed(99)
        np.random.seed(99)
        back = {"rng": _Rng(torch.Generator())}
        dcp.load(back, checkpoint_id=str(ckpt))
    assert torch.equal(torch.get_rng_state(), expected["torch"])
    assert torch.equal(back["rng"].gen.get_state(), expected["dataloader_generator"])
    assert random.getstate() == expected["python"]
    assert np.array_equal(np.random.get_state()[1], expected["numpy"][1])

    model = read_checkpoint(ckpt, str(ckpt))
    rng_keys = {t.key for t in model.tensors if t.key.startswith("rng.")} | \
        {o.key for o in model.objects if o.key.startswith("rng.")}
    assert rng_keys == {"rng.torch", "rng.dataloader_generator", "rng.python", "rng.numpy"}
    rng_bytes = sum(c.storage.length for t in model.tensors if t.key in rng_keys for c in t.chunks if c.storage) + \
        sum(o.storage.length for o in model.objects if o.key in rng_keys and o.storage)
    summary = summarize(model)
    assert summary.by_component["rng"] == rng_bytes > 5000  # two 5056-byte generator states and two pickles
    model_bytes = sum(c.storage.length for t in model.tensors if t.key.startswith("model.")
                      for c in t.chunks if c.storage)
    assert summary.by_component["model"] == model_bytes
    assert summary.by_component["optimizer"] > 0
    assert "uint8" in summary.dtypes["rng"] and "uint8" not in summary.dtypes.get("model", {})


@pytest.mark.parametrize("key,component", [
    ("rng.torch", "rng"), ("rng.python", "rng"), ("rng_state/shard_0.0_1.1", "rng"), ("rng_state", "rng"),
    ("cuda_rng_state", "rng"), ("extra.np_rng_state", "rng"), ("states.rngs.dropout", "rng"),
    ("model.layers.0.strong_gate.weight", "model"), ("model.rngesus.weight", "model"),
    ("optimizer.state.rng.exp_avg", "optimizer"), ("train_state.step", "other"),
])
def test_component_of(key: str, component: str) -> None:
    assert component_of(key) == component
