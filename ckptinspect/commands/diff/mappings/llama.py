"""Llama / Mistral / Qwen2 dense (GQA attention, SwiGLU MLP, RMSNorm, RoPE): Megatron-Core names <-> transformers'.

Sources of the names: Megatron-Core's GPT layer specs (TE: the input norm fused into ``linear_qkv`` as
``layer_norm_weight``, the pre-MLP norm into ``linear_fc1``; local: ``input_layernorm`` / ``pre_mlp_layernorm``), and
transformers' ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM`` state dicts. Megatron-LM's
``tools/checkpoint/loader_llama_mistral.py`` (core_v0.16.1) builds exactly these transforms on import.
"""

from __future__ import annotations

from ckptinspect.commands.diff.mappings import Rule, Table, Transform

_L = "decoder.layers.{L}."
_H = "model.layers.{L}."
I, QKV, SW, VP = Transform.IDENTITY, Transform.QKV_INTERLEAVE, Transform.SWIGLU_SPLIT, Transform.VOCAB_PAD

LLAMA = Table(
    name="llama",
    hf_model_types=("llama", "mistral", "qwen2"),
    rules=(
        Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), VP),
        Rule("output_layer.weight", ("lm_head.weight",), VP, optional=True),  # absent when tied
        Rule("decoder.final_layernorm.weight", ("model.norm.weight",), I),
        Rule(_L + "self_attention.linear_qkv.weight",
             (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"), QKV),
        Rule(_L + "self_attention.linear_qkv.bias",  # Qwen2
             (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"), QKV,
             optional=True),
        Rule(_L + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",), I),
        Rule(_L + "self_attention.linear_qkv.layer_norm_weight", (_H + "input_layernorm.weight",), I, optional=True),
        Rule(_L + "input_layernorm.weight", (_H + "input_layernorm.weight",), I, optional=True),
        Rule(_L + "mlp.linear_fc1.layer_norm_weight", (_H + "post_attention_layernorm.weight",), I, optional=True),
        Rule(_L + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",), I, optional=True),
        Rule(_L + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"), SW),
        Rule(_L + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), I),
    ),
    ignored=("*._extra_state", "rotary_pos_emb.inv_freq", "*.rotary_emb.inv_freq"),
)
