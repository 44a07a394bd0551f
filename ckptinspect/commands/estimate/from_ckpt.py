"""`estimate --from CKPT`: the model, topology and save options of a real checkpoint, as `estimate` inputs.

Only shapes, dtypes and chunk geometry are used for the tensors: for every model tensor of the `.metadata`
(or legacy shard files) the stacked-layer axis (`decoder.layers.*` keys carry global layer indices on axis 0), the
expert axis (`.experts.` keys: (layers, experts, out, in), producers reference "MoE") and the tensor-parallel axis (the
axis one chunk does not span: fragments = global / chunk size, two per TP rank for SwiGLU `linear_fc1`) are read
from one chunk. The per-rank placement is then recomputed from Megatron's layout rules, not read from the file
names, so the same description can be costed at another topology.

What shapes cannot give — the pickled sizes of the byte items (rng states, TE `_extra_state`, rerun state, the
optimizer's param groups, the common state) — is calibrated from the checkpoint's own items (`ObjectCosts`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ckptinspect.commands.estimate.spec import (
    ModelSpec,
    ObjectCosts,
    Optimizer,
    OptimSharding,
    ParamSpec,
    SaveFormat,
    SaveOptions,
    Stage,
    Target,
)
from ckptinspect.formats.args_values import arg_flag, arg_int, arg_text
from ckptinspect.model import Checkpoint, Format, Tensor
from ckptinspect.model.components import component_of

_LAYER_INDEX = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp$")
_OPTIM_OBJECT = re.compile(r"^(chained_\d+\.)?optimizer\.distributed\.dp_group_idx_(\d+)\.")

# Module registration order inside one transformer layer (Megatron-Core `TransformerLayer`: input_layernorm,
# self_attention (linear_proj is created in `Attention.__init__` before `SelfAttention` adds linear_qkv), q/k
# layernorms, pre_mlp_layernorm, mlp: router, experts, shared experts, or linear_fc1, linear_fc2). The order only
# decides how the DistributedOptimizer's buckets cut into chunks.
_LAYER_ORDER = (
    "input_layernorm.", "self_attention.linear_qkv.layer_norm", "self_attention.linear_proj.",
    "self_attention.linear_qkv.", "self_attention.q_layernorm.", "self_attention.k_layernorm.",
    "pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm", "mlp.router.", "mlp.experts.", "mlp.shared_experts.",
    "mlp.linear_fc1.", "mlp.linear_fc2.",
)
_TP_AXIS_BY_NAME = (
    ("linear_qkv.weight", 0), ("linear_qkv.bias", 0), ("linear_fc1.weight", 0), ("linear_fc1.bias", 0),
    ("linear_proj.weight", 1), ("linear_fc2.weight", 1), ("word_embeddings.weight", 0), ("output_layer.weight", 0),
)
_TOP_ORDER = ("embedding.word_embeddings.", "embedding.position_embeddings.", "embedding.", "decoder.layers.",
              "decoder.final_layernorm.", "decoder.", "output_layer.")


def _first(key: str, prefixes: tuple[str, ...]) -> int:
    return next((i for i, p in enumerate(prefixes) if key.startswith(p)), len(prefixes))


def registration_key(key: str) -> tuple[int, int, int, str]:
    """Sort key approximating Megatron's parameter registration order for a sharded-tensor key."""
    top = _first(key, _TOP_ORDER)
    m = _LAYER_INDEX.match(key)
    rest = m.group(2) if m else key.removeprefix("decoder.layers.")
    inner = _first(rest, _LAYER_ORDER) if top == _TOP_ORDER.index("decoder.layers.") else 0
    # weight before bias, layer_norm_weight before layer_norm_bias, fc1 before fc2
    tail = rest.replace("bias", "~bias")
    return top, inner, int(m.group(1)) if m else 0, tail


