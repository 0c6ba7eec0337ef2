"""The model as the compiler sees it: a list of layers (embed, decoder x L, head), one
function per layer kind, and `loss_fn`, which is exactly their composition.

Layer functions use only ratrain.ops and the plain lax primitives the tracer maps
(reshape, slice, add, mul, reduce_sum, rsqrt, ...). One function serves LLaMA-2/3,
Mistral, Qwen2.5, Qwen3 and Baichuan2; the config's `ModelDims` switches biases, packed
q/k/v, q/k norms, ALiBi, NormHead and tied embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ratrain import ops
from ratrain.models.config import ModelDims, check_sequence_length, model_dims
from ratrain.models.params import decoder_shapes

EMBED_NAMES = ("embed_tokens.weight",)          # under "model."
HEAD_NAMES = ("norm.weight", "lm_head.weight")  # "model.norm.weight", "lm_head.weight"


@dataclass(frozen=True)
class LayerSpec:
    kind: str                    # "embed" | "decoder" | "head"; one traced graph per kind
    index: int                   # position in the model, 0 .. num_hidden_layers+1
    param_names: tuple[str, ...]  # HF names of this layer's parameters
    local_names: tuple[str, ...]  # the same without the layer prefix


def layer_specs(config: dict) -> list[LayerSpec]:
    """embed, decoder x num_hidden_layers, head (final norm + lm_head + loss)."""
    d = model_dims(config)
    local = tuple(decoder_shapes(d))
    decoders = [LayerSpec("decoder", i + 1, tuple(f"model.layers.{i}.{n}" for n in local),
                          local) for i in range(d.layers)]
    embed = LayerSpec("embed", 0, ("model.embed_tokens.weight",), EMBED_NAMES)
    head = LayerSpec("head", d.layers + 1, ("model.norm.weight", _lm_head_name(d)), HEAD_NAMES)
    return [embed, *decoders, head]


def lm_head_name(config: dict) -> str:
    """The HF name of the LM head's weight (the embedding's when tied)."""
    return _lm_head_name(model_dims(config))


def _lm_head_name(d: ModelDims) -> str:
    """NOTE [tied embeddings]: with tie_word_embeddings the head's local lm_head.weight IS
    model.embed_tokens.weight: two layers share one parameter, so its gradient is the sum
    of the embedding's and the head's (jax.grad of loss_fn adds them by itself)."""
    return "model.embed_tokens.weight" if d.tied else "lm_head.weight"


def _project_qkv(d: ModelDims, w, x):
    """q [B,T,Hq,D], k and v [B,T,Hkv,D] from the normalised hidden x [B,T,H]."""
    B, T, _ = x.shape
    q_dim, kv_dim = d.heads * d.head_dim, d.kv_heads * d.head_dim
    if d.packed_qkv:
        qkv = ops.matmul(x, w["self_attn.W_pack.weight"])
        q, k, v = (jax.lax.slice_in_dim(qkv, start, start + n, axis=2)
                   for start, n in ((0, q_dim), (q_dim, kv_dim), (q_dim + kv_dim, kv_dim)))
    else:
        bias = (lambda p: w[f"self_attn.{p}.bias"]) if d.qkv_bias else (lambda p: None)
        q, k, v = (ops.matmul(x, w[f"self_attn.{p}.weight"], bias(p))
                   for p in ("q_proj", "k_proj", "v_proj"))
    q, k = q.reshape(B, T, d.heads, d.head_dim), k.reshape(B, T, d.kv_heads, d.head_dim)
    if d.qk_norm:   # Qwen3: per head over head_dim, after the reshape, before RoPE
        q = ops.rms_norm(q, w["self_attn.q_norm.weight"], eps=d.eps)
        k = ops.rms_norm(k, w["self_attn.k_norm.weight"], eps=d.eps)
    return q, k, v.reshape(B, T, d.kv_heads, d.head_dim)


def _self_attention(d: ModelDims, w, x):
    B, T, _ = x.shape
    check_sequence_length(d, T)   # causal attention == Mistral's window only up to it
    q, k, v = _project_qkv(d, w, x)
    if not d.alibi:
        q, k = ops.rope(q, d.rope), ops.rope(k, d.rope)
    o = ops.attention(q, k, v, causal=True, alibi=d.alibi)
    o_bias = w["self_attn.o_proj.bias"] if d.o_bias else None
    return ops.matmul(o.reshape(B, T, d.heads * d.head_dim), w["self_attn.o_proj.weight"], o_bias)


def _mlp(w, x):
    gate = ops.matmul(x, w["mlp.gate_proj.weight"])
    up = ops.matmul(x, w["mlp.up_proj.weight"])
    return ops.matmul(ops.swiglu(gate, up), w["mlp.down_proj.weight"])


def _decoder(d: ModelDims, w, h):
    h = h + _self_attention(d, w, ops.rms_norm(h, w["input_layernorm.weight"], eps=d.eps))
    return h + _mlp(w, ops.rms_norm(h, w["post_attention_layernorm.weight"], eps=d.eps))


def normalize_rows(w):
    """Baichuan2 NormHead: each lm_head row divided by its L2 norm.

    NOTE [NormHead eps]: torch's normalize clamps the norm at 1e-12; adding 1e-24 under the
    rsqrt agrees to a relative 1e-24/|row|^2 and stays within the tracer's primitives (no
    elementwise max)."""
    return w * jax.lax.rsqrt(jnp.sum(w * w, axis=1, keepdims=True) + 1e-24)


def _lm_head(d: ModelDims, w):
    return normalize_rows(w["lm_head.weight"]) if d.norm_head else w["lm_head.weight"]


def _head(d: ModelDims, w, h, targets):
    lm_head = _lm_head(d, w)
    return ops.cross_entropy(ops.rms_norm(h, w["norm.weight"], eps=d.eps), lm_head, targets)


def _head_logits(d: ModelDims, w, h):
    """The head without its loss: next-token logits [B, T, V] in at least fp32."""
    from ratrain.ir.split_backward import head_logits
    lm_head = _lm_head(d, w)
    logits = head_logits(jnp, ops.rms_norm(h, w["norm.weight"], eps=d.eps), lm_head)
    return logits.reshape(*h.shape[:-1], lm_head.shape[0])


def layer_fn(config: dict, kind: str):
    """embed: fn(w, ids) -> h; decoder: fn(w, h) -> h; head: fn(w, h, targets) -> loss;
    final_norm: fn(w, h) -> h; vocab: fn(w, h, targets) -> loss of one row shard;
    embed_rows: fn(w, ids) -> h of one row shard (ids past its rows: not traced).
    `w` maps local names (LayerSpec.local_names) to arrays."""
    d = model_dims(config)
    fns = {"embed": lambda w, ids: ops.embedding(w["embed_tokens.weight"], ids),
           "decoder": lambda w, h: _decoder(d, w, h),
           "head": lambda w, h, targets: _head(d, w, h, targets),
           # NOTE [vocabulary-parallel head] (ir/vocab.py): the head as
           # the final norm on the last stage and one cross-entropy per row shard
           "final_norm": lambda w, h: ops.rms_norm(h, w["norm.weight"], eps=d.eps),
           "vocab": lambda w, h, targets: ops.cross_entropy(h, _lm_head(d, w), targets),
           # NOTE [vocabulary-parallel embedding] (ir/vocab.py): one row shard's lookup
           "embed_rows": lambda w, ids: ops.embedding(w["embed_tokens.weight"], ids)}
    if kind not in fns:
        raise ValueError(f"unknown layer kind {kind!r}; expected one of {sorted(fns)}")
    return fns[kind]


def loss_fn(config: dict):
    """f(params, tokens[B, T+1] int32) -> mean next-token cross-entropy, computed as the
    composition of the layer functions over `layer_specs(config)`."""
    specs = layer_specs(config)
    fns = {kind: layer_fn(config, kind) for kind in ("embed", "decoder", "head")}

    def loss(params, tokens):
        ids, targets = tokens[:, :-1], tokens[:, 1:]
        h = None
        for spec in specs:
            w = {l: params[p] for l, p in zip(spec.local_names, spec.param_names)}
            if spec.kind == "embed":
                h = fns["embed"](w, ids)
            elif spec.kind == "decoder":
                h = fns["decoder"](w, h)
            else:
                return fns["head"](w, h, targets)
    return loss


def logits_fn(config: dict):
    """f(params, ids[B, T] int32) -> next-token logits [B, T, V]: the layers of loss_fn,
    with the head's logits in place of its loss (what `ratrain generate` samples from)."""
    specs, d = layer_specs(config), model_dims(config)
    embed, decoder = layer_fn(config, "embed"), layer_fn(config, "decoder")

    def logits(params, ids):
        h = None
        for spec in specs:
            w = {l: params[p] for l, p in zip(spec.local_names, spec.param_names)}
            if spec.kind == "embed":
                h = embed(w, ids)
            elif spec.kind == "decoder":
                h = decoder(w, h)
            else:
                return _head_logits(d, w, h)
    return logits
