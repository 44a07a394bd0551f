"""Value faults put into a live Megatron-Core model / DistributedOptimizer IN MEMORY, after the optimizer step and
before the real ``dist_checkpointing.save`` (tools/_mcore_cpu.py / tools/_mcore_layouts.py call ``apply``).  The
bytes on disk are then written by megatron-core itself; nothing is edited afterwards.

Every rank applies the fault to its own local shard (its TP slice of a weight; the Adam state of the flat range of
the parameter its DP rank owns under the DistributedOptimizer).

- ``weights``:  WEIGHT_FAULT_PARAM local [0,0] = NaN, [0,1] = +Inf, [1,0:4] = 1e-42 (float32 denormals);
                ZERO_PARAM all zero.  With fp32 params the DistributedOptimizer's main params are views of the model
                params (distrib_optimizer.py: ``shard_model_param = model_param.view(-1)[start:end]``), so the
                optimizer copy (``optimizer.state.param.*`` with fully_reshardable) carries the same faults; this is
                asserted below.
- ``moments``:  exp_avg of ZERO_MOMENT_PARAM all zero; exp_avg_sq of NEG_MOMENT_PARAM flat element 0 of the rank's
                shard = -1.0 (a TP-replicated layernorm weight, so the saved tensor has exactly one such element).
- ``desync``:   (bf16) the bf16 model param DESYNC_PARAM local [0,0] += 1.0; its fp32 main param is left alone.
"""

from __future__ import annotations

VALUE_FAULTS = ("none", "weights", "moments", "desync")

WEIGHT_FAULT_PARAM = "decoder.layers.0.mlp.linear_fc1.weight"
ZERO_PARAM = "decoder.layers.1.self_attention.linear_proj.weight"
ZERO_MOMENT_PARAM = "decoder.layers.0.mlp.linear_fc2.weight"
NEG_MOMENT_PARAM = "decoder.layers.1.input_layernorm.weight"
DESYNC_PARAM = "decoder.layers.0.mlp.linear_fc1.weight"


def _named_params(chunks):
    out = {}
    for m in chunks:
        while hasattr(m, "module"):
            m = m.module
        out.update(dict(m.named_parameters()))
    return out


def _dist_opts(optimizer):
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _main_param(optimizer, model_param):
    """(the DistOpt's shard main param, its inner torch optimizer state) of ``model_param`` on this DP rank, or None."""
    for opt in _dist_opts(optimizer):
        idx = getattr(opt, "model_param_group_index_map", {}).get(model_param)
        if idx is not None:
            group_index, group_order = idx
            main = opt.optimizer.param_groups[group_index]["params"][group_order]
            return main, opt.optimizer.state[main]
    return None


def apply(name: str, chunks, optimizer, log) -> None:
    import math

    import torch

    if name in (None, "none"):
        return
    params = _named_params(chunks)
    with torch.no_grad():
        if name == "weights":
            w = params[WEIGHT_FAULT_PARAM]
            w[0, 0] = float("nan")
            w[0, 1] = float("inf")
            w[1, 0:4] = 1e-42
            params[ZERO_PARAM].zero_()
            for pname in (WEIGHT_FAULT_PARAM, ZERO_PARAM):
                got = _main_param(optimizer, params[pname])
                if got is not None and got[0].dtype == params[pname].dtype:
                    # fp32: the main param must be a view of the model param (same storage)
                    main = got[0]
                    assert main.untyped_storage().data_ptr() == params[pname].untyped_storage().data_ptr(), pname
            v = w.view(-1)
            assert math.isnan(v[0].item()) and math.isinf(v[1].item()), "fault not in the model param"
            log(f"weights: {WEIGHT_FAULT_PARAM} local {tuple(w.shape)} [0,0]=nan [0,1]=inf [1,0:4]={w[1, 0:4].tolist()};"
                f" {ZERO_PARAM} local {tuple(params[ZERO_PARAM].shape)} zeroed")
        elif name == "moments":
            got = _main_param(optimizer, params[ZERO_MOMENT_PARAM])
            if got is not None:
                got[1]["exp_avg"].zero_()
                log(f"moments: exp_avg of {ZERO_MOMENT_PARAM} shard {tuple(got[1]['exp_avg'].shape)} zeroed")
            got = _main_param(optimizer, params[NEG_MOMENT_PARAM])
            if got is not None:
                got[1]["exp_avg_sq"].view(-1)[0] = -1.0
                log(f"moments: exp_avg_sq of {NEG_MOMENT_PARAM} shard flat[0] = -1.0")
        elif name == "desync":
            p = params[DESYNC_PARAM]
            if p.dtype != torch.bfloat16:
                raise ValueError("value fault 'desync' needs bf16 params")
            before = p[0, 0].item()
            p[0, 0] += 1.0
            got = _main_param(optimizer, p)
            main0 = got[0].view(-1)[0].item() if got is not None else None
            log(f"desync: {DESYNC_PARAM} bf16 local [0,0] {before} -> {p[0, 0].item()}; fp32 main flat[0] = {main0}")
        else:
            raise ValueError(f"value fault must be one of {VALUE_FAULTS}, got {name!r}")
