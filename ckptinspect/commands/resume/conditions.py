"""The conditions of the rule table: one function per rule, returning the reason when it fires, else None.

Owns every `_m_*` (model), `_o_*` (optimizer), `_r_*` (rng), `_x_*` (rerun state), `_s_*` (scheduler) and `_i_*`
(iteration) test, the shared `is_release` / `loaded`, the vocabulary failure texts, and the DistributedOptimizer
sharding sets. Which outcome each condition sets, and its source, is in `rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptinspect.commands.resume.facts import RerunState, ResumeFacts
from ckptinspect.formats.args_values import arg_flag, arg_int, arg_text
from ckptinspect.model import ShardedBackend

# DistributedOptimizer.checkpoint_fully_reshardable_formats, [mc] distrib_optimizer.py:105-109
FULLY_RESHARDABLE = frozenset({"fully_reshardable", "fully_sharded_model_space", "fsdp_dtensor"})
DISTOPT_TYPES = FULLY_RESHARDABLE | {"dp_reshardable", "dp_zero_gather_scatter"}


def m_unreadable(f: ResumeFacts) -> str | None:
    return "the checkpoint does not read cleanly, so Megatron's load fails too: " + "; ".join(f.broken[:3]) \
        if f.broken else None


def m_zarr(f: ResumeFacts) -> str | None:
    if f.ckpt.sharded_backend is not ShardedBackend.ZARR:
        return None
    return ("saved with the zarr backend (megatron-core <=0.15); 0.16 removed the zarr load strategy (PR #2944), so "
            "dist_checkpointing.load finds no strategy for it: load and re-save it with megatron-core 0.15 as torch_dist")


def m_topology(f: ResumeFacts) -> str | None:
    return "the target run cannot start: " + "; ".join(f.problems) if f.problems else None


def m_legacy_split(f: ResumeFacts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed or f.vpp_changed):
        return None
    version = f.common.get("checkpoint_version")
    if f.vpp_changed and not (f.split_changed or f.ep_changed):
        why = (f"each shard file holds {'model0..model' + str(f.src.vpp - 1) if f.src.vpp > 1 else 'model'}; the "
               f"run loads state_dict['model%d' % i] per virtual stage ({f.dst.vpp} chunk(s)), so the keys or the "
               "per-chunk layer sets differ (KeyError / load_state_dict size mismatch)")
    elif f.t.finetune or not f.split_changed:
        why = ("each rank opens get_checkpoint_name(mp_rank_TT[_PPP][_EEE]) for its new coordinates: those files are "
               "missing or hold another split's shapes ('could not load the checkpoint', sys.exit)")
    elif isinstance(version, (int, float)) and version < 3.0:
        why = "check_checkpoint_args asserts tensor_model_parallel_size against the old model_parallel_size"
    else:
        why = (f"check_checkpoint_args asserts tensor_model_parallel_size and pipeline_model_parallel_size "
               f"(checkpoint_version {version or '3.0'} ≥ 3.0, not a dist checkpoint)")
    return (f"legacy torch format, {f.tp_pp()}: {why}; the legacy format cannot "
            "reshard: convert it offline (tools/checkpoint/convert.py, or to torch_dist)")


def _suggestion(f: ResumeFacts) -> str:
    v = f.vocab
    assert v is not None  # only called by the vocab rules, which checked it
    best, m_saved = v.suggestion, arg_int(f.args, "make_vocab_size_divisible_by")
    if best is None:
        if v.candidates:
            c = v.candidates[0]
            return (f"--make-vocab-size-divisible-by {c.value} keeps {v.saved} rows only for a vocabulary in "
                    f"({c.low}, {c.high}] (pass the tokenizer's vocabulary size to decide)")
        return (f"no --make-vocab-size-divisible-by keeps {v.saved} rows at TP {v.tp} ({v.saved} is not divisible "
                f"by {v.tp}): re-pad the embedding offline")
    others = [str(c.value) for c in v.candidates if c.certain and c.value != best][:3]
    text = f"--make-vocab-size-divisible-by {best} keeps {v.shape(v.saved)}" + (
        f" (so do {', '.join(others)})" if others else "")
    if v.vocab_size is None:
        text += " for any vocabulary the saved size can have been padded from"
    if f.vocab_file_run and m_saved and best != m_saved:
        tokenizer = arg_text(f.args, "tokenizer_type")
        text += (f"; but the run has a vocab_file ({tokenizer}), so check_checkpoint_args then "
                 f"asserts make_vocab_size_divisible_by == {m_saved}: add --finetune (or --use-checkpoint-args on a "
                 "Megatron-LM whose build_tokenizer keeps a padded_vocab_size set from the checkpoint)")
    return text


def _vocab_fail(f: ResumeFacts, rows: str) -> str:
    v = f.vocab
    assert v is not None
    keys = ", ".join(v.keys) or "the word embedding and output layer"
    vocab = str(v.vocab_size) if v.vocab_size is not None else "vocab"
    raises = ("load_state_dict raises a size mismatch" if f.legacy else
              "dist_checkpointing.load raises 'Global shape mismatch' ([mc] strategies/torch.py:503-518 "
              "MCoreLoadPlanner._validate_global_shapes)")
    return (f"{keys}: saved {v.shape(v.saved)}, but TP {v.tp} pads the vocabulary to {rows} "
            f"(_vocab_size_with_padding: ceil({vocab} / ({v.divisible_by} × {v.tp})) × {v.divisible_by * v.tp}, "
            f"vocabulary {v.vocab_source}); {raises}. {_suggestion(f)}")


def m_vocab(f: ResumeFacts) -> str | None:
    v = f.vocab
    if v is None or v.predicted is None or v.predicted == v.saved:
        return None
    rows = str(v.shape(v.predicted)) + (f" ({v.note})" if v.note else "")
    return _vocab_fail(f, rows)


def m_vocab_unknown(f: ResumeFacts) -> str | None:
    v = f.vocab
    if v is None or v.predicted is not None:
        return None
    return "cannot tell without the tokenizer's vocabulary size: " + _vocab_fail(f, str(v.note))


def m_args(f: ResumeFacts) -> str | None:
    if f.t.finetune or not f.arg_mismatch:
        return None
    return "check_checkpoint_args raises AssertionError: " + "; ".join(f.arg_mismatch)


def m_reshard(f: ResumeFacts) -> str | None:
    if f.legacy or not f.layout_changed:
        return None
    how = []
    if f.ep_changed or f.etp_changed:
        how.append("experts are stored stacked (layers, experts, …) at global expert offsets")
    if f.vpp_changed:
        how.append("layers are stored at global layer offsets, so the virtual stages only regroup them")
    return (f"{f.tp_pp()}: load_checkpoint regenerates the sharded state dict for the "
            "new split and DCP reads each new shard from the stored chunks (global shapes unchanged"
            + "".join(f"; {h}" for h in how) + ")")


def m_load(f: ResumeFacts) -> str | None:
    return f"same (TP, PP) split {f.src.tp}×{f.src.pp}: every rank reads the slices it had" + (
        " (DP replicas read the same slices)" if f.dp_changed else "")


def o_absent(f: ResumeFacts) -> str | None:
    if f.has_optimizer or not (f.skip_flag(True) or f.release):
        return None
    return "the checkpoint holds no optimizer state (saved with --no-save-optim)"


def o_skip(f: ResumeFacts) -> str | None:
    flag = f.skip_flag(True)
    return f"{flag}: load_checkpoint neither requests (gen_sd_optim = None) nor loads the optimizer" if flag else None


def is_release(f: ResumeFacts) -> str | None:
    return "release checkpoint: load_checkpoint gates it on `not release` and never restores it" if f.release else None


def o_missing(f: ResumeFacts) -> str | None:
    return None if f.has_optimizer else (
        "the checkpoint holds no optimizer state (saved with --no-save-optim), yet load_checkpoint calls "
        "optimizer.load_state_dict(state_dict['optimizer']) → KeyError, 'Unable to load optimizer from checkpoint "
        "… Specify --no-load-optim or --finetune'")


def o_flattened(f: ResumeFacts) -> str | None:
    if f.legacy or not f.flattened:
        return None
    return (f"{f.sharding} optimizer state is stored flattened (N-D reformulated, mcore_data; Megatron-Core ≤0.15): "
            "current Megatron-Core still builds it with ShardedTensor.flattened_range "
            "(sharded_param_state_fs_model_space, [mc] distrib_optimizer.py:1748), which "
            "validate_metadata_integrity rejects: 'ShardedTensor.flattened_range is not supported' ([mc] "
            "mapping.py:133-134). Re-save it with megatron-core ≤0.15 as fully_reshardable, or --no-load-optim")


def o_legacy_split(f: ResumeFacts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed or f.vpp_changed):
        return None
    return (f"legacy optimizer state belongs to the saved (TP, PP) shards (model_optim_rng.pt, distrib_optim.pt "
            f"buffers of that split): {f.tp_pp()} has no loader for it")


def o_legacy_missing(f: ResumeFacts) -> str | None:
    if not f.legacy or not arg_flag(f.args, "use_distributed_optimizer"):
        return None
    shards: Mapping[str, Any] = f.ckpt.shard_files
    missing = sorted(s for s, files in shards.items() if "distrib_optim.pt" not in files)
    return (f"args say use_distributed_optimizer but {', '.join(missing[:3])} lack distrib_optim.pt: "
            "load_parameter_state torch.loads it → FileNotFoundError") if missing else None


def o_split_fixed(f: ResumeFacts) -> str | None:
    if f.legacy or not f.split_changed or f.sharding not in DISTOPT_TYPES - FULLY_RESHARDABLE:
        return None
    return (f"RuntimeError '(TP, PP) mismatch after resume ({f.dst.tp}, {f.dst.pp}) vs ({f.src.tp}, {f.src.pp}) from "
            f"checkpoint: not supported for DistributedOptimizer with sharding type {f.sharding}' (load_checkpoint; "
            "only checkpoint_fully_reshardable_formats may change TP/PP). Save with "
            "--dist-ckpt-optim-fully-reshardable (the message's --ckpt-fully-parallel-save is outdated), "
            "or --no-load-optim")


def o_expert_split(f: ResumeFacts) -> str | None:
    if f.legacy or (f.src.ep > 1) == (f.dst.ep > 1) or not f.has_optimizer:
        return None
    return (f"EP {f.src.ep} → {f.dst.ep}: expert params get their own chained DistributedOptimizer only when EP > 1 "
            "(allreduce = not (is_expert and EP > 1), [mc] tensor_parallel/layers.py:886; get_megatron_optimizer, "
            "[mc] optimizer/__init__.py:647-682), so the saved and the resumed runs chain a different number of "
            "optimizers: dp_reshardable state is missing under the new `chained_{i}.` keys, fully reshardable state "
            "fails in DistributedOptimizer.load_state_dict (KeyError 'optimizer', [mc] distrib_optimizer.py:755). "
            "Use --no-load-optim")


def o_ep_fixed(f: ResumeFacts) -> str | None:
    if f.legacy or not (f.ep_changed or f.etp_changed) or f.sharding not in DISTOPT_TYPES - FULLY_RESHARDABLE:
        return None
    if not f.etp_changed and (f.src.ep > 1) != (f.dst.ep > 1):
        return None  # optimizer.expert-split says why
    what = " and ".join(x for x, c in ((f"EP {f.src.ep} → {f.dst.ep}", f.ep_changed),
                                       (f"ETP {f.src.etp} → {f.dst.etp}", f.etp_changed)) if c)
    return (f"{what} with {f.sharding}: the expert buffers' bucket tensors have the per-rank "
            "global shape (gbuf_world_numel_unpadded,), which changes with the expert slices per rank → 'Global "
            "shape mismatch' ([mc] strategies/torch.py _validate_global_shapes; not checked by load_checkpoint's "
            "(TP, PP) guard; inferred from sharded_param_state_dp_reshardable, [mc] distrib_optimizer.py:1603-1687)")


def o_vpp_fixed(f: ResumeFacts) -> str | None:
    if f.legacy or not f.vpp_changed or f.sharding not in DISTOPT_TYPES - FULLY_RESHARDABLE:
        return None
    return (f"VPP {f.src.vpp} → {f.dst.vpp} with {f.sharding}: the DistributedOptimizer keeps one grad buffer per "
            "model chunk (gbuf_idx_{chunk}), so the bucket tensors' global shapes follow the virtual stages → "
            "'Global shape mismatch' ([mc] strategies/torch.py _validate_global_shapes; not checked by "
            "load_checkpoint's (TP, PP) guard). Save with --dist-ckpt-optim-fully-reshardable, or --no-load-optim")


def o_reshard(f: ResumeFacts) -> str | None:
    if not f.layout_changed:
        return None
    if f.sharding in FULLY_RESHARDABLE:
        return (f"{f.sharding} is in checkpoint_fully_reshardable_formats: model-space state (one tensor per param "
                f"and state key), re-split for {f.tp_pp()}")
    return (f"regular optimizer state ({f.sharding or 'no DistributedOptimizer'}) is sharded like the model params "
            f"([mc] dist_checkpointing/optimizer.py), so it reshards with them for {f.tp_pp()}")


def o_dp(f: ResumeFacts) -> str | None:
    if not f.dpcp_changed:
        return None
    dp = f.dp_cp()
    if f.sharding == "dp_reshardable":
        return (f"{dp}: dp_reshardable bucket tensors have the DP-independent global shape "
                "(gbuf_world_numel_unpadded,); every new DP×CP rank reads its own range ([mc] distrib_optimizer.py "
                "sharded_param_state_dp_reshardable; the optimizer shards over the DP×CP group)")
    if f.sharding == "dp_zero_gather_scatter" or (f.legacy and arg_flag(f.args, "use_distributed_optimizer")):
        where = "distrib_optim.pt" if f.legacy else "the param_state object"
        return (f"{dp}: DP rank 0 loads the whole unpadded buffer from {where} and scatters it, padded for the new "
                "DP size (load_parameter_state → load_parameter_state_from_dp_zero, [mc] distrib_optimizer.py:"
                "1965-2068; it asserts only numel_unpadded, which does not depend on DP)")
    if f.sharding in FULLY_RESHARDABLE:
        return f"{dp}: {f.sharding} model-space state; every rank flattens and trims its own DP range"
    return None


def loaded(f: ResumeFacts) -> str | None:
    if f.dst.cp != f.src.cp and not f.dpcp_changed:
        return (f"{f.dp_cp()}: the DistributedOptimizer shards over the DP×CP group, whose size is unchanged, so "
                "every rank reads the range it wrote")
    return "same split: restored as saved"


def r_absent(f: ResumeFacts) -> str | None:
    # torch_dist requests rng_state only with an unchanged (TP, PP) and no ckpt_args.no_save_rng; legacy always reads.
    quiet = not f.legacy and (f.split_changed or arg_flag(f.args, "no_save_rng"))
    if f.has_rng or not (f.skip_flag(False) or f.release or quiet):
        return None
    return "the checkpoint holds no rng state (saved with --no-save-rng)"


def r_skip(f: ResumeFacts) -> str | None:
    flag = f.skip_flag(False)
    return f"{flag}: load_checkpoint neither requests (gen_sd_rng_state = None) nor restores the rng state" \
        if flag else None


def r_missing(f: ResumeFacts) -> str | None:
    if f.has_rng:
        return None
    if f.legacy:
        return ("model_optim_rng.pt has no rng_state: the fallback reads state_dict['random_rng_state'] → KeyError, "
                "'Unable to load rng state … Specify --no-load-rng or --finetune' (sys.exit)")
    return ("no rng_state/shard_* objects, yet the args do not say --no-save-rng: load_checkpoint requests them "
            "for an unchanged (TP, PP) and the load fails on the missing keys; pass --no-load-rng")


def r_legacy_split(f: ResumeFacts) -> str | None:
    if not f.legacy or not (f.split_changed or f.ep_changed):
        return None
    return f"legacy rng states live in the shard files of the saved split; {f.tp_pp()} cannot load them"


def r_split(f: ResumeFacts) -> str | None:
    if not f.split_changed:
        return None
    return (f"'(TP, PP) mismatch after resume ({f.dst.tp}, {f.dst.pp} vs {f.src.tp}, {f.src.pp} from checkpoint): "
            "RNG state will be ignored' — load_checkpoint requests rng_state only when ckpt_tp_pp == run_tp_pp "
            "(a ShardedObject on the (PP, TP) grid cannot be resharded); dropout streams restart from the seed")


def r_ep_grid(f: ResumeFacts) -> str | None:
    if f.legacy or f.split_changed:
        return None
    s, d = f.src, f.dst
    if (s.ep > 1) == (d.ep > 1) and not (s.ep > 1 and f.dpcp_changed):
        return None
    saved, asked = ("(PP, TP, DP×CP)" if lay.ep > 1 else "(PP, TP)" for lay in (s, d))
    return (f"EP {s.ep} → {d.ep}, {f.dp_cp()}: get_rng_state shards rng_state by (PP, TP, DP×CP) with replica 0 "
            f"when EP > 1, else by (PP, TP); the checkpoint holds the {saved} grid, the run requests "
            f"{asked}{' of another DP×CP size' if saved == asked else ''} → the load fails on the missing "
            "rng_state shards (load_checkpoint requests rng_state whenever (TP, PP) match). Pass --no-load-rng")


def r_dp_init(f: ResumeFacts) -> str | None:
    if not arg_flag(f.args, "data_parallel_random_init") or f.dst.dp is None:
        return None
    saved = f.common.get("rng_state")
    entries = len(saved) if f.legacy and isinstance(saved, list) else f.src.dp
    if entries is None or f.dst.dp <= entries:
        return None
    return (f"--data-parallel-random-init saved {entries} rng states (one per DP rank); load_checkpoint indexes "
            f"rng_state[dp_rank] up to DP rank {f.dst.dp - 1} → IndexError (only KeyError is caught)")


def r_load(f: ResumeFacts) -> str | None:
    return "same (TP, PP): every rank restores its " + (
        "shard file's rng_state[0]" if f.legacy else "rng_state/shard_{pp}.{tp} cell") + (
        " (the DP replicas share it)" if f.dp_changed else "")


def x_absent(f: ResumeFacts) -> str | None:
    if f.rerun is not RerunState.ABSENT:
        return None
    return ("not saved for the legacy format (RerunStateMachine.state_dict returns None for non-torch_dist)"
            if f.legacy else "no rerun_state_machine in the common state (rerun mode disabled, or never saved)")


def x_finetune(f: ResumeFacts) -> str | None:
    return "--finetune: load_checkpoint does not request the rerun state" if f.t.finetune else None


def x_idle(f: ResumeFacts) -> str | None:
    if f.rerun is not RerunState.IDLE:
        return None
    return ("the saved rerun state machine was idle (RerunState.NOT_RUNNING_YET): validate_state_dict returns "
            "False, so Megatron never restores it, whatever the topology — nothing to restore")


def x_changed(f: ResumeFacts) -> str | None:
    a = f.args
    if not (arg_int(a, "world_size") and arg_int(a, "data_parallel_size")):
        why = "the checkpoint args lack world_size / data_parallel_size, and getattr(..., 0) never matches the run's"
    elif f.split_changed or f.dp_changed or f.dst.world_size != f.src.world_size:
        why = (f"world size {f.src.world_size} → {f.dst.world_size}, {f.tp_pp()}, DP {f.src.dp} → {f.dst.dp}")
    else:
        return None
    return f"'Job sharding has changed: Rerun state will be ignored' (load_checkpoint): {why}"


def s_absent(f: ResumeFacts) -> str | None:
    if f.has_scheduler or not (f.skip_flag(True) or f.release):
        return None
    return "the checkpoint holds no opt_param_scheduler (saved with --no-save-optim)"


def s_skip(f: ResumeFacts) -> str | None:
    flag = f.skip_flag(True)
    return (f"{flag}: the scheduler is restored in the same `not release and not args.finetune and not "
            "args.no_load_optim` block of load_checkpoint as the optimizer") if flag else None


def s_missing(f: ResumeFacts) -> str | None:
    return None if f.has_scheduler else (
        "no opt_param_scheduler in the checkpoint: load_checkpoint reads state_dict['opt_param_scheduler'] → "
        "KeyError ('Unable to load optimizer … Specify --no-load-optim or --finetune')")


def s_load(f: ResumeFacts) -> str | None:
    return "opt_param_scheduler.load_state_dict: sample-based counters, independent of the topology"


def i_finetune(f: ResumeFacts) -> str | None:
    return ("--finetune: iteration = 0, and consumed_train_samples is not restored (check_checkpoint_args block "
            "skipped)") if f.t.finetune else None


def i_release(f: ResumeFacts) -> str | None:
    return "release checkpoint: load_checkpoint starts at iteration 0" if f.release else None


def i_missing(f: ResumeFacts) -> str | None:
    return None if f.has_iteration else (
        "no 'iteration' (nor 'total_iters'): 'A metadata file exists but unable to load iteration … exiting'")


def i_load(f: ResumeFacts) -> str | None:
    it = f.ckpt.iteration if f.ckpt.iteration is not None else f.common.get("iteration", f.common.get("total_iters"))
    consumed = arg_int(f.args, "consumed_train_samples") or 0
    return f"iteration {it}; consumed_train_samples {consumed} from the checkpoint args"
