#!/usr/bin/env python3
"""Write a synthetic, metadata-faithful Megatron-Core ``torch_dist`` checkpoint of any size.

Its purpose is benchmarking and stress-testing checkpoint inspectors on checkpoints
with 10^5..10^6+ DCP chunks, which cannot be produced by actually training.

What is genuine:

* ``.metadata`` is a real ``torch.distributed.checkpoint.metadata.Metadata`` built from
  torch's own classes and pickled exactly like ``FileSystemWriter.finish`` does
  (``pickle.dump(metadata, f)``, default protocol). Object sharing follows a real
  Megatron save: chunk objects are shared between ``state_dict_metadata`` and
  ``all_local_plans``; FQN strings are shared within one rank, not across ranks;
  each ``relative_path`` string is shared by the items of its file; ``planner_data`` is
  ``None``; 1-D DistOpt chunks carry ``MetadataIndex.index`` hints, model chunks do not.
* The layout models a large Megatron GPT run (TE layer spec, stacked layers,
  ``singleton_local_shards=False``) with TP x PP x DP, the distributed optimizer in
  ``dp_reshardable`` mode (Megatron's bucketing and 64-element param padding, the
  per-DP-rank piece cutting of ``sharded_param_state_dp_reshardable``), Megatron's
  fully-parallel save distribution of model shards over the DP group
  (``distribute_shards_to_ranks``), Megatron's per-rank file split
  (``_split_by_size_and_type``), byte items first in every file, items back to back.
* ``common.pt`` (``torch.save`` of plain Python/torch objects) and the 4-key
  ``metadata.json`` model Megatron-Core <= 0.18.

What is synthetic: the ``__{rank}_{i}.distcp`` files are sparse (``truncate``), so they
take no disk space and their content reads as zeros.  With ``--real-headers`` every item
is a genuine ``torch.save`` archive (byte items: real payloads; tensor items: real zip
records whose tensor data region is left as a hole, so ``torch.load`` returns zeros);
this costs ~0.3 ms and one or two file-system blocks per item, so use it for <= ~200k chunks.

``--chunks N`` picks a model preset, the DP size and the DDP bucket size so that the
number of tensor chunks is within ~5 % of N (explicit ``--layers/--tp/--pp/--dp/...``
override the preset and are kept fixed).

Examples::

    python tools/make_synthetic_ckpt.py /tmp/ck200k --chunks 200000 --check
    python tools/make_synthetic_ckpt.py /tmp/run --save-dir --chunks 1000000
    python tools/make_synthetic_ckpt.py /tmp/tiny --preset tiny --real-headers --check

The output is deterministic for a given command line (the seed feeds ``save_id`` and the
byte payloads; ``checkpoint_id`` is the output path as given).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gc
import heapq
import io
import json
import math
import os
import pickle
import random
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

DCP_VERSION = "1.0.0"  # torch.distributed.checkpoint.filesystem.CURRENT_DCP_VERSION
OPT_DTYPE_KEY = "(torch.float32, torch.float32)"
OPT_STATES = ("param", "exp_avg", "exp_avg_sq")
CHUNK_TOL = 0.05  # --chunks tolerance

# ----------------------------------------------------------------------------------------
# Model presets (Llama-style GPT with TE layer spec; softmax_type=learnable adds the small
# per-layer ``core_attention.softmax_offset`` params that produce padding chunks in the
# DistOpt buckets, as in gpt-oss style models).
# ----------------------------------------------------------------------------------------
PRESETS: dict[str, dict[str, Any]] = {
    # name: layers, hidden, heads, query_groups, ffn, vocab, tp, pp, dp
    "large": dict(layers=126, hidden=16384, heads=128, query_groups=8, ffn=53248, vocab=128256, tp=8, pp=16, dp=64),
    "medium": dict(layers=80, hidden=8192, heads=64, query_groups=8, ffn=28672, vocab=128256, tp=8, pp=4, dp=16),
    "small": dict(layers=32, hidden=4096, heads=32, query_groups=8, ffn=14336, vocab=128256, tp=2, pp=2, dp=8),
    "tiny": dict(layers=4, hidden=64, heads=4, query_groups=2, ffn=192, vocab=512, tp=2, pp=2, dp=2),
}
PRESET_ORDER = ("large", "medium", "small", "tiny")
MAX_DP = 4096
DEFAULT_BUCKET = 40_000_000  # elements; Megatron default is max(40M, 1M*DP)
DP_CANDIDATES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
GRID_FIELDS = ("layers", "hidden", "heads", "query_groups", "ffn", "vocab", "tp", "pp", "dp")


@dataclasses.dataclass
class Spec:
    layers: int
    hidden: int
    heads: int
    query_groups: int
    ffn: int
    vocab: int
    tp: int
    pp: int
    dp: int
    bucket_size: Optional[int]  # None = one bucket per buffer
    swiglu: bool = True
    bias: bool = False
    softmax_learnable: bool = True
    extra_state: bool = True
    rerun_state: bool = True
    param_dtype: str = "float32"
    files_per_rank: int = 1
    preset: str = "custom"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def padded_vocab(self) -> int:
        div = 128 * self.tp
        return -(-self.vocab // div) * div

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.query_groups) * self.head_dim

    def check(self) -> None:
        if self.hidden % self.heads:
            raise SystemExit("--hidden must be divisible by --heads")
        if self.heads % self.query_groups:
            raise SystemExit("--heads must be divisible by --query-groups")
        for name, val in (("hidden", self.hidden), ("heads", self.heads), ("query-groups", self.query_groups),
                          ("ffn", self.ffn)):
            if val % self.tp:
                raise SystemExit(f"--{name} ({val}) must be divisible by --tp ({self.tp})")
        if self.layers < self.pp:
            raise SystemExit("--layers must be >= --pp")
        if min(self.tp, self.pp, self.dp, self.files_per_rank) < 1:
            raise SystemExit("parallel sizes must be >= 1")


def rank_of(spec: Spec, tp: int, dp: int, pp: int) -> int:
    """Megatron's default rank order tp-cp-ep-dp-pp (tp fastest)."""
    return tp + spec.tp * (dp + spec.dp * pp)