def param_spec(t: Tensor, num_layers: int, tp: int, etp: int) -> ParamSpec | None:
    """One model tensor of a torch_dist checkpoint as a `ParamSpec` (None for a tensor without chunks)."""
    if not t.chunks:
        return None
    chunk = t.chunks[0].sizes
    shape = list(t.shape)
    axes = list(range(len(shape)))
    layers: tuple[int, ...] = ()
    m = _LAYER_INDEX.match(t.key)
    if m:
        layers = (int(m.group(1)),)
    elif t.key.startswith("decoder.layers.") and shape:
        layers = tuple(range(shape[0]))
        axes = axes[1:]
    experts = 0
    if ".experts." in t.key and len(axes) >= 2 and chunk[axes[0]] == 1 and shape[axes[0]] > 1:
        experts = shape[axes[0]]
        axes = axes[1:]
    tp_axis = None
    pieces = 1
    for i, a in enumerate(axes):
        if chunk[a] and chunk[a] < shape[a]:
            tp_axis, frags = i, shape[a] // chunk[a]
            size = etp if experts else tp
            pieces = frags // size if size and frags % size == 0 else frags
            break
    if tp_axis is None:
        # Saved at TP = 1 (or ETP = 1) nothing is split: Megatron's column-parallel layers split axis 0, the
        # row-parallel ones axis 1, so another target TP can still be costed.
        tp_axis = next((ax for suffix, ax in _TP_AXIS_BY_NAME if t.key.endswith(suffix)), None)
        if tp_axis is not None and tp_axis >= len(axes):
            tp_axis = None
    local_shape = tuple(shape[a] for a in axes)
    stage = Stage.FIRST if t.key.startswith("embedding.") or num_layers == 0 else Stage.LAST
    return ParamSpec(t.key, local_shape, layers, stage, experts, tp_axis, pieces, True, t.dtype)


def _num_layers(ckpt: Checkpoint) -> int:
    n = arg_int(ckpt.args, "num_layers")
    if n is not None:
        return n
    best = 0
    for t in ckpt.tensors:
        m = _LAYER_INDEX.match(t.key)
        if m:
            best = max(best, int(m.group(1)) + 1)
        elif t.key.startswith("decoder.layers.") and t.shape:
            best = max(best, t.shape[0])
    return best


def model_from(ckpt: Checkpoint) -> ModelSpec:
    """The model tensors of `ckpt` as a `ModelSpec`, in registration order; a tied output layer is added unsaved."""
    target = target_from(ckpt)
    num_layers = _num_layers(ckpt)
    specs = []
    for t in ckpt.tensors:
        if component_of(t.key) != "model" or t.key.endswith("._extra_state"):
            continue
        p = param_spec(t, num_layers, target.tp, target.etp_)
        if p is not None:
            specs.append(p)
    specs.sort(key=lambda p: registration_key(p.key))
    keys = {p.key for p in specs}
    tied = not arg_flag(ckpt.args, "untie_embeddings_and_output_weights", True)
    emb = next((p for p in specs if p.key == "embedding.word_embeddings.weight"), None)
    if tied and emb is not None and "output_layer.weight" not in keys:
        specs.append(replace(emb, key="output_layer.weight", stage=Stage.LAST, saved=False))
    dtypes = [p.dtype for p in specs if p.dtype]
    dtype = max(set(dtypes), key=dtypes.count) if dtypes else "bfloat16"
    return ModelSpec(tuple(specs), num_layers, dtype, ckpt.path)


def target_from(ckpt: Checkpoint, gpus_per_node: int = 8) -> Target:
    """The checkpoint's own topology as the reader found it (`Topology`: args checked by `args_values`, then
    on-disk witnesses)."""
    topo = ckpt.topology
    return Target(tp=topo.tp or 1, pp=topo.pp or 1, dp=topo.dp or 1, ep=topo.ep or 1, cp=topo.cp or 1,
                  vpp=topo.vpp or 1, etp=topo.etp, gpus_per_node=gpus_per_node)


