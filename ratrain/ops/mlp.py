"""SwiGLU activation of the LLaMA MLP: swiglu(gate, up) = silu(gate) * up.

The projections around it are `matmul`s; this op is the elementwise middle.
"""
from __future__ import annotations

import math

from ratrain.ops.define import define_op


def _sigmoid(xp, x):
    return 1.0 / (1.0 + xp.exp(-x))


def _swiglu_fwd(xp, gate, up):
    return gate * _sigmoid(xp, gate) * up


def _swiglu_bwd(xp, gate, up, dy):
    s = _sigmoid(xp, gate)
    dgate = dy * up * s * (1.0 + gate * (1.0 - s))   # d silu(g) = s + g s (1 - s)
    dup = dy * gate * s
    return dgate, dup


swiglu = define_op("swiglu", fwd=_swiglu_fwd, bwd=_swiglu_bwd,
                   residuals=lambda i, o: (i[0], i[1]),
                   flops=lambda ins, outs, **p: 4 * math.prod(ins[0]),
                   bwd_flops=lambda ins, outs, **p: 9 * math.prod(ins[0]),
                   kernel="swiglu")
swiglu.__doc__ = "silu(gate) * up, elementwise over two equal-shape tensors."
