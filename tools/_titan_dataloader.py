"""Worker of ``tools/make_stack_samples.py --only torchtitan_dataloader``: a torchtitan-layout DCP save with the
`dataloader` Stateful of each DP rank, written by torch's own `dcp.save` over 2 gloo ranks (DP 2, CPU).

torchtitan v0.2.2 `torchtitan/components/checkpoint.py` puts the dataloader into the saved states under
`DATALOADER = "dataloader"` (L51, L204) next to the flattened model keys and `train_state`; DCP calls each Stateful's
`state_dict()` and flattens it. `ParallelAwareDataloader.state_dict` (`torchtitan/components/dataloader.py`
L115-122) is `{f"dp_rank_{dp_rank}": pickle.dumps(StatefulDataLoader.state_dict()), "world_size": dp_world_size}`,
so the save holds the byte items `dataloader.dp_rank_0`, `dataloader.dp_rank_1` (one per rank: each rank's state
dict has its own key) and `dataloader.world_size` (the same on every rank: DCP keeps one). torchdata's
`StatefulDataLoader` is not installed here, so its inner state is a stand-in dict with its top-level key names
(`_iterator_finished`, `_num_yielded`, `_sampler_iter_yielded`, ...); the outer layout, the pickle.dumps and
everything DCP writes are the libraries' own. The model is two plain tensors (replicated: DCP deduplicates them).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback


class TitanDataloaderState:
    """`ParallelAwareDataloader.state_dict()` / `load_state_dict()` of torchtitan v0.2.2 (dataloader.py L115-142)."""

    def __init__(self, dp_rank: int, dp_world_size: int, yielded: int) -> None:
        self.dp_rank, self.dp_world_size, self.yielded = dp_rank, dp_world_size, yielded

    def state_dict(self):
        inner = {"_snapshot": {"_snapshot_step": self.yielded, "_last_yielded_worker_id": 0,
                               "_main_snapshot": {"_num_yielded": self.yielded, "_sampler_iter_yielded": self.yielded,
                                                  "_iterator_finished": False}},
                 "_steps_since_snapshot": 0, "_iterator_finished": False}
        return {f"dp_rank_{self.dp_rank}": pickle.dumps(inner), "world_size": self.dp_world_size}

    def load_state_dict(self, sd):
        pass


class TrainState:
    def __init__(self, step: int) -> None:
        self.step = step

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.step * 32}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def worker(rank: int, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), RANK=str(rank),
                      WORLD_SIZE=str(cfg["world"]), OMP_NUM_THREADS="1")
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=cfg["world"])
        gen = torch.Generator().manual_seed(cfg["seed"])
        model = {"tok_embeddings.weight": torch.randn(16, 8, generator=gen),
                 "output.weight": torch.randn(16, 8, generator=gen)}
        for step in cfg["steps"]:
            states = {**model, "train_state": TrainState(step),
                      "dataloader": TitanDataloaderState(rank, cfg["world"], step * 2)}
            dcp.save(states, checkpoint_id=os.path.join(cfg["out"], f"step-{step}"))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        sys.stderr.write(f"[titan-dataloader rank {rank}] FAILED\n{traceback.format_exc()}\n")
        raise
