"""Legacy `torch` format: shard dirs for the whole TP×PP(×EP) grid of the args (CK110), `distrib_optim.pt` where
the args say distributed optimizer (CK111), args that agree across shard files (CK112). In a save being written
(`Checkpoint.save_in_progress`, `formats/inflight.py`) what CK110 / CK111 would name is not written yet: CK132."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from ckptinspect.checks import CheckContext
from ckptinspect.errors import UNREAD_CODE
from ckptinspect.findings import Finding
from ckptinspect.formats.legacy import DISTOPT_FILE, MODEL_FILE, iter_shard_dirs, parse_shard_dir, shard_coords
from ckptinspect.formats.args_values import arg_flag, arg_int
from ckptinspect.model import Checkpoint, Format

# Args that legitimately differ between the processes that wrote the shards.
_PER_RANK_ARGS = frozenset({"rank", "local_rank", "distributed_timeout_minutes"})


_IN_PROGRESS = ": the save is being written (an untracked iteration whose newest file is within the grace)"


def run(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.format is not Format.TORCH:
        return
    for f in _grid(ckpt):
        # a save being written (the reader's `save_in_progress`) has not written these yet: unfinished, not damaged
        yield Finding("CK132", f.message + _IN_PROGRESS, f.subject, f.path, f.details) if ckpt.save_in_progress else f
    yield from _args_agree(ckpt)


def _grid(ckpt: Checkpoint) -> Iterator[Finding]:
    shard_files = ckpt.shard_files
    if not shard_files:
        return  # a single .pt file: nothing to cross-check
    args = ckpt.args or {}
    tp = arg_int(args, "tensor_model_parallel_size", "model_parallel_size")
    # PP / EP as the reader resolved them: args when valid, else the shard dirs (`topology.sources` says which)
    pp = ckpt.topology.pp or 1
    ep = ckpt.topology.ep or 1
    if tp is not None:
        expected = tp * pp * ep
        # the first missing names only (args may name a grid far larger than the dirs on disk); the count is exact
        missing = list(islice((d for d in iter_shard_dirs(tp, pp, ep) if d not in shard_files), 1024))
        if missing:
            present = sum(1 for d in shard_files if _in_grid(d, tp, pp, ep))
            yield Finding("CK110", f"{expected - present} of {expected} shard dir(s) missing for TP={tp} PP={pp}"
                          f" EP={ep}: {', '.join(missing[:8])}", missing[0], ckpt.path,
                          {"missing": missing, "expected": expected})
    # a shard dir this user could not list (CK209 from the reader) is not judged: its files are unknown, not missing
    unread = {f.subject for f in ckpt.findings if f.code == UNREAD_CODE}
    for name, files in sorted(shard_files.items()):
        if MODEL_FILE not in files and name not in unread:
            yield Finding("CK110", f"{name}: shard dir without {MODEL_FILE}", f"{name}/{MODEL_FILE}", ckpt.path)
    if arg_flag(args, "use_distributed_optimizer"):
        lacking = [n for n, files in sorted(shard_files.items()) if DISTOPT_FILE not in files and n not in unread]
        if lacking:
            yield Finding("CK111", f"args say use_distributed_optimizer but {len(lacking)} shard dir(s) have no"
                          f" {DISTOPT_FILE}: {', '.join(lacking[:8])}", f"{lacking[0]}/{DISTOPT_FILE}", ckpt.path,
                          {"shards": lacking})


def _args_agree(ckpt: Checkpoint) -> Iterator[Finding]:
    shard_args = ckpt.shard_args
    if len(shard_args) > 1:
        names = sorted(shard_args)
        ref_name, ref = names[0], shard_args[names[0]]
        for name in names[1:]:
            other = shard_args[name]
            differ = sorted(k for k in set(ref) | set(other)
                            if k not in _PER_RANK_ARGS and repr(ref.get(k)) != repr(other.get(k)))
            if differ:
                yield Finding("CK112", f"{name}: args differ from {ref_name} in {', '.join(differ[:8])}",
                              f"{name}/{MODEL_FILE}", ckpt.path,
                              {"args": differ, "a": {k: repr(ref.get(k)) for k in differ[:8]},
                               "b": {k: repr(other.get(k)) for k in differ[:8]}})




def _in_grid(name: str, tp: int, pp: int, ep: int) -> bool:
    """Whether shard dir `name` is one Megatron writes for TP×PP×EP (the name shape and the coordinates)."""
    s = parse_shard_dir(name)
    if s is None:
        return False
    t, p, e = shard_coords(s, pp, ep)
    parts = 1 + (pp > 1) + (ep > 1)
    return (1 + (s.second is not None) + (s.third is not None)) == parts and t < tp and p < pp and e < ep
