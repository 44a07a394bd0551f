"""The inputs of `estimate`: what the model is, where it runs, how it is saved, and the cost assumptions.

A model is a list of `ParamSpec` in Megatron's module registration order (the order matters only for the
DistributedOptimizer's bucket layout, which decides how many chunks each DP rank writes). Shapes are global along the
tensor-parallel axis and exclude the stacked-layer and expert axes; `layers` / `experts` say how many copies exist.
Everything here is a frozen value of plain types; nothing reads files.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from ckptinspect.model import StrEnum, frozen


class SaveFormat(StrEnum):
    """`--ckpt-format` values `estimate` can cost."""

    TORCH_DIST = "torch_dist"
    TORCH = "torch"  # legacy per-(tp,pp,ep) model_optim_rng.pt (+ distrib_optim.pt)


class Optimizer(enum.Enum):
    """The optimizer whose state is saved: Adam keeps two fp32 moments per parameter, SGD (momentum) one."""

    ADAM = "adam"
    SGD = "sgd"

    @property
    def moments(self) -> int:
        return 2 if self is Optimizer.ADAM else 1


class Stage(enum.Enum):
    """Where a non-layer tensor lives: the first pipeline stage (embeddings) or the last (final norm, output)."""

    FIRST = "first"
    LAST = "last"


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter (stacked over layers / experts the way Megatron's sharded keys are).

    key: the sharded-tensor key Megatron saves (``decoder.layers.self_attention.linear_qkv.weight``).
    shape: global shape of one layer's / one expert's tensor (TP axis at full size).
    layers: global layer indices holding it; () for a non-layer tensor (placed by `stage`).
    stage: pipeline stage of a non-layer tensor.
    experts: number of global experts (expert axis, split over EP); 0 for a dense tensor.
    tp_axis: axis split over TP (ETP for experts); None = replicated over TP (layernorms, row-parallel biases).
    tp_pieces: chunks per TP rank along `tp_axis` (2 for SwiGLU `linear_fc1`: W and V halves).
    saved: False for the tied output layer on the last stage: in the optimizer's buffers, not saved as a model
        tensor (its main replica is the first stage's embedding).
    dtype: the saved dtype when it differs from the model's (an fp32 router); None = `ModelSpec.param_dtype`.
    """

    key: str
    shape: tuple[int, ...]
    layers: tuple[int, ...] = ()
    stage: Stage = Stage.FIRST
    experts: int = 0
    tp_axis: int | None = None
    tp_pieces: int = 1
    saved: bool = True
    dtype: str | None = None

    @property
    def numel(self) -> int:
        """Elements of one layer / one expert copy."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def total_numel(self) -> int:
        """Elements over every layer and expert copy."""
        return self.numel * max(len(self.layers), 1) * max(self.experts, 1)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model as `estimate` sees it.

    params: in module registration order.
    num_layers: decoder layers (for the layer → stage map).
    param_dtype: dtype of the saved model weights (``bfloat16``).
    source: where the description came from (``description``, ``params``, or the checkpoint path).
    """

    params: tuple[ParamSpec, ...]
    num_layers: int
    param_dtype: str = "bfloat16"
    source: str = "description"

    @property
    def total_params(self) -> int:
        return sum(p.total_numel for p in self.params if p.saved)


@dataclass(frozen=True, slots=True)
class Target:
    """Parallel layout of the job being costed. etp defaults to tp (Megatron's `expert_tensor_parallel_size`)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1
    vpp: int = 1
    etp: int | None = None
    gpus_per_node: int = 8

    @property
    def etp_(self) -> int:
        return self.etp or self.tp

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the ranks of one stage that are not spent on ETP × EP."""
        return (self.tp * self.cp * self.dp) // (self.etp_ * self.ep)

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "etp": self.etp_, "cp": self.cp,
                "vpp": self.vpp, "world_size": self.world, "gpus_per_node": self.gpus_per_node}


class OptimSharding(enum.Enum):
    """How a DistributedOptimizer's state is laid out in torch_dist (Megatron-Core ≥0.14)."""

    DP_RESHARDABLE = "dp_reshardable"  # per-bucket 1-D slices, each DP rank writes its own
    FULLY_RESHARDABLE = "fully_reshardable"  # one fp32 tensor per model param, distributed like the weights
    # Megatron-Core 0.8-0.13 (producers reference "generations"): per-parameter flattened slices of each DP rank's
    # range (no padding chunks); or the whole group's state gathered to DP rank 0 as one ShardedObject.
    FULLY_SHARDED_MODEL_SPACE = "fully_sharded_model_space"
    DP_ZERO_GATHER_SCATTER = "dp_zero_gather_scatter"


