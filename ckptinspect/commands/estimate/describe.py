"""A GPT model description (`--layers --hidden --ffn-hidden --heads ...`) → the parameters Megatron-Core saves.

Shapes and key names follow Megatron-Core's GPTModel with fused layernorm-linears (the names its sharded state dict
uses for both the TE and the local spec): per layer `self_attention.linear_qkv.layer_norm_weight` (+ `_bias` for
LayerNorm), `linear_qkv.weight` ((heads + 2·kv_heads)·kv_channels, hidden), `linear_proj.weight`
(hidden, heads·kv_channels), `mlp.linear_fc1.layer_norm_weight`, `mlp.linear_fc1.weight` (ffn or 2·ffn with SwiGLU,
hidden), `mlp.linear_fc2.weight` (hidden, ffn); MoE layers have `pre_mlp_layernorm.weight`, `mlp.router.weight`
(experts, hidden) and `mlp.experts.experts.linear_fc{1,2}.weight` stacked over experts. The vocabulary is padded to a
multiple of `make_vocab_size_divisible_by × TP` (Megatron's `_vocab_size_with_padding`), so the padded size depends
on the target TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptinspect.commands.estimate.spec import ModelSpec, ParamSpec, Stage


@dataclass(frozen=True, slots=True)
class GptDescription:
    """The architecture arguments `estimate` understands (Megatron's argument names in parentheses).

    moe_layer_freq: every n-th layer is MoE (1 = all layers when `experts` > 0).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn_hidden: int | None = None  # --ffn-hidden-size, default 4 × hidden
    kv_heads: int | None = None  # --num-query-groups, default heads
    kv_channels: int | None = None  # default hidden / heads
    make_vocab_size_divisible_by: int = 128
    swiglu: bool = False
    tied_embeddings: bool = False
    layernorm: bool = True  # False = RMSNorm (no bias)
    bias: bool = True  # --add-bias-linear
    learned_positions: int = 0  # --max-position-embeddings with learned_absolute; 0 = RoPE (no table)
    experts: int = 0
    moe_ffn_hidden: int | None = None
    moe_layer_freq: int = 1
    dtype: str = "bfloat16"


def padded_vocab(d: GptDescription, tp: int) -> int:
    multiple = d.make_vocab_size_divisible_by * tp
    return int(math.ceil(d.vocab / multiple) * multiple)


def _layer_params(d: GptDescription, moe: bool) -> list[ParamSpec]:
    h = d.hidden
    kvc = d.kv_channels or h // d.heads
    kv = d.kv_heads or d.heads
    qkv = (d.heads + 2 * kv) * kvc
    norms = ("weight", "bias") if d.layernorm else ("weight",)
    out = [ParamSpec(f"decoder.layers.self_attention.linear_qkv.layer_norm_{n}", (h,)) for n in norms]
    out.append(ParamSpec("decoder.layers.self_attention.linear_proj.weight", (h, d.heads * kvc), tp_axis=1))
    if d.bias:
        out.append(ParamSpec("decoder.layers.self_attention.linear_proj.bias", (h,)))
    out.append(ParamSpec("decoder.layers.self_attention.linear_qkv.weight", (qkv, h), tp_axis=0))
    if d.bias:
        out.append(ParamSpec("decoder.layers.self_attention.linear_qkv.bias", (qkv,), tp_axis=0))
    gate = 2 if d.swiglu else 1
    if moe:
        ffn = d.moe_ffn_hidden or d.ffn_hidden or 4 * h
        out += [ParamSpec(f"decoder.layers.pre_mlp_layernorm.{n}", (h,)) for n in norms]
        out.append(ParamSpec("decoder.layers.mlp.router.weight", (d.experts, h)))
        out.append(ParamSpec("decoder.layers.mlp.experts.experts.linear_fc1.weight", (gate * ffn, h),
                             experts=d.experts, tp_axis=0, tp_pieces=gate))
        out.append(ParamSpec("decoder.layers.mlp.experts.experts.linear_fc2.weight", (h, ffn),
                             experts=d.experts, tp_axis=1))
        return out
    ffn = d.ffn_hidden or 4 * h
    out += [ParamSpec(f"decoder.layers.mlp.linear_fc1.layer_norm_{n}", (h,)) for n in norms]
    out.append(ParamSpec("decoder.layers.mlp.linear_fc1.weight", (gate * ffn, h), tp_axis=0, tp_pieces=gate))
    if d.bias:
        out.append(ParamSpec("decoder.layers.mlp.linear_fc1.bias", (gate * ffn,), tp_axis=0, tp_pieces=gate))
    out.append(ParamSpec("decoder.layers.mlp.linear_fc2.weight", (h, ffn), tp_axis=1))
    if d.bias:
        out.append(ParamSpec("decoder.layers.mlp.linear_fc2.bias", (h,)))
    return out


def model_from_description(d: GptDescription, tp: int) -> ModelSpec:
    """The parameters of `d` in registration order, with the vocabulary padded for `tp`."""
    vocab = padded_vocab(d, tp)
    params = [ParamSpec("embedding.word_embeddings.weight", (vocab, d.hidden), tp_axis=0)]
    if d.learned_positions:
        params.append(ParamSpec("embedding.position_embeddings.weight", (d.learned_positions, d.hidden)))
    freq = max(d.moe_layer_freq, 1)
    moe_layers = tuple(i for i in range(d.layers) if d.experts and i % freq == 0)
    dense_layers = tuple(i for i in range(d.layers) if i not in moe_layers)
    for layers, moe in ((dense_layers, False), (moe_layers, True)):
        if layers:
            params += [ParamSpec(p.key, p.shape, layers, Stage.FIRST, p.experts, p.tp_axis, p.tp_pieces)
                       for p in _layer_params(d, moe)]
    norms = ("weight", "bias") if d.layernorm else ("weight",)
    params += [ParamSpec(f"decoder.final_layernorm.{n}", (d.hidden,), stage=Stage.LAST) for n in norms]
    params.append(ParamSpec("output_layer.weight", (vocab, d.hidden), stage=Stage.LAST, tp_axis=0,
                            saved=not d.tied_embeddings))
    return ModelSpec(tuple(params), d.layers, d.dtype, "description")
