"""Rotary position embedding (Hugging Face LLaMA "rotate_half" convention).

x[B, T, H, D] at positions 0..T-1: out = s * (x*cos + rotate_half(x)*sin), with the
frequencies and the attention factor s of a RopeSpec (ratrain.models.rope: default,
linear, llama3, yarn), each frequency repeated over both halves. The params are the
spec's numbers (`theta`, and `type` and `scaling` when it is not plain RoPE), so the IR
stays hashable and prints `rope[theta=10000.0]` for plain RoPE as before. The map is a
rotation times s, so its transpose is the inverse rotation times the same s (not 1/s);
the backward saves nothing.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ratrain.models.rope import RopeSpec, attention_scaling, inv_freq, op_params, spec_of
from ratrain.ops._common import compute_dtype
from ratrain.ops.define import define_op


@lru_cache(maxsize=None)
def _tables(spec: RopeSpec, seq_len: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 cos, sin [T, D] times the attention factor, as transformers builds them
    (NOTE [RoPE tables in float32] in ratrain.models.rope)."""
    freqs = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq(spec, head_dim)[None, :]
    angles = np.concatenate([freqs, freqs], axis=-1)
    scale = np.float32(attention_scaling(spec))
    return np.cos(angles) * scale, np.sin(angles) * scale


def _rotate_half(xp, x):
    half = x.shape[-1] // 2
    return xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate(xp, x, spec: RopeSpec, sign: float):
    dtype = compute_dtype(xp, x)
    cos, sin = _tables(spec, x.shape[1], x.shape[-1])
    cos = xp.asarray(cos).astype(dtype)[None, :, None, :]
    sin = sign * xp.asarray(sin).astype(dtype)[None, :, None, :]
    xf = x.astype(dtype)
    return (xf * cos + _rotate_half(xp, xf) * sin).astype(x.dtype)


def _rope_fwd(xp, x, **params):
    return _rotate(xp, x, spec_of(**params), 1.0)


def _rope_bwd(xp, dy, **params):
    # J = s R(t), so J^T = s R(t)^T = s R(-t): the inverse rotation, the same factor s
    return (_rotate(xp, dy, spec_of(**params), -1.0),)


_rope = define_op("rope", fwd=_rope_fwd, bwd=_rope_bwd, residuals=lambda i, o: (),
                  flops=lambda ins, outs, **p: 3 * ins[0][0] * ins[0][1] * ins[0][2] * ins[0][3],
                  bwd_flops=lambda ins, outs, **p: 3 * ins[0][0] * ins[0][1] * ins[0][2] * ins[0][3],
                  kernel="rope")


def rope(x, spec: RopeSpec | None = None, *, theta: float | None = None):
    """Rotate x[B, T, H, D] (D even) by position, as `spec` says (or plain RoPE of base
    `theta`)."""
    if (spec is None) == (theta is None):
        raise TypeError("rope: give exactly one of spec and theta")
    return _rope(x, **op_params(spec or RopeSpec(float(theta))))
