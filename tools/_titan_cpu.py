"""Worker of ``tools/make_stack_samples.py --only torchtitan``: torchtitan's own checkpoint manager on CPU/gloo.

Run with torchtitan 0.3.0 installed (``pip install --no-deps torchtitan==0.3.0`` plus its small deps, torch 2.13.0
CPU). Each rank is one spawned process. The model is torchtitan's Llama3 (``torchtitan.models.llama3``) built from
the same config helpers as its ``debugmodel`` flavor, shrunk (dim 16, 2 layers, vocab 64) so the sample stays
small; it is sharded with FSDP2 ``fully_shard`` over a 1-D CPU mesh of all ranks. The optimizer and LR scheduler are
torchtitan's ``OptimizersContainer`` / ``LRSchedulersContainer`` (the debugmodel's AdamW + warmup/decay), the train
state is a Stateful with torchtitan's ``Trainer.state_dict`` keys (``step``, ``ntokens_seen``), and every save goes
through ``torchtitan.components.checkpointer.CheckpointManager.save`` (``step-N`` dirs, ``dcp.save``).
Nothing in torch or torchtitan is patched. One import-time stand-in: torchtitan imports its Triton GPU kernels
(expert-parallel dispatch, fused SwiGLU/MLA) at module level, and Triton is a ~150 MB GPU package; when it is absent
`_stub_triton` registers an inert stand-in for torchtitan's expert-parallel kernel module
(`torchtitan.distributed.minimal_async_ep.kernels`) so the imports succeed. No kernel is ever called on this CPU path
(no MoE, no expert parallelism), so nothing written to disk depends on it.
"""

from __future__ import annotations

import os
import sys
import traceback


class _Inert:
    """Accepts any attribute access, call or subscript at import time (type annotations, decorators)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Inert()

    def __getitem__(self, item):
        return _Inert()


def _module_getattr(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Inert()


def _stub_triton() -> None:
    import importlib.util
    import types

    if importlib.util.find_spec("triton") is not None:
        return
    name = "torchtitan.distributed.minimal_async_ep.kernels"  # the only module-level `import triton` on our path
    mod = types.ModuleType(name)
    mod.__getattr__ = _module_getattr  # type: ignore[method-assign]
    sys.modules[name] = mod


def _model(vocab: int, dim: int, layers: int, heads: int):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers, _output_linear_init,
    )
    from torchtitan.models.llama3.model import Llama3Model

    cfg = Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads,
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=16),
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=64, theta=500000, scaling="llama"),
            attn_backend="flex",
        ),
    )
    return cfg.build()


def _dtensor_like(p, gen):
    from torch.distributed.tensor import DTensor

    local = torch_randn_like(p.to_local(), gen)
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


def torch_randn_like(t, gen):
    import torch

    return torch.randn(t.shape, generator=gen).mul_(1e-3).to(t.dtype)


class _TrainState:
    """torchtitan's Trainer is the `train_state` Stateful: {"step", "ntokens_seen"} (trainer.py state_dict)."""

    def __init__(self) -> None:
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd):
        self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]


def worker(rank: int, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), RANK=str(rank),
                      WORLD_SIZE=str(cfg["world"]), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.set_num_threads(1)
        _stub_triton()
        dist.init_process_group("gloo", rank=rank, world_size=cfg["world"])
        torch.manual_seed(cfg["seed"])
        from torchtitan.components.checkpointer import CheckpointManager
        from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
        from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

        model = _model(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["heads"])
        model.init_weights() if hasattr(model, "init_weights") else None
        mesh = init_device_mesh("cpu", (cfg["world"],), mesh_dim_names=("dp_shard",))
        for block in model.layers.values() if hasattr(model.layers, "values") else model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                           optimizer_kwargs={"lr": 8e-4, "weight_decay": 0.1})],
            implementation="for-loop",
        ).build(model_parts=[model])
        sched = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear").build(
            optimizers=opt, training_steps=max(cfg["steps"]))
        state = _TrainState()
        ckpt = CheckpointManager.Config(enable=True, folder=cfg["folder"], interval=1,
                                        last_save_model_only=False).build(
            dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=sched,
            states={"train_state": state}, sd_adapter=None, base_folder=cfg["out"])
        gen = torch.Generator().manual_seed(cfg["seed"] * 10 + rank)
        for step in range(1, max(cfg["steps"]) + 1):
            toks = torch.randint(0, cfg["vocab"], (2, 17), generator=gen)
            inputs = toks[:, :-1]
            # torchtitan's Trainer.forward_backward_step: positions, flex masks from the model, forward.
            positions = torch.arange(inputs.shape[1]).unsqueeze(0).expand_as(inputs)
            with torch.no_grad():
                model(inputs, positions, model.get_attention_masks(positions=positions))
            # FlexAttention has no backward on CPU (torch 2.13): the gradients are seeded random values, so the
            # optimizer step (and the AdamW state it creates) is real while no loss is back-propagated.
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen).mul_(1e-3).to(p.dtype) if not hasattr(p, "to_local") \
                    else _dtensor_like(p, gen)
            opt.step()
            sched.step()
            opt.zero_grad()
            state.step = step
            state.ntokens_seen += toks[:, :-1].numel()
            if step in cfg["steps"]:
                ckpt.save(step, last_step=False)
        ckpt.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stderr.write(f"[titan rank {rank}] FAILED\n{traceback.format_exc()}\n")
        raise
