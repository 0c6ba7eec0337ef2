"""Small helpers shared by the coarse-op references in ratrain.ops.

The references run under numpy (IR interpreter) and jax.numpy (primitive lowering and
the jax.grad oracle), so everything here uses only the array API both provide.
"""
from __future__ import annotations

import math


def compute_dtype(xp, x):
    """At least fp32: statistics never run in bf16/fp16, and fp64 stays fp64 (tests)."""
    return xp.promote_types(x.dtype, xp.float32)


def rows(shape) -> int:
    """Number of vectors in a [..., n] tensor (product of the leading dims)."""
    return math.prod(shape[:-1])
