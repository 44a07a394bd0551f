"""Megatron-Core <-> Hugging Face parameter mappings as data: one table per architecture (`llama.py`), each rule a
Megatron key pattern, its Hugging Face key(s) and a named `Transform`; `pick` chooses the table from the training
args and the export's ``config.json`` and says why (`Pick.evidence`), or says that none fits (`Pick.table` None:
the diff's `unmapped` section, never "equal").

Every transform here is a gather of row blocks along axis 0 (`blocks`): what target rows come from which source
rows. That is what makes the comparison streamable: one block of rows is read from each side at a time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptinspect.model import StrEnum


class Transform(StrEnum):
    """How a Megatron tensor becomes its Hugging Face tensor(s)."""

    IDENTITY = "identity"
    # linear_qkv: per query group g, rows [q of the group's heads | k | v] (Megatron-LM loader_llama_mistral
    # set_attn_state: cat([q.reshape(ng, d*nh/ng, -1), k.reshape(ng, d, -1), v.reshape(ng, d, -1)], dim=1))
    QKV_INTERLEAVE = "qkv_interleave"
    SWIGLU_SPLIT = "swiglu_split"  # linear_fc1 = cat([gate_proj, up_proj], dim=0)
    VOCAB_PAD = "vocab_pad"  # source rows >= the true vocabulary are padding (make_vocab_size_divisible_by)


@dataclass(frozen=True, slots=True)
class Rule:
    """source: a Megatron-Core key, ``{L}`` standing for a layer number. targets: the Hugging Face key(s) it becomes,
    in the order the transform produces them. optional: a rule only some producers' keys match (TE's fused
    layernorm vs the local impl's separate norm): no finding when no source key matches it."""

    source: str
    targets: tuple[str, ...]
    transform: Transform
    optional: bool = False

    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.escape(self.source).replace(r"\{L\}", r"(?P<L>\d+)") + "$")


@dataclass(frozen=True, slots=True)
class Table:
    """One architecture. hf_model_types: config.json ``model_type`` values it covers. ignored: source key globs
    that are no parameters (TE's ``_extra_state``)."""

    name: str
    hf_model_types: tuple[str, ...]
    rules: tuple[Rule, ...]
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Geometry:
    """The sizes the transforms need, from the Megatron args (checked against config.json)."""

    num_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden: int
    vocab: int  # the true vocabulary (HF rows of the embedding / lm_head)
    tied: bool  # Megatron ties the output layer to the embedding (no output_layer.weight)


@dataclass(frozen=True, slots=True)
class Pick:
    table: Table | None
    geometry: Geometry | None
    evidence: tuple[str, ...]


def blocks(transform: Transform, geo: Geometry, n_targets: int, src_rows: int) -> list[list[tuple[int, int, int]]]:
    """Per target: (source row start, source row stop, target row start) blocks, in target order."""
    if transform is Transform.IDENTITY:
        return [[(0, src_rows, 0)]]
    if transform is Transform.VOCAB_PAD:
        return [[(0, min(geo.vocab, src_rows), 0)]]
    if transform is Transform.SWIGLU_SPLIT:
        f = geo.ffn_hidden
        return [[(0, f, 0)], [(f, 2 * f, 0)]]
    ng, d = geo.num_query_groups, geo.head_dim
    per = geo.num_heads // ng  # query heads per group
    stride = (per + 2) * d
    q = [(g * stride, g * stride + per * d, g * per * d) for g in range(ng)]
    k = [(g * stride + per * d, g * stride + (per + 1) * d, g * d) for g in range(ng)]
    v = [(g * stride + (per + 1) * d, (g + 1) * stride, g * d) for g in range(ng)]
    return [q, k, v][:n_targets]


def target_rows(transform: Transform, geo: Geometry, index: int, src_rows: int) -> int:
    """Rows of target `index` the transform makes from `src_rows` source rows."""
    return sum(stop - start for start, stop, _ in blocks(transform, geo, index + 1, src_rows)[index])


def _get(m: Mapping[str, Any] | None, key: str) -> Any:
    return None if m is None else m.get(key)


def pick(args: Mapping[str, Any] | None, config: Mapping[str, Any] | None) -> Pick:
    """The table for this pair, from Megatron's args and the export's config.json, with the evidence."""
    from ckptinspect.commands.diff.mappings.llama import LLAMA

    ev: list[str] = []
    if config is None:
        return Pick(None, None, ("no config.json next to the safetensors files: architecture unknown",))
    model_type = config.get("model_type")
    ev.append(f"config.json model_type={model_type!r}, architectures={config.get('architectures')!r}")
    table = next((t for t in (LLAMA,) if model_type in t.hf_model_types), None)
    if table is None:
        return Pick(None, None, (*ev, f"no mapping table for model_type {model_type!r}"))
    if args is None:
        return Pick(None, None, (*ev, "the Megatron side has no training args: head and group sizes unknown"))
    if _get(args, "num_experts") or _get(args, "num_moe_experts"):
        return Pick(None, None, (*ev, "Megatron args name experts: an MoE model, no dense table applies"))
    if not _get(args, "swiglu"):
        return Pick(None, None, (*ev, "Megatron args.swiglu is not set: not a Llama-style MLP"))
    heads = int(args["num_attention_heads"])
    groups = int(args.get("num_query_groups") or heads) if args.get("group_query_attention") else heads
    hidden = int(args["hidden_size"])
    head_dim = int(args.get("kv_channels") or hidden // heads)
    ffn = int(args.get("ffn_hidden_size") or 0)
    vocab = int(config.get("vocab_size") or args.get("vocab_size") or 0)
    tied = not args.get("untie_embeddings_and_output_weights", False)
    ev.append(f"Megatron args: swiglu, num_attention_heads={heads}, num_query_groups={groups}, kv_channels="
              f"{head_dim}, ffn_hidden_size={ffn}, padded_vocab_size={args.get('padded_vocab_size')}, "
              f"untie_embeddings_and_output_weights={not tied}")
    for mk, hk, mv in (("num_attention_heads", "num_attention_heads", heads), ("num_query_groups",
                       "num_key_value_heads", groups), ("hidden_size", "hidden_size", hidden),
                       ("ffn_hidden_size", "intermediate_size", ffn)):
        hv = config.get(hk, heads if hk == "num_key_value_heads" else None)
        if hv is not None and int(hv) != mv:
            return Pick(None, None, (*ev, f"args.{mk}={mv} but config.json {hk}={hv}: not the same model"))
    return Pick(table, Geometry(heads, groups, head_dim, ffn, vocab, tied), tuple(ev))