def options_from(ckpt: Checkpoint) -> SaveOptions:
    """How the checkpoint was saved: format, fully parallel, optimizer and its sharding, files per rank."""
    per_rank: dict[int, int] = defaultdict(int)
    for f in ckpt.files:
        m = _RANK_FILE.search(f.name)
        if m:
            per_rank[int(m.group(1))] += 1
    # 0.8's `fully_sharded_bucket_space` saved bucket slices like dp_reshardable
    known = {s.value: s for s in OptimSharding}
    sharding = known.get(ckpt.optimizer_sharding or "", OptimSharding.DP_RESHARDABLE)
    opt = (arg_text(ckpt.args, "optimizer") or "adam").lower()
    return SaveOptions(
        format=SaveFormat.TORCH if ckpt.format is Format.TORCH else SaveFormat.TORCH_DIST,
        fully_parallel=arg_flag(ckpt.args, "ckpt_fully_parallel_save", True),
        async_save=arg_flag(ckpt.args, "async_save"),
        distributed_optimizer=arg_flag(ckpt.args, "use_distributed_optimizer", ckpt.optimizer_sharding is not None),
        optimizer=Optimizer.SGD if opt == "sgd" else Optimizer.ADAM,
        optim_sharding=sharding,
        files_per_rank=max(per_rank.values(), default=1),
        save_optim=not arg_flag(ckpt.args, "no_save_optim"),
    )


def costs_from(ckpt: Checkpoint, target: Target, num_layers: int) -> ObjectCosts:
    """Object sizes measured on the checkpoint's own byte items."""
    sizes: dict[str, list[int]] = defaultdict(list)
    others: dict[str, int] = {}
    optim: dict[str, dict[int, int]] = {}  # chained prefix -> dp_group_idx -> bytes
    per_dp = rerun_grid = False
    for o in ckpt.objects:
        if o.storage is None:
            continue
        n = o.storage.length
        if o.family.endswith("rng_state"):
            sizes["rng"].append(n)
            per_dp = per_dp or (o.grid is not None and len(o.grid) == 3)
        elif o.family.startswith("rerun_state_machine_state"):
            sizes["rerun"].append(n)
            rerun_grid = rerun_grid or (o.grid is not None and len(o.grid) == 2)
        elif o.family.endswith("._extra_state"):
            sizes["expert_extra" if ".experts." in o.family else "extra"].append(n)
        elif o.family.endswith(".param_state") and _OPTIM_OBJECT.match(o.family):
            continue  # 0.8-0.13 dp_zero_gather_scatter: the gathered state itself, predicted from the shapes
        elif (m := _OPTIM_OBJECT.match(o.family)) is not None:
            optim.setdefault(m.group(1) or "", {}).setdefault(int(m.group(2)), 0)
            optim[m.group(1) or ""][int(m.group(2))] += n
        else:
            others[o.family] = others.get(o.family, 0) + n
    common = next((f.size for f in ckpt.files if f.name == "common.pt" and f.size), None)
    d = ObjectCosts()
    # Megatron chains the dense optimizer first and the expert optimizer second (`chained_0.`, `chained_1.`); the
    # expert one has a group per (pp, ep, etp) instead of per (pp, tp).
    prefixes = sorted(optim)
    expert = prefixes[-1] if len(prefixes) > 1 else None
    per_group = {p: round(sum(g.values()) / len(g)) for p, g in optim.items() if g}
    experts = max((o.grid[1] for o in ckpt.objects
                   if o.grid is not None and len(o.grid) == 2 and ".experts." in o.family), default=0)

    def mean(k: str, default: int) -> int:
        v = sizes.get(k)
        return round(sum(v) / len(v)) if v else default

    return ObjectCosts(
        # a family the checkpoint does not have costs nothing (0.19 fixtures without rerun state, no TE modules)
        rng=mean("rng", 0), rerun=mean("rerun", 0), extra_state=mean("extra", d.extra_state),
        extra_state_modules=round(len(sizes["extra"]) / num_layers) if num_layers else 0,
        expert_extra_state_modules=round(len(sizes["expert_extra"]) / (num_layers * experts))
        if num_layers and experts else 0,
        optim_objects=next((v for p, v in per_group.items() if p != expert), 0),
        expert_optim_objects=per_group.get(expert, 0) if expert is not None else 0,
        common=common or d.common, others=others, rng_per_dp=per_dp, rerun_per_rank=not rerun_grid,
    )
