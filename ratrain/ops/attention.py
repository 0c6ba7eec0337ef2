"""Causal multi-head attention with grouped KV heads and optional ALiBi, flash style.

q [B,T,Hq,D], k/v [B,T,Hkv,D]; query head h reads kv head h // (Hq // Hkv). Forward
returns o [B,T,Hq,D] and the hidden row log-sum-exp lse [B,Hq,T] (fp32); backward
recomputes the probabilities from lse instead of saving the T x T matrix.
"""
from __future__ import annotations

import math

from ratrain.models.alibi import alibi_slopes
from ratrain.ops._common import compute_dtype
from ratrain.ops.define import define_op


def _scores(xp, q, k, causal, alibi):
    """Scaled, biased, masked scores [B, Hkv, G, Tq, Tk] in the compute dtype."""
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    qg = q.reshape(B, T, Hkv, Hq // Hkv, D)
    s = xp.einsum("bikgd,bjkd->bkgij", qg, k) * (1.0 / math.sqrt(D))
    offset = xp.arange(T)[None, :] - xp.arange(T)[:, None]           # j - i
    if alibi:
        slopes = xp.asarray(alibi_slopes(Hq), dtype=s.dtype).reshape(Hkv, Hq // Hkv)
        s = s + slopes[:, :, None, None] * offset.astype(s.dtype)
    if causal:
        s = xp.where(offset <= 0, s, -xp.inf)
    return s


def _cast(xp, *arrays):
    dtype = compute_dtype(xp, arrays[0])
    return tuple(a.astype(dtype) for a in arrays)


def _attention_fwd(xp, q, k, v, *, causal, alibi):
    qf, kf, vf = _cast(xp, q, k, v)
    s = _scores(xp, qf, kf, causal, alibi)
    m = xp.max(s, axis=-1, keepdims=True)
    lse = m[..., 0] + xp.log(xp.sum(xp.exp(s - m), axis=-1))          # [B,Hkv,G,T]
    p = xp.exp(s - lse[..., None])
    o = xp.einsum("bkgij,bjkd->bikgd", p, vf).reshape(q.shape)
    B, T, Hq, _ = q.shape
    return o.astype(q.dtype), lse.reshape(B, Hq, T)


def _attention_bwd(xp, q, k, v, o, lse, do, *, causal, alibi):
    qf, kf, vf, of, dof = _cast(xp, q, k, v, o, do)
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    s = _scores(xp, qf, kf, causal, alibi)
    p = xp.exp(s - lse.reshape(B, Hkv, Hq // Hkv, T)[..., None])
    dog = dof.reshape(B, T, Hkv, Hq // Hkv, D)
    dv = xp.einsum("bkgij,bikgd->bjkd", p, dog)
    dp = xp.einsum("bikgd,bjkd->bkgij", dog, vf)
    delta = xp.einsum("bikgd,bikgd->bkgi", dog, of.reshape(dog.shape))  # rowsum(P*dP)
    ds = p * (dp - delta[..., None]) * (1.0 / math.sqrt(D))
    dq = xp.einsum("bkgij,bjkd->bikgd", ds, kf).reshape(q.shape)
    dk = xp.einsum("bkgij,bikgd->bjkd", ds, qf.reshape(dog.shape))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def _visible_pairs(T, causal):
    return T * (T + 1) // 2 if causal else T * T


def _attention_flops(ins, outs, *, causal, alibi):
    B, T, Hq, D = ins[0]
    return 4 * B * Hq * D * _visible_pairs(T, causal)                 # QK^T and PV


def _attention_bwd_flops(ins, outs, *, causal, alibi):
    B, T, Hq, D = ins[0]
    return 10 * B * Hq * D * _visible_pairs(T, causal)                # QK^T again, dV, dP, dQ, dK


_attention = define_op("attention", fwd=_attention_fwd, bwd=_attention_bwd, n_visible=1,
                       residuals=lambda i, o: (i[0], i[1], i[2], o[0], o[1]),
                       flops=_attention_flops, bwd_flops=_attention_bwd_flops,
                       kernel="attention")


def attention(q, k, v, *, causal=True, alibi=False):
    """softmax(q k^T / sqrt(D) [+ ALiBi] [causal]) v with GQA head sharing."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"attention: {q.shape[2]} query heads not a multiple of "
                         f"{k.shape[2]} kv heads")
    return _attention(q, k, v, causal=bool(causal), alibi=bool(alibi))
