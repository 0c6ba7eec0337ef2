"""Parameters by Hugging Face name: shapes from a config (no allocation), counts, and
deterministic float32 initialisation.

Names and layouts follow transformers (weights [out, in]), so checkpoints load directly.
The per-layer names here are the single source `layers.layer_specs` also reads.
"""
from __future__ import annotations

import math

import numpy as np

from ratrain.models.config import ModelDims, model_dims


def decoder_shapes(d: ModelDims) -> dict[str, tuple[int, ...]]:
    """Local names and shapes of one decoder layer's parameters."""
    q, kv, H, I = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.hidden, d.intermediate
    if d.packed_qkv:
        attn = {"self_attn.W_pack.weight": (q + 2 * kv, H)}
    else:
        attn = {"self_attn.q_proj.weight": (q, H), "self_attn.k_proj.weight": (kv, H),
                "self_attn.v_proj.weight": (kv, H)}
    if d.qkv_bias:
        attn |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                 "self_attn.v_proj.bias": (kv,)}
    attn |= {"self_attn.o_proj.weight": (H, q)}
    if d.o_bias:
        attn |= {"self_attn.o_proj.bias": (H,)}
    if d.qk_norm:
        attn |= {"self_attn.q_norm.weight": (d.head_dim,), "self_attn.k_norm.weight": (d.head_dim,)}
    return {"input_layernorm.weight": (H,), **attn,
            "post_attention_layernorm.weight": (H,),
            "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H),
            "mlp.down_proj.weight": (H, I)}


def param_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter's HF name and shape, in model order. A tied model
    (tie_word_embeddings) has no lm_head.weight: its head reads model.embed_tokens.weight,
    and checkpoints hold the tensor once, as transformers writes them."""
    d = model_dims(config)
    shapes = {"model.embed_tokens.weight": (d.vocab, d.hidden)}
    for i in range(d.layers):
        shapes |= {f"model.layers.{i}.{k}": s for k, s in decoder_shapes(d).items()}
    shapes |= {"model.norm.weight": (d.hidden,)}
    if not d.tied:
        shapes |= {"lm_head.weight": (d.vocab, d.hidden)}
    return shapes


def count_params(config: dict) -> int:
    return sum(math.prod(s) for s in param_shapes(config).values())


def _initial_value(name, shape, rng, std):
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    return (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def init_params(config: dict, seed: int, names=None) -> dict[str, np.ndarray]:
    """float32 params: N(0, initializer_range) matrices, unit norms, zero biases; drawn
    in model order from one generator, so the same seed gives the same bits. With `names`,
    only those are kept (each is still drawn in its place, so its bits do not change): a
    rank holds its stage's weights, not the whole model's, while it starts."""
    rng = np.random.default_rng(seed)
    std = float(config.get("initializer_range", 0.02))
    out = {}
    for name, shape in param_shapes(config).items():
        value = _initial_value(name, shape, rng, std)
        if names is None or name in names:
            out[name] = value
    return out
