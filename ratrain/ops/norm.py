"""RMSNorm as one coarse op: y = x * rsqrt(mean(x^2) + eps) * w, statistics in fp32.

The forward also returns rstd [...] (hidden, fp32) so backward needs no second reduction,
as llm.c's layernorm saves its rstd.
"""
from __future__ import annotations

from ratrain.ops._common import compute_dtype, rows
from ratrain.ops.define import define_op


def _rms_norm_fwd(xp, x, w, *, eps):
    xf = x.astype(compute_dtype(xp, x))
    rstd = 1.0 / xp.sqrt(xp.mean(xf * xf, axis=-1) + eps)
    y = (xf * rstd[..., None]).astype(x.dtype) * w
    return y, rstd


def _rms_norm_bwd(xp, x, w, rstd, dy, *, eps):
    xf = x.astype(rstd.dtype)
    xhat = xf * rstd[..., None]
    dxhat = dy * w
    dw = xp.sum((dy * xhat).reshape(-1, x.shape[-1]), axis=0)
    proj = xp.mean(dxhat * xhat, axis=-1, keepdims=True)
    dx = rstd[..., None] * (dxhat - xhat * proj)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_rms_norm = define_op(
    "rms_norm", fwd=_rms_norm_fwd, bwd=_rms_norm_bwd, n_visible=1,
    residuals=lambda i, o: (i[0], i[1], o[1]),
    flops=lambda ins, outs, **p: 4 * rows(ins[0]) * ins[0][-1],
    bwd_flops=lambda ins, outs, **p: 8 * rows(ins[0]) * ins[0][-1],
    kernel="rmsnorm")


def rms_norm(x, w, *, eps):
    """x[..., H] normalised by its root mean square, scaled by w[H]."""
    return _rms_norm(x, w, eps=float(eps))
