"""Stack-specific saves driven from the Megatron-Core CPU worker (`_mcore_cpu._run_megatron`).

`nvrx_local`: Megatron's non-persistent *local* checkpoint path (training/checkpointing.py `save_checkpoint` with
`--non-persistent-ckpt-type local`): the same sharded state dict as a torch_dist save goes through megatron-core's
`MCoreTensorAwareStateDict.from_state_dict(algo="fully_parallel", parallelization_group=DP×CP group)` and is saved
by NVRx's `LocalCheckpointManager(root).save(state_dict, iteration)` (nvidia-resiliency-ext
`checkpointing/local/ckpt_managers/local_manager.py`): `{root}/{session=''}/{rank}/iter_{it:07d}_{rank}_local.pt`,
written as `…_local.dirty.pt` then renamed; older iterations are removed once the new one is complete everywhere.
Needs `nvidia-resiliency-ext` (0.4.1 was used) importable next to megatron-core 0.16.1.
"""

from __future__ import annotations

import os


def save_nvrx_local(c, model, optimizer, common, rng, rsm, parallel_state, iteration: int) -> None:
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict
    from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    # training/checkpointing.py _build_sharded_state_dict_metadata (local saves reject fully_reshardable)
    metadata = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
                "chained_optim_avoid_prefix": True}
    state_dict = dict(common)
    model_sd = model.module.sharded_state_dict(metadata=metadata)
    state_dict["model"] = model_sd
    state_dict["optimizer"] = optimizer.sharded_state_dict(model_sd, metadata=metadata)
    state_dict["rng_state"] = ShardedObject(
        "rng_state", [rng],
        (parallel_state.get_pipeline_model_parallel_world_size(),
         parallel_state.get_tensor_model_parallel_world_size()),
        (pp_rank, tp_rank), replica_id=dp_rank,
    )
    state_dict["rerun_state_machine"] = rsm.state_dict(data_iterator=None, ckpt_format="torch_dist", force=True)
    sd, _cache = MCoreTensorAwareStateDict.from_state_dict(
        state_dict, algo="fully_parallel",
        parallelization_group=parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    manager = LocalCheckpointManager(os.path.join(c["out_dir"], "local"))
    manager.save(sd, iteration, is_async=False)