def stage_layer_counts(layers: int, pp: int) -> list[int]:
    """Even split; otherwise fewer layers on the first and last stage
    (like --decoder-first/last-pipeline-num-layers, e.g. 126 layers / PP16 = 7+14*8+7)."""
    if layers % pp == 0:
        return [layers // pp] * pp
    if pp >= 3:
        base = -(-layers // pp)
        rem = layers - base * (pp - 2)
        if 2 <= rem <= 2 * base:
            return [rem // 2] + [base] * (pp - 2) + [rem - rem // 2]
    q, r = divmod(layers, pp)
    return [q + (1 if i < r else 0) for i in range(pp)]


# ----------------------------------------------------------------------------------------
# Model structure
# ----------------------------------------------------------------------------------------
# A model entry is ('T', key, global_shape, chunks_fn, replicated) or ('B', key_prefix).
# chunks_fn(tp) -> list of (offsets, sizes) *without* the stacked layer axis.


def _split(axis: int, shape: tuple[int, ...], T: int, parts: int = 1):
    """Chunks of a tensor split over TP on ``axis``; ``parts=2`` is the SwiGLU w/v split."""

    def fn(tp: int):
        out = []
        unit = shape[axis] // (T * parts)
        for p in range(parts):
            off = [0] * len(shape)
            off[axis] = (p * T + tp) * unit
            sz = list(shape)
            sz[axis] = unit
            out.append((tuple(off), tuple(sz)))
        return out

    return fn


def _repl(shape: tuple[int, ...]):
    return lambda tp: [((0,) * len(shape), tuple(shape))]


def layer_entries(spec: Spec) -> list[tuple]:
    """Per-layer model entries in Megatron state-dict order (TE spec)."""
    h, T, F, Q = spec.hidden, spec.tp, spec.ffn, spec.qkv_out
    sa, mlp = "decoder.layers.self_attention", "decoder.layers.mlp"
    e: list[tuple] = [("T", f"{sa}.linear_qkv.layer_norm_weight", (h,), _repl((h,)), True)]
    if spec.bias:
        e.append(("T", f"{sa}.linear_qkv.layer_norm_bias", (h,), _repl((h,)), True))
    if spec.softmax_learnable:
        e.append(("T", f"{sa}.core_attention.softmax_offset", (spec.heads,), _split(0, (spec.heads,), T), False))
    e.append(("T", f"{sa}.linear_proj.weight", (h, h), _split(1, (h, h), T), False))
    if spec.bias:
        e.append(("T", f"{sa}.linear_proj.bias", (h,), _repl((h,)), True))
    if spec.extra_state:
        e.append(("B", f"{sa}.linear_proj._extra_state"))
    e.append(("T", f"{sa}.linear_qkv.weight", (Q, h), _split(0, (Q, h), T), False))
    if spec.bias:
        e.append(("T", f"{sa}.linear_qkv.bias", (Q,), _split(0, (Q,), T), False))
    if spec.extra_state:
        e.append(("B", f"{sa}.linear_qkv._extra_state"))
    e.append(("T", f"{mlp}.linear_fc1.layer_norm_weight", (h,), _repl((h,)), True))
    if spec.bias:
        e.append(("T", f"{mlp}.linear_fc1.layer_norm_bias", (h,), _repl((h,)), True))
    F1, parts = (2 * F, 2) if spec.swiglu else (F, 1)
    e.append(("T", f"{mlp}.linear_fc1.weight", (F1, h), _split(0, (F1, h), T, parts), False))
    if spec.bias:
        e.append(("T", f"{mlp}.linear_fc1.bias", (F1,), _split(0, (F1,), T, parts), False))
    if spec.extra_state:
        e.append(("B", f"{mlp}.linear_fc1._extra_state"))
    e.append(("T", f"{mlp}.linear_fc2.weight", (h, F), _split(1, (h, F), T), False))
    if spec.bias:
        e.append(("T", f"{mlp}.linear_fc2.bias", (h,), _repl((h,)), True))
    if spec.extra_state:
        e.append(("B", f"{mlp}.linear_fc2._extra_state"))
    return e


def local_numel(entry: tuple, T: int) -> int:
    """Numel of the *parameter* an entry corresponds to on one TP rank."""
    _, _, shape, fn, _ = entry
    return sum(math.prod(sz) for _, sz in fn(0))


@dataclasses.dataclass
class Stage:
    pp: int
    first_layer: int
    n_layers: int
    entries: list[tuple]  # ('T', key, gshape, offsets_fn(tp)->list[(off, sz)], replicated) or ('B', key)
    params: list[int]  # local param numels in model (registration) order
    buckets: list[tuple[int, int, list[int]]] = dataclasses.field(default_factory=list)  # (U, S, cuts)


def build_stage(spec: Spec, pp: int, counts: list[int], with_entries: bool = True) -> Stage:
    T, L, h, V = spec.tp, spec.layers, spec.hidden, spec.padded_vocab
    first = sum(counts[:pp])
    n = counts[pp]
    lents = layer_entries(spec)
    params: list[int] = []
    entries: list[tuple] = []
    if pp == 0:
        ent = ("T", "embedding.word_embeddings.weight", (V, h), _split(0, (V, h), T), False)
        entries.append(ent)
        params.append(local_numel(ent, T))
    layer_param_numels = [local_numel(e, T) for e in lents if e[0] == "T"]
    for li in range(first, first + n):
        params.extend(layer_param_numels)
        if with_entries:
            for e in lents:
                if e[0] == "T":
                    _, key, gshape, fn, repl = e
                    entries.append(("T", key, (L,) + gshape, _prepend(fn, li), repl))
                else:
                    entries.append(("B", f"{e[1]}/shard_{li}_{L}"))
    if pp == spec.pp - 1:
        ents = [("T", "decoder.final_layernorm.weight", (h,), _repl((h,)), True)]
        if spec.bias:
            ents.append(("T", "decoder.final_layernorm.bias", (h,), _repl((h,)), True))
        ents.append(("T", "output_layer.weight", (V, h), _split(0, (V, h), T), False))
        for ent in ents:
            entries.append(ent)
            params.append(local_numel(ent, T))
    return Stage(pp=pp, first_layer=first, n_layers=n, entries=entries, params=params)


def _prepend(fn, layer: int):
    return lambda tp: [((layer,) + off, (1,) + sz) for off, sz in fn(tp)]


# ----------------------------------------------------------------------------------------
# Distributed-optimizer buffer / buckets (megatron/core/distributed/param_and_grad_buffer.py)
# ----------------------------------------------------------------------------------------
def bucketize(params: list[int], bucket_size: Optional[int], dp: int) -> list[tuple[int, int, list[int]]]:
    """Returns per bucket (numel_unpadded U, per-DP-rank shard numel S, sorted interior cut
    points = param starts/ends relative to the bucket, excluding 0 and U)."""
    end_div = math.lcm(dp, 128)

    def pad(x: int, d: int) -> int:
        return -(-x // d) * d

    buckets = []
    bucket_start = 0
    param_start = 0
    param_end = 0
    cur: list[int] = []
    for numel in reversed(params):  # backprop order
        param_start = pad(param_start, 64)
        param_end = param_start + numel
        cur.append(param_start - bucket_start)
        cur.append(param_end - bucket_start)
        if bucket_size is not None and param_end - bucket_start >= bucket_size:
            end = pad(param_end, end_div)
            buckets.append(_finish_bucket(param_end - bucket_start, (end - bucket_start) // dp, cur))
            bucket_start = param_start = end
            cur = []
        else:
            param_start = param_end
    if cur:
        end = pad(param_end, end_div)
        buckets.append(_finish_bucket(param_end - bucket_start, (end - bucket_start) // dp, cur))
    return buckets


def _finish_bucket(U: int, S: int, cuts: list[int]) -> tuple[int, int, list[int]]:
    return (U, S, sorted({c for c in cuts if 0 < c < U}))


def bucket_pieces(bucket: tuple[int, int, list[int]], d: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of DP rank ``d`` (params and padding, tiling its range)."""
    U, S, cuts = bucket
    lo = d * S
    if lo >= U:
        return []
    hi = min(lo + S, U)
    pts = [lo] + cuts[bisect.bisect_right(cuts, lo): bisect.bisect_left(cuts, hi)] + [hi]
    return [(a, b - a) for a, b in zip(pts, pts[1:])]


def count_bucket_pieces(bucket: tuple[int, int, list[int]]) -> int:
    U, S, cuts = bucket
    n_dp = -(-U // S) - 1  # interior DP boundaries k*S < U
    shared = sum(1 for c in cuts if c % S == 0)
    return len(cuts) + n_dp - shared + 1


# ----------------------------------------------------------------------------------------
# Sizing (--chunks)
# ----------------------------------------------------------------------------------------
def model_chunk_count(spec: Spec) -> int:
    T = spec.tp
    per_layer = 0
    for e in layer_entries(spec):
        if e[0] == "T":
            per_layer += 1 if e[4] else len(e[3](0)) * T
    return per_layer * spec.layers + 2 * T + (2 if spec.bias else 1)


def chunk_count(spec: Spec, stage_params: list[list[int]]) -> int:
    opt = 0
    for params in stage_params:
        opt += sum(count_bucket_pieces(b) for b in bucketize(params, spec.bucket_size, spec.dp))
    return model_chunk_count(spec) + 3 * spec.tp * opt


def megatron_default_bucket_size(dp: int) -> int:
    return max(40_000_000, 1_000_000 * dp)


def choose_spec(args: argparse.Namespace) -> tuple[Spec, int]:
    """Resolve preset / explicit knobs / --chunks into a Spec; returns (spec, predicted chunks)."""
    explicit = {f: getattr(args, f) for f in GRID_FIELDS if getattr(args, f) is not None}
    common = dict(swiglu=args.swiglu, bias=args.bias, softmax_learnable=args.softmax_type == "learnable",
                  extra_state=args.extra_state, rerun_state=args.rerun_state, param_dtype=args.param_dtype,
                  files_per_rank=args.files_per_rank)

    def make(preset: str, dp: Optional[int], bucket_size: Optional[int]) -> Spec:
        vals = dict(PRESETS[preset])
        vals.update(explicit)
        if dp is not None:
            vals["dp"] = dp
        return Spec(**vals, bucket_size=bucket_size, preset=preset, **common)

    def stage_params_of(spec: Spec) -> list[list[int]]:
        counts = stage_layer_counts(spec.layers, spec.pp)
        return [build_stage(spec, pp, counts, with_entries=False).params for pp in range(spec.pp)]

    presets = [args.preset] if args.preset else list(PRESET_ORDER)
    if args.chunks is None:
        spec = make(presets[0], None, None)
        spec.bucket_size = args.bucket_size if args.bucket_size is not None else DEFAULT_BUCKET
        if args.one_bucket:
            spec.bucket_size = None
        spec.check()
        return spec, chunk_count(spec, stage_params_of(spec))

    N = args.chunks
    fixed_bucket = args.bucket_size is not None or args.one_bucket
    # 1) Fixed bucket size (40M elements), scan the DP size: a fine-grained knob, since every
    #    DP rank adds ~one piece per bucket (405B-like: ~9.5k chunks per DP rank, 1M chunks at
    #    DP~104, i.e. a 13k-GPU world).
    if "dp" not in explicit and not fixed_bucket:
        for preset in presets:
            base = make(preset, 1, DEFAULT_BUCKET)
            try:
                base.check()
            except SystemExit:
                continue
            sp = stage_params_of(base)

            def f(dp: int) -> int:
                return chunk_count(dataclasses.replace(base, dp=dp), sp)

            lo, hi = 1, MAX_DP
            if f(lo) > N * (1 + CHUNK_TOL):
                continue  # even DP=1 is too big: try a smaller preset
            while hi - lo > 1:  # smallest dp with f(dp) >= N (f is ~linear in dp)
                mid = (lo + hi) // 2
                if f(mid) >= N:
                    hi = mid
                else:
                    lo = mid
            cands = sorted({max(1, min(MAX_DP, x)) for x in range(lo - 2, hi + 3)})
            scored = sorted((abs(f(dp) - N), dp) for dp in cands)
            dp = scored[0][1]
            c = f(dp)
            if abs(c - N) / N <= CHUNK_TOL:
                return dataclasses.replace(base, dp=dp), c
    # 2) Otherwise search the bucket size (for fixed --dp, or targets out of reach above).
    best: Optional[tuple[float, Spec, int]] = None  # (relative error, spec, count) fallback
    for preset in presets:
        dps = [explicit["dp"]] if "dp" in explicit else list(DP_CANDIDATES)
        feasible: list[tuple[float, Spec, int]] = []
        for dp in dps:
            spec = make(preset, dp, None)
            try:
                spec.check()
            except SystemExit:
                continue
            sp = stage_params_of(spec)
            if fixed_bucket:
                spec.bucket_size = None if args.one_bucket else args.bucket_size
                cand = [(spec.bucket_size, chunk_count(spec, sp))]
            else:
                cand = _search_bucket_size(spec, sp, N)
            for bs, c in cand:
                err = abs(c - N) / N
                s2 = dataclasses.replace(spec, bucket_size=bs)
                if best is None or err < best[0]:
                    best = (err, s2, c)
                if err <= CHUNK_TOL:
                    score = abs(math.log((bs or 10**12) / megatron_default_bucket_size(dp)))
                    feasible.append((score, s2, c))
        if feasible:
            feasible.sort(key=lambda t: (t[0], t[1].dp))
            _, spec, c = feasible[0]
            return spec, c
    assert best is not None
    err, spec, c = best
    print(f"warning: cannot reach --chunks {N} within {CHUNK_TOL:.0%} with the fixed knobs; "
          f"closest is {c} chunks", file=sys.stderr)
    return spec, c


def _search_bucket_size(spec: Spec, sp: list[list[int]], N: int) -> list[tuple[Optional[int], int]]:
    """Bisection (log scale) for the bucket size whose chunk count is closest to N."""

    def f(bs: Optional[int]) -> int:
        return chunk_count(dataclasses.replace(spec, bucket_size=bs), sp)

    total = max(sum(p) for p in sp)
    c_min = f(None)
    if c_min >= N:
        return [(None, c_min)]
    lo, hi = 1, total  # f(lo) large, f(hi) small
    c_lo = f(lo)
    if c_lo <= N:
        return [(lo, c_lo)]
    best = (abs(c_min - N), None, c_min)
    for _ in range(64):
        if hi - lo <= 1:
            break
        mid = int(math.sqrt(lo * hi)) if hi > 4 * lo else (lo + hi) // 2
        mid = min(max(mid, lo + 1), hi - 1)
        c = f(mid)
        if abs(c - N) < best[0]:
            best = (abs(c - N), mid, c)
        if c > N:
            lo = mid
        else:
            hi = mid
    return [(best[1], best[2])]


# ----------------------------------------------------------------------------------------
# Byte payloads (torch.save([obj]) like Megatron's ShardedObject serialization)
# ----------------------------------------------------------------------------------------
def _tsave(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class Payloads:
    def __init__(self, spec: Spec, seed: int, stages: list[Stage]):
        self.spec = spec
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        rng_entry = {
            "random_rng_state": rng.getstate(),
            "torch_rng_state": g.get_state(),
            "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
            "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)},
        }
        self.rng = _tsave([[rng_entry]])
        self.extra = _tsave([None])
        self.rerun = _tsave([{
            "rerun_requested": False, "checkpoint_requested": False, "restart_again_requested": False,
            "continue_requested": False,
            "error_injector_checkpoint": {"injected_error_count": 0},
            "failed_validation_call": None, "initial_result": None, "suspicious_node": None,
            "suspicious_device": None, "data_iterator_checkpoints": None,
            "large_value_counts": {}, "max_values": {},
        }])
        self.optimizer: dict[int, bytes] = {}
        self.per_bucket: dict[int, bytes] = {}
        self.per_bucket_unpadded: dict[int, bytes] = {}
        dkey = (torch.float32, torch.float32)
        for st in stages:
            nparams = len(st.params)
            groups = [
                {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd, "amsgrad": False,
                 "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                 "fused": None, "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False,
                 "is_decoupled_lr": False, "default_config": True, "max_lr": 3e-4, "min_lr": 3e-5,
                 "step": 1, "params": list(idx)}
                for wd, idx in ((0.1, range(0, nparams, 2)), (0.0, range(1, nparams, 2)))
            ]
            self.optimizer[st.pp] = _tsave([{"param_groups": groups}])
            padded = [S * spec.dp for _, S, _ in st.buckets]
            unpadded = [U for U, _, _ in st.buckets]
            self.per_bucket[st.pp] = _tsave([[{dkey: padded}]])
            self.per_bucket_unpadded[st.pp] = _tsave([[{dkey: unpadded}]])


# ----------------------------------------------------------------------------------------
# Tensor record sizes / real archives
# ----------------------------------------------------------------------------------------
def _calibrate_overhead() -> int:
    """torch.save(tensor) archive size = floor64(nbytes) + overhead (torch 2.x, ZIP_STORED,
    storage_alignment 64); verified exact for 1..3-D float32/bfloat16 tensors < 4 GiB."""
    return len(_tsave(torch.zeros(16))) - 64


class _SkipWriter(io.RawIOBase):
    """File-like that writes torch.save output but seeks over the (all-zero) data record."""

    def __init__(self, f, skip_nbytes: int):
        self.f, self.skip, self.n = f, skip_nbytes, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if n == self.skip and self.skip >= 512:
            self.f.seek(n, io.SEEK_CUR)
            self.skip = -1
        else:
            self.f.write(b)
        self.n += n
        return n

    def tell(self) -> int:
        return self.n

    def flush(self) -> None:
        pass


class ArchiveWriter:
    """Writes genuine torch.save archives of zero tensors without touching the data region."""

    def __init__(self, scratch: Path):
        from torch.utils.serialization import config

        self._cfg = config
        self._old = config.save.compute_crc32
        config.save.compute_crc32 = False  # otherwise miniz reads (and page-faults) the data
        self.scratch = scratch
        self.scratch_size = 0
        self._fh = open(scratch, "wb")

    def write_tensor(self, f, sizes: tuple[int, ...], dtype: torch.dtype) -> int:
        nb = math.prod(sizes) * dtype.itemsize
        if nb > self.scratch_size:
            self.scratch_size = max(nb, 2 * self.scratch_size, 1 << 20)
            self._fh.truncate(self.scratch_size)
            self._fh.flush()
        st = torch.UntypedStorage.from_file(str(self.scratch), shared=True, nbytes=nb) if nb else torch.UntypedStorage(0)
        t = torch.empty(0, dtype=dtype).set_(st, 0, sizes)
        w = _SkipWriter(f, nb)
        torch.save(t, w)
        return w.n

    def close(self) -> None:
        self._cfg.save.compute_crc32 = self._old
        self._fh.close()
        try:
            self.scratch.unlink()
        except FileNotFoundError:
            pass


# ----------------------------------------------------------------------------------------
# Layout: which rank writes which item
# ----------------------------------------------------------------------------------------
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def fully_parallel_assign(model_shards: list[tuple], opt_loads: list[int], dp: int) -> list[list[int]]:
    """megatron.core.dist_checkpointing.exchange_utils.distribute_shards_to_ranks:
    shards of coverage 1 (DistOpt pieces) first -> ``opt_loads``; then model shards by
    (-size, shard_id) to the least loaded DP rank (ties: lowest rank)."""
    heap = [(opt_loads[d], d) for d in range(dp)]
    heapq.heapify(heap)
    out: list[list[int]] = [[] for _ in range(dp)]
    order = sorted(range(len(model_shards)), key=lambda i: (-model_shards[i][0], model_shards[i][1]))
    for i in order:
        load, d = heapq.heappop(heap)
        out[d].append(i)
        heapq.heappush(heap, (load + model_shards[i][0], d))
    return out


def split_files(items: list[tuple], bins: int, nbytes_of) -> list[list[tuple]]:
    """megatron ...strategies.filesystem_async._split_by_size_and_type."""
    if bins == 1:
        return [items]
    byts = [it for it in items if it[0] == "B"]
    tens = [it for it in items if it[0] != "B"]
    buckets: list[list[tuple]] = [[] for _ in range(bins)]
    for i, it in enumerate(byts):
        buckets[i % bins].append(it)
    sized = sorted(((it, nbytes_of(it)) for it in tens), key=lambda x: x[1], reverse=True)
    heap = [(0, i) for i in range(bins)]
    for it, size in sized:
        tot, b = heapq.heappop(heap)
        buckets[b].append(it)
        heapq.heappush(heap, (tot + size, b))
    return buckets


def _fresh(s: str) -> str:
    """A new str object equal to ``s`` (FQN strings are shared per rank, not across ranks)."""
    return s[:1] + s[1:] if len(s) > 1 else "".join(["", s, ""])


@dataclasses.dataclass
class Totals:
    tensors: int = 0
    chunks: int = 0
    model_chunks: int = 0
    opt_chunks: int = 0
    byte_items: int = 0
    files: int = 0
    data_bytes: int = 0
    plan_items: int = 0


def iter_ranks(spec: Spec, stages: list[Stage], payloads: Payloads) -> Iterable[tuple[int, int, list[tuple]]]:
    """Every rank's items in save order: (rank, pp, items), items ``("B", key, length, payload kind)`` or
    ``("T", key, offsets, sizes, global shape, dtype, MetadataIndex.index)``. Deterministic: the streaming writer
    replays it once per section of the pickle."""
    T, DP, PP, W = spec.tp, spec.dp, spec.pp, spec.world
    isz_model = _DTYPES[spec.param_dtype].itemsize
    mdtype = _DTYPES[spec.param_dtype]
    f32 = torch.float32
    opt_prefix = "optimizer.distributed.dp_group_idx_{g}"

    for pp, st in enumerate(stages):
        # Per-DP-rank DistOpt pieces (identical for all TP ranks of the stage).
        pieces = [[bucket_pieces(b, d) for b in st.buckets] for d in range(DP)]
        opt_loads = [3 * 4 * sum(n for bp in pieces[d] for _, n in bp) for d in range(DP)]
        # Model tensor shards per TP rank, in state-dict order with key first-seen ranks.
        key_rank: dict[str, int] = {}
        for e in st.entries:
            key_rank.setdefault(e[1], len(key_rank))
        group_items: list[list[list[tuple]]] = []  # [tp][dp] -> model items (plan order)
        for tp in range(T):
            shards: list[tuple] = []  # (nbytes, shard_id, item)
            bytes_items: list[tuple] = []
            seq = 0
            for e in st.entries:
                if e[0] == "B":
                    if tp == 0:
                        bytes_items.append((key_rank[e[1]], seq, ("B", e[1], len(payloads.extra), "extra")))
                    seq += 1
                    continue
                _, key, gshape, fn, repl = e
                if repl and tp != 0:
                    continue
                for off, sz in fn(tp):
                    nb = math.prod(sz) * isz_model
                    shards.append((nb, (key, off), (key_rank[key], seq, ("T", key, off, sz, gshape, mdtype, None))))
                    seq += 1
            assign = fully_parallel_assign(shards, opt_loads, DP)
            per_dp = []
            for d in range(DP):
                lst = [shards[i][2] for i in assign[d]]
                if d == 0:
                    lst += bytes_items
                lst.sort(key=lambda x: (x[0], x[1]))
                per_dp.append([x[2] for x in lst])
            group_items.append(per_dp)

        for d in range(DP):
            for tp in range(T):
                rank = rank_of(spec, tp, d, pp)
                g = tp + T * pp
                gp = opt_prefix.format(g=g)
                items: list[tuple] = list(group_items[tp][d])
                if d == 0:
                    items.append(("B", f"rng_state/shard_{pp}.{tp}_{PP}.{T}", len(payloads.rng), "rng"))
                    items.append(("B", f"{gp}.optimizer/shard_0_1", len(payloads.optimizer[pp]), "opt"))
                    items.append(("B", f"{gp}.per_bucket_numel/shard_0_1", len(payloads.per_bucket[pp]), "pbn"))
                    items.append(("B", f"{gp}.per_bucket_numel_unpadded/shard_0_1",
                                  len(payloads.per_bucket_unpadded[pp]), "pbnu"))
                if spec.rerun_state:
                    items.append(("B", f"rerun_state_machine_state/shard_{rank}_{W}", len(payloads.rerun), "rerun"))
                for k, b in enumerate(st.buckets):
                    U = b[0]
                    bp = pieces[d][k]
                    for state in OPT_STATES:
                        key = f"{gp}.gbuf_idx_0.dtype_{OPT_DTYPE_KEY}.bucket_idx_{k}.{state}"
                        for i, (o, n) in enumerate(bp):
                            items.append(("T", key, (o,), (n,), (U,), f32, i))
                yield rank, pp, items


def generate(spec: Spec, out: Path, seed: int, plans: bool, real_headers: bool,
             checkpoint_id: Optional[str] = None, log=print) -> tuple[Totals, dict]:
    T, DP, PP = spec.tp, spec.dp, spec.pp
    W = spec.world
    L = spec.layers
    mdtype = _DTYPES[spec.param_dtype]
    isz_model = mdtype.itemsize
    f32 = torch.float32
    overhead = _calibrate_overhead()
    counts = stage_layer_counts(L, PP)
    stages = [build_stage(spec, pp, counts) for pp in range(PP)]
    for st in stages:
        st.buckets = bucketize(st.params, spec.bucket_size, DP)
    payloads = Payloads(spec, seed, stages)
    rngm = random.Random(seed ^ 0x5EED)
    save_id = str(uuid.UUID(int=rngm.getrandbits(128), version=4))

    def tlen(sizes: tuple[int, ...], isz: int) -> int:
        nb = math.prod(sizes) * isz
        return (nb - nb % 64 + overhead) if nb else overhead - 64

    tot = Totals()
    sdm: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    all_plans: list[SavePlan] = []
    out.mkdir(parents=True, exist_ok=True)
    archiver = ArchiveWriter(out / ".synthetic_scratch") if real_headers else None
    SHARD, BYTE_IO = WriteItemType.SHARD, WriteItemType.BYTE_IO
    last_pp = -1
    for rank, pp, items in iter_ranks(spec, stages, payloads):
        if pp != last_pp and last_pp >= 0 and (last_pp == 0 or (last_pp + 1) % max(1, PP // 4) == 0):
            log(f"  stage {last_pp + 1}/{PP}: {tot.chunks} chunks, {tot.files} files so far")
        last_pp = pp
        _emit_rank(rank, items, spec, out, sdm, storage, all_plans, tot, tlen, isz_model,
                   payloads, pp, archiver, SHARD, BYTE_IO)
    log(f"  stage {PP}/{PP}: {tot.chunks} chunks, {tot.files} files")

    if archiver is not None:
        archiver.close()
    tot.tensors = sum(1 for v in sdm.values() if isinstance(v, TensorStorageMetadata))
    md = Metadata(
        state_dict_metadata=sdm,
        planner_data=None,
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id=checkpoint_id if checkpoint_id is not None else str(out),
                                 save_id=save_id, load_id=None),
        version=DCP_VERSION,
    )
    if plans:
        md.all_local_plans = all_plans  # type: ignore[attr-defined]
    info = {"save_id": save_id}
    return tot, {"metadata": md, **info}


def _emit_rank(rank, items, spec, out, sdm, storage, all_plans, tot, tlen, isz_model, payloads, pp,
               archiver, SHARD, BYTE_IO) -> None:
    """Build one rank's SavePlan + storage entries + data files."""

    def nbytes_of(it):
        return math.prod(it[3]) * it[5].itemsize

    bins = split_files(items, spec.files_per_rank, nbytes_of)
    pfq: dict[str, str] = {}  # per-rank FQN strings of the plan (shared with state_dict_metadata)
    sfq: dict[str, str] = {}  # per-rank FQN strings of the write results (storage_data keys)
    witems = []
    for it in items:
        key = it[1]
        fq = pfq.get(key)
        if fq is None:
            fq = pfq[key] = _fresh(key)
        if it[0] == "B":
            witems.append(WriteItem(index=MetadataIndex(fq), type=BYTE_IO))
            if fq in sdm:
                raise AssertionError(f"duplicate byte item {fq}")
            sdm[fq] = BytesStorageMetadata()
            tot.byte_items += 1
        else:
            _, _, off, sz, gshape, dt, idx = it
            chunk = ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(sz))
            props = TensorProperties(dtype=dt)
            gsize = torch.Size(gshape)
            witems.append(WriteItem(index=MetadataIndex(fq, off, idx), type=SHARD,
                                    tensor_data=TensorWriteData(chunk=chunk, properties=props, size=gsize)))
            tmd = sdm.get(fq)
            if tmd is None:
                sdm[fq] = TensorStorageMetadata(properties=props, size=gsize, chunks=[chunk])
            else:
                tmd.chunks.append(chunk)
            tot.chunks += 1
            if idx is None:
                tot.model_chunks += 1
            else:
                tot.opt_chunks += 1
    all_plans.append(SavePlan(items=witems, storage_data=None, planner_data={}, usable=True))
    tot.plan_items += len(witems)

    file_no = 0
    for b in bins:
        if not b:
            continue
        rel = f"__{rank}_{file_no}.distcp"
        file_no += 1
        offset = 0
        ordered = [it for it in b if it[0] == "B"] + [it for it in b if it[0] != "B"]
        fh = open(out / rel, "wb") if archiver is not None else None
        for it in ordered:
            key = it[1]
            fq = sfq.get(key)
            if fq is None:
                fq = sfq[key] = _fresh(key)
            if it[0] == "B":
                length = it[2]
                storage[MetadataIndex(fq)] = _StorageInfo(rel, offset, length)
                if fh is not None:
                    fh.write(_payload_bytes(payloads, it[3], pp))
            else:
                _, _, off, sz, gshape, dt, idx = it
                length = tlen(sz, dt.itemsize)
                storage[MetadataIndex(fq, off, idx)] = _StorageInfo(rel, offset, length)
                if fh is not None:
                    n = archiver.write_tensor(fh, sz, dt)
                    if n != length:
                        raise AssertionError(f"archive size {n} != predicted {length} for {key} {sz}")
            offset += length
        if fh is None:
            with open(out / rel, "wb") as f:
                f.truncate(offset)
        else:
            fh.truncate(offset)
            fh.close()
        tot.files += 1
        tot.data_bytes += offset


def _payload_bytes(payloads: Payloads, kind: str, pp: int) -> bytes:
    return {
        "extra": lambda: payloads.extra,
        "rng": lambda: payloads.rng,
        "rerun": lambda: payloads.rerun,
        "opt": lambda: payloads.optimizer[pp],
        "pbn": lambda: payloads.per_bucket[pp],
        "pbnu": lambda: payloads.per_bucket_unpadded[pp],
    }[kind]()


# ----------------------------------------------------------------------------------------
# common.pt / metadata.json / tracker
# ----------------------------------------------------------------------------------------
def megatron_args(spec: Spec, iteration: int, save_dir: str) -> argparse.Namespace:
    counts = stage_layer_counts(spec.layers, spec.pp)
    uneven = len(set(counts)) > 1
    return argparse.Namespace(
        num_layers=spec.layers, hidden_size=spec.hidden, ffn_hidden_size=spec.ffn,
        num_attention_heads=spec.heads, num_query_groups=spec.query_groups,
        group_query_attention=spec.query_groups != spec.heads, kv_channels=spec.head_dim,
        seq_length=8192, max_position_embeddings=8192, position_embedding_type="rope",
        normalization="RMSNorm", swiglu=spec.swiglu, add_bias_linear=spec.bias, add_qkv_bias=spec.bias,
        softmax_type="learnable" if spec.softmax_learnable else "vanilla",
        untie_embeddings_and_output_weights=True, vocab_size=spec.vocab, padded_vocab_size=spec.padded_vocab,
        make_vocab_size_divisible_by=128, transformer_impl="transformer_engine",
        tensor_model_parallel_size=spec.tp, pipeline_model_parallel_size=spec.pp,
        decoder_first_pipeline_num_layers=counts[0] if uneven else None,
        decoder_last_pipeline_num_layers=counts[-1] if uneven else None,
        context_parallel_size=1, expert_model_parallel_size=1, expert_tensor_parallel_size=spec.tp,
        data_parallel_size=spec.dp, world_size=spec.world, rank=0,
        use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
        ddp_bucket_size=spec.bucket_size, optimizer="adam", adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        lr=3e-4, min_lr=3e-5, weight_decay=0.1, clip_grad=1.0,
        bf16=spec.param_dtype == "bfloat16", fp16=False,
        params_dtype=torch.bfloat16 if spec.param_dtype == "bfloat16" else torch.float32,
        micro_batch_size=1, global_batch_size=max(1, spec.dp) * 16, train_iters=1_000_000,
        iteration=iteration, consumed_train_samples=iteration * max(1, spec.dp) * 16,
        save=save_dir, load=save_dir, save_interval=1000, ckpt_format="torch_dist", use_dist_ckpt=True,
        ckpt_fully_parallel_save=True, ckpt_fully_parallel_load=False, async_save=False,
        dist_ckpt_strictness="assume_ok_unexpected", dist_ckpt_optim_fully_reshardable=False,
        ckpt_assume_constant_structure=False, rerun_mode="validate_results",
        seed=1234, tokenizer_type="HuggingFaceTokenizer",
    )


def write_common(spec: Spec, ckpt_dir: Path, iteration: int, save_dir: str) -> None:
    common = {
        "args": megatron_args(spec, iteration, save_dir),
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "num_floating_point_operations_so_far": 0,
        "opt_param_scheduler": {
            "max_lr": 3e-4, "lr_warmup_steps": 2000, "num_steps": iteration * max(1, spec.dp) * 16,
            "lr_decay_style": "cosine", "lr_decay_steps": 10**9, "min_lr": 3e-5, "start_wd": 0.1,
            "end_wd": 0.1, "wd_incr_style": "constant", "wd_incr_steps": 10**9,
        },
        "optimizer": {"param_state_sharding_type": "dp_reshardable"},
        "content_metadata": {
            "distrib_optim_sharding_type": "dp_reshardable",
            "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True,
        },
    }
    torch.save(common, ckpt_dir / "common.pt")
    with open(ckpt_dir / "metadata.json", "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)


# ----------------------------------------------------------------------------------------
# Self-check (torch-loaded)
# ----------------------------------------------------------------------------------------
def validate(out_dir: str | os.PathLike, log=print) -> list[str]:
    """Verify a checkpoint dir with torch-loaded metadata. Returns a list of errors.

    * torch's own global-plan validation (bounds, overlap, volume == prod(size));
    * every chunk and byte item has a storage_data entry, and nothing else does;
    * storage entries point into existing files and tile every file exactly;
    * ShardedObject families ``prefix/shard_<off>_<shape>`` are complete;
    * ``all_local_plans`` (if present) match the metadata: one plan per rank, each rank's
      items are exactly the storage entries of its ``__{rank}_*.distcp`` files;
    * metadata.json / common.pt are readable.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import default_planner

    d = Path(out_dir)
    errors: list[str] = []
    t0 = time.perf_counter()
    md = dcp.FileSystemReader(str(d)).read_metadata()
    log(f"  read_metadata: {time.perf_counter() - t0:.2f}s")
    plans = getattr(md, "all_local_plans", None)
    t0 = time.perf_counter()
    validate_fn = getattr(default_planner, "_validate_global_plan", None)
    if validate_fn is not None:
        res = validate_fn(plans if plans is not None else [None, None], md)
        if isinstance(res, bool):  # older torch returns bool
            if not res:
                errors.append("torch _validate_global_plan failed")
        else:
            errors.extend(res)
    else:
        errors.append("torch.distributed.checkpoint.default_planner._validate_global_plan not found")
    log(f"  torch _validate_global_plan: {time.perf_counter() - t0:.2f}s")

    sd = md.storage_data
    expected = 0
    for fqn, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            for c in v.chunks:
                expected += 1
                if MetadataIndex(fqn, c.offsets) not in sd:
                    errors.append(f"chunk without storage entry: {fqn} {tuple(c.offsets)}")
        else:
            expected += 1
            if MetadataIndex(fqn) not in sd:
                errors.append(f"byte item without storage entry: {fqn}")
    if len(sd) != expected:
        errors.append(f"storage_data has {len(sd)} entries, metadata describes {expected}")

    per_file: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k, v in sd.items():
        if k.fqn not in md.state_dict_metadata:
            errors.append(f"storage entry for unknown fqn {k.fqn}")
        per_file[v.relative_path].append((v.offset, v.length))
    on_disk = {p.name for p in d.glob("*.distcp")}
    for rel, spans in per_file.items():
        p = d / rel
        if not p.exists():
            errors.append(f"missing data file {rel}")
            continue
        size = p.stat().st_size
        spans.sort()
        pos = 0
        for o, n in spans:
            if o != pos:
                errors.append(f"{rel}: gap/overlap at {pos} (next item at {o})")
                break
            pos = o + n
        if pos != size:
            errors.append(f"{rel}: items end at {pos}, file size {size}")
    extra = on_disk - set(per_file)
    if extra:
        errors.append(f"{len(extra)} unreferenced .distcp files, e.g. {sorted(extra)[:3]}")

    fams: dict[str, dict[str, Any]] = {}
    for fqn, v in md.state_dict_metadata.items():
        if isinstance(v, BytesStorageMetadata) and "/shard_" in fqn:
            prefix, _, rest = fqn.rpartition("/shard_")
            off, _, shape = rest.partition("_")
            f = fams.setdefault(prefix, {"shape": shape, "offs": set()})
            if f["shape"] != shape:
                errors.append(f"{prefix}: inconsistent global shapes {f['shape']} vs {shape}")
            f["offs"].add(off)
    for prefix, f in fams.items():
        want = math.prod(int(x) for x in f["shape"].split("."))
        if len(f["offs"]) != want:
            errors.append(f"{prefix}: {len(f['offs'])} of {want} shards present")

    if plans is not None:
        ws = {int(p.partition("/shard_")[2].split("_")[1]) for p in md.state_dict_metadata
              if p.startswith("rerun_state_machine_state/shard_")}
        if ws and ws != {len(plans)}:
            errors.append(f"len(all_local_plans)={len(plans)} but rerun world size {ws}")
        by_rank: dict[int, set] = defaultdict(set)
        for k, v in sd.items():
            r = int(v.relative_path[2:].split("_")[0])
            by_rank[r].add((k.fqn, tuple(k.offset) if k.offset is not None else None))
        for r, p in enumerate(plans):
            got = {(it.index.fqn, tuple(it.index.offset) if it.index.offset is not None else None)
                   for it in p.items}
            if got != by_rank.get(r, set()):
                errors.append(f"rank {r}: plan items != storage entries of its files")
                if len(errors) > 50:
                    break
    try:
        cfg = json.loads((d / "metadata.json").read_text())
        if cfg.get("sharded_backend") != "torch_dist":
            errors.append(f"metadata.json: {cfg}")
        common = torch.load(d / "common.pt", weights_only=False)
        if common["args"].world_size != (len(plans) if plans is not None else common["args"].world_size):
            errors.append("common.pt args.world_size != len(all_local_plans)")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"common.pt/metadata.json: {exc!r}")
    return errors


# ----------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------
def _bool_flag(p: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=default, help=help)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Presets: " + "; ".join(
                                    f"{k}: " + ",".join(f"{f}={v}" for f, v in PRESETS[k].items())
                                    for k in PRESET_ORDER))
    p.add_argument("out_dir", help="checkpoint dir to write (e.g. .../iter_0000001); with --save-dir the save root")
    p.add_argument("--chunks", type=int, help="target number of tensor chunks (picks preset/DP/bucket size)")
    p.add_argument("--preset", choices=PRESET_ORDER, help="model preset (default: largest that fits --chunks)")
    for f in GRID_FIELDS:
        p.add_argument(f"--{f.replace('_', '-')}", dest=f, type=int, help=f"override the preset's {f}")
    p.add_argument("--bucket-size", type=int, help="DDP bucket size in elements (default 40M; with --chunks "
                   "and a fixed --dp it is searched)")
    p.add_argument("--one-bucket", action="store_true", help="no bucketing (one bucket per buffer)")
    p.add_argument("--files-per-rank", type=int, default=1, help="Megatron thread_count (1 in >=0.17, 2 in 0.16)")
    p.add_argument("--param-dtype", choices=sorted(_DTYPES), default="float32", help="model weight dtype")
    p.add_argument("--softmax-type", choices=("learnable", "vanilla"), default="learnable",
                   help="'learnable' adds per-layer softmax_offset params (=> small padding chunks)")
    _bool_flag(p, "swiglu", True, "SwiGLU fc1 (two chunks per TP rank)")
    _bool_flag(p, "bias", False, "linear biases and LayerNorm biases")
    _bool_flag(p, "extra-state", True, "TE _extra_state byte items per layer/module")
    _bool_flag(p, "rerun-state", True, "rerun_state_machine_state byte item on every rank")
    p.add_argument("--no-plans", dest="plans", action="store_false", help="omit Metadata.all_local_plans")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-dir", action="store_true",
                   help="OUT_DIR is a save root: write OUT_DIR/iter_XXXXXXX and latest_checkpointed_iteration.txt")
    p.add_argument("--iteration", type=int, default=1)
    p.add_argument("--real-headers", action="store_true",
                   help="write genuine torch.save archives for every item (tensor data stays sparse)")
    p.add_argument("--checkpoint-id", help="StorageMeta.checkpoint_id (default: the checkpoint dir as given)")
    p.add_argument("--force", action="store_true", help="overwrite an existing checkpoint in OUT_DIR")
    p.add_argument("--objects", action="store_true",
                   help="build torch's Metadata objects and pickle.dump them (the reference; ~1.5 KB RAM per chunk) "
                        "instead of streaming the pickle (the default; ~40 bytes per chunk)")
    p.add_argument("--check", action="store_true", help="run validate() on the result (meant for <=200k chunks)")
    p.add_argument("--dry-run", action="store_true", help="only print the chosen configuration")
    p.add_argument("--json", dest="json_out", help="also write the totals as JSON to this file")
    return p.parse_args(argv)


_OUR_FILES = (".metadata", ".metadata.tmp", "common.pt", "metadata.json", ".synthetic_scratch")


def _prepare_dir(ckpt: Path, force: bool) -> None:
    if ckpt.exists():
        ours = [p for p in ckpt.iterdir() if p.name in _OUR_FILES or p.name.endswith(".distcp")]
        others = [p for p in ckpt.iterdir() if p not in ours]
        if ours and not force:
            raise SystemExit(f"{ckpt} already contains a checkpoint; use --force to overwrite")
        if others:
            raise SystemExit(f"{ckpt} contains unrelated files ({others[0].name}); refusing to write there")
        for p in ours:
            p.unlink()
    ckpt.mkdir(parents=True, exist_ok=True)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    spec, predicted = choose_spec(args)
    counts = stage_layer_counts(spec.layers, spec.pp)
    print(f"config: preset={spec.preset} layers={spec.layers} (per stage {counts[0]}..{max(counts)}) "
          f"hidden={spec.hidden} heads={spec.heads}/{spec.query_groups} ffn={spec.ffn} vocab={spec.padded_vocab} "
          f"TP={spec.tp} PP={spec.pp} DP={spec.dp} world={spec.world} bucket_size={spec.bucket_size} "
          f"files/rank={spec.files_per_rank} param_dtype={spec.param_dtype}")
    print(f"predicted tensor chunks: {predicted}" + (f" (target {args.chunks})" if args.chunks else ""))
    if args.dry_run:
        return 0
    root = Path(args.out_dir)
    ckpt = root / f"iter_{args.iteration:07d}" if args.save_dir else root
    _prepare_dir(ckpt, args.force)

    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        if args.objects:
            tot, res = generate(spec, ckpt, args.seed, args.plans, args.real_headers,
                                checkpoint_id=args.checkpoint_id)
            t_build = time.perf_counter() - t0
            md = res["metadata"]
            t0 = time.perf_counter()
            tmp = ckpt / ".metadata.tmp"
            with open(tmp, "wb") as f:
                pickle.dump(md, f)  # exactly like FileSystemWriter.finish
            os.replace(tmp, ckpt / ".metadata")
            t_pickle = time.perf_counter() - t0
            del md, res
        else:
            from _synthetic_stream import generate_streaming

            tot, _ = generate_streaming(spec, ckpt, args.seed, args.plans, args.real_headers,
                                        checkpoint_id=args.checkpoint_id)
            t_build, t_pickle = time.perf_counter() - t0, 0.0
    finally:
        if gc_was:
            gc.enable()
    write_common(spec, ckpt, args.iteration, str(root if args.save_dir else ckpt.parent))
    if args.save_dir:
        (root / "latest_checkpointed_iteration.txt").write_text(str(args.iteration))
    md_size = (ckpt / ".metadata").stat().st_size
    total_s = time.perf_counter() - t_start
    if tot.chunks != predicted:
        print(f"warning: predicted {predicted} chunks, built {tot.chunks}", file=sys.stderr)
    summary = {
        "dir": str(ckpt), "preset": spec.preset, "layers": spec.layers, "hidden": spec.hidden,
        "tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "world": spec.world, "bucket_size": spec.bucket_size,
        "tensors": tot.tensors, "chunks": tot.chunks, "model_chunks": tot.model_chunks,
        "optimizer_chunks": tot.opt_chunks, "byte_items": tot.byte_items, "files": tot.files,
        "plans": spec.world if args.plans else 0, "apparent_data_bytes": tot.data_bytes,
        "metadata_bytes": md_size, "build_s": round(t_build, 2), "pickle_s": round(t_pickle, 2),
        "total_s": round(total_s, 2),
    }
    print(f"wrote {ckpt}")
    print(f"  tensors={tot.tensors} chunks={tot.chunks} (model {tot.model_chunks}, optimizer {tot.opt_chunks}) "
          f"byte_items={tot.byte_items} files={tot.files} plans={summary['plans']}")
    print(f"  .metadata={md_size / 1e6:.1f} MB  apparent data={tot.data_bytes / 1e12:.3f} TB (sparse)")
    print(f"  time: build {t_build:.1f}s, pickle {t_pickle:.1f}s, total {total_s:.1f}s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    if args.check:
        print("checking ...")
        errs = validate(ckpt)
        if errs:
            print(f"CHECK FAILED: {len(errs)} error(s)")
            for e in errs[:20]:
                print("  " + e)
            return 1
        print("check OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
