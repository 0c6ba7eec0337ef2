"""Rotary position embedding (Hugging Face LLaMA "rotate_half" convention).

x[B, T, H, D] at positions 0..T-1: out = x*cos + rotate_half(x)*sin with
inv_freq[i] = theta^(-2i/D) repeated over both halves. The map is a rotation, so its
backward is the inverse rotation and saves nothing.
"""
from __future__ import annotations

from ratrain.ops._common import compute_dtype
from ratrain.ops.define import define_op


def _cos_sin(xp, seq_len, head_dim, theta, dtype):
    """cos, sin [T, D] for positions 0..T-1."""
    inv_freq = 1.0 / (theta ** (xp.arange(0, head_dim, 2).astype(dtype) / head_dim))
    angles = xp.arange(seq_len).astype(dtype)[:, None] * inv_freq[None, :]
    angles = xp.concatenate([angles, angles], axis=-1)
    return xp.cos(angles), xp.sin(angles)


def _rotate_half(xp, x):
    half = x.shape[-1] // 2
    return xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate(xp, x, theta, sign):
    dtype = compute_dtype(xp, x)
    cos, sin = _cos_sin(xp, x.shape[1], x.shape[-1], theta, dtype)
    cos, sin = cos[None, :, None, :], sign * sin[None, :, None, :]
    xf = x.astype(dtype)
    return (xf * cos + _rotate_half(xp, xf) * sin).astype(x.dtype)


def _rope_fwd(xp, x, *, theta):
    return _rotate(xp, x, theta, 1.0)


def _rope_bwd(xp, dy, *, theta):
    return (_rotate(xp, dy, theta, -1.0),)   # the transpose of a rotation is its inverse


_rope = define_op("rope", fwd=_rope_fwd, bwd=_rope_bwd, residuals=lambda i, o: (),
                  flops=lambda ins, outs, **p: 3 * ins[0][0] * ins[0][1] * ins[0][2] * ins[0][3],
                  bwd_flops=lambda ins, outs, **p: 3 * ins[0][0] * ins[0][1] * ins[0][2] * ins[0][3],
                  kernel="rope")


def rope(x, *, theta):
    """Rotate x[B, T, H, D] (D even) by position; theta is the RoPE base."""
    return _rope(x, theta=float(theta))
