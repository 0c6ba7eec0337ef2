"""ALiBi's per-head slopes (Press et al.): numbers only, so that the attention op
(ops/attention.py) and the Cython renderer the ranks import (codegen/emit.py) share them
without the ranks importing JAX.
"""
from __future__ import annotations

import math


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi slopes: geometric for a power of two; otherwise the nearest lower power of
    two's slopes followed by every other slope of the next power of two."""
    def geometric(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_heads).is_integer():
        return geometric(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return geometric(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]
