"""Linear layers: `matmul(x, w)` = x @ w^T and `matmul(x, w, b)` = x @ w^T + b.

Weights use the Hugging Face layout w[out, in]. Two IR ops, `matmul` and `matmul_bias`
(Qwen2.5 q/k/v), both run by the "gemm" kernel family; `matmul` picks one by arity.
"""
from __future__ import annotations

from ratrain.ops._common import rows
from ratrain.ops.define import define_op


def _matmul_fwd(xp, x, w):
    return x @ w.T


def _matmul_bias_fwd(xp, x, w, b):
    return x @ w.T + b


def _weight_grad(xp, x, dy):
    """dw[out, in] = sum over tokens of dy^T x."""
    return dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def _matmul_bwd(xp, x, w, dy):
    return dy @ w, _weight_grad(xp, x, dy)


def _matmul_bias_bwd(xp, x, w, dy):
    db = xp.sum(dy.reshape(-1, dy.shape[-1]), axis=0)
    return dy @ w, _weight_grad(xp, x, dy), db


def _gemm_flops(in_shapes, out_shapes, **params):
    x, w = in_shapes[0], in_shapes[1]
    return 2 * rows(x) * w[0] * w[1]


def _gemm_bwd_flops(in_shapes, out_shapes, **params):
    return 2 * _gemm_flops(in_shapes, out_shapes)   # dx and dw, one GEMM each


_matmul = define_op("matmul", fwd=_matmul_fwd, bwd=_matmul_bwd,
                    residuals=lambda i, o: (i[0], i[1]),
                    flops=_gemm_flops, bwd_flops=_gemm_bwd_flops, kernel="gemm")

_matmul_bias = define_op("matmul_bias", fwd=_matmul_bias_fwd, bwd=_matmul_bias_bwd,
                         residuals=lambda i, o: (i[0], i[1]),
                         flops=_gemm_flops, bwd_flops=_gemm_bwd_flops, kernel="gemm")


def matmul(x, w, b=None):
    """x[..., in] @ w[out, in]^T (+ b[out]) -> [..., out]."""
    return _matmul(x, w) if b is None else _matmul_bias(x, w, b)