@dataclass(frozen=True, slots=True)
class SaveOptions:
    """How the job saves.

    files_per_rank: `.distcp` files a rank writes (Megatron's `thread_count`: 2 in ≤0.16, 1 at HEAD; more with
        `--dist-ckpt-workers`).
    save_optim: the optimizer state is saved (Megatron-LM's `--no-save-optim` turns it off: `save_checkpoint`
        leaves `state_dict["optimizer"]` out).
    """

    format: SaveFormat = SaveFormat.TORCH_DIST
    fully_parallel: bool = True
    async_save: bool = False
    distributed_optimizer: bool = True
    optimizer: Optimizer = Optimizer.ADAM
    optim_sharding: OptimSharding = OptimSharding.DP_RESHARDABLE
    files_per_rank: int = 1
    save_optim: bool = True

    def to_dict(self) -> dict[str, object]:
        return {"format": self.format.value, "fully_parallel": self.fully_parallel, "async": self.async_save,
                "distributed_optimizer": self.distributed_optimizer, "optimizer": self.optimizer.value,
                "optim_sharding": self.optim_sharding.value, "files_per_rank": self.files_per_rank,
                "save_optim": self.save_optim}


@dataclass(frozen=True, slots=True)
class Bandwidths:
    """Cost assumptions, decimal bytes per second. Defaults are the design notes' typical values: one stream to a
    parallel file system ~2 GB/s, aggregate write ~100 GB/s, device-to-host over PCIe ~25 GB/s."""

    write: float = 2e9
    aggregate: float = 100e9
    d2h: float = 25e9

    def to_dict(self) -> dict[str, float]:
        return {"write_bytes_per_s": self.write, "aggregate_bytes_per_s": self.aggregate,
                "d2h_bytes_per_s": self.d2h}


# Bytes one torch.save archive adds around a tensor chunk in a `.distcp` file (torch 2.13: `archive/data.pkl`,
# `.format_version`, `.storage_alignment`, `byteorder`, `version`, `.data/serialization_id` and the zip records;
# Megatron writes every chunk as its own archive, reference "`.distcp` internals"). Measured on the megatron-core
# 0.16.1 samples: 1577 bytes for most chunks, 1545 when the 64-byte alignment of `data/0` falls differently.
TENSOR_ITEM_OVERHEAD = 1577


@dataclass(frozen=True, slots=True)
class ObjectCosts:
    """Stored sizes of the pickled byte items (ShardedObjects), which no shape predicts.

    Defaults were measured on the megatron-core 0.16.1 samples (CPU rng states; a GPU job's CUDA rng tracker
    states make `rng` larger). `estimate --from CKPT` replaces them with the checkpoint's own sizes.
    rng: one `rng_state/shard_{pp}.{tp}` item, written by DP×CP rank 0 of each (pp, tp).
    rerun: one `rerun_state_machine_state/shard_{rank}` item, written by every rank.
    extra_state: one TE `_extra_state/shard_{layer}` item, per layer per linear module, by (tp 0, dp 0) of its stage.
    extra_state_modules: linear modules with an `_extra_state` per layer (qkv, proj, fc1, fc2).
    expert_extra_state_modules: `_extra_state` items per (MoE layer, expert) (expert fc1, fc2), written by expert-DP
        rank 0 of the expert's EP rank.
    optim_objects: the DistributedOptimizer's dp_reshardable ShardedObjects (param groups, per_bucket_numel,
        per_bucket_numel_unpadded) of one model-parallel group, written by its DP rank 0.
    expert_optim_objects: the same for the expert optimizer (the second of Megatron's chained optimizers, keys
        `chained_1.`), one set per (pp, ep, etp) group, written by its expert-DP rank 0.
    common: the common state (args, iteration, scheduler): `common.pt` (≤0.18) or `common_state` (≥0.19). The
        default is a rough figure for a full Megatron-LM args Namespace (the samples' reduced args give 3.3 kB).
    others: any other object family seen in a checkpoint: family → stored bytes, written by rank 0 (the 0.19+
        `common_state` item).
    rerun_per_rank: False for megatron-core <= 0.13, whose rerun state is a (PP, TP) grid written by DP rank 0.
    rng_per_dp: with EP > 1 Megatron-LM's `get_rng_state` saves a (PP, TP, DP) grid with replica 0, so every DP
        rank writes its own rng item instead of DP rank 0 alone.
    """

    rng: int = 35481
    rerun: int = 1709
    extra_state: int = 1261
    extra_state_modules: int = 4
    expert_extra_state_modules: int = 0
    optim_objects: int = 1837 + 1261 + 1261
    common: int = 20000
    others: Mapping[str, int] = field(default_factory=lambda: frozen({}))
    rng_per_dp: bool = False
    expert_optim_objects: int = 0
    rerun_per_rank: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "others", frozen(self.others))
