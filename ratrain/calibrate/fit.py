"""Fits of measured times: an op's cost over its FLOPs and bytes, a link's from ping-pongs.

An op costs `seconds + flops / flop_rate + bytes / byte_rate` (the simulator's op_costs,
sim/kernels.py): a fixed call time (threads woken, tiles set up) plus work at the op's own
rates, fitted with non-negative coefficients by least squares on relative error, so small
and large shapes weigh alike. A link costs `latency + bytes / bandwidth` per message.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np


def fit_op(flops, nbytes, seconds) -> dict:
    """{"seconds", "flop_rate", "byte_rate"} (rates left out when the fit charges nothing
    for that term) minimising the relative error of the times."""
    t = np.asarray(seconds, float)
    columns = np.stack([np.ones_like(t), np.asarray(flops, float), np.asarray(nbytes, float)], 1)
    best, best_error = np.zeros(3), np.inf
    for size in (1, 2, 3):
        for chosen in map(list, combinations(range(3), size)):
            a = columns[:, chosen] / t[:, None]
            scale = np.abs(a).max(0)
            if not scale.all():
                continue
            x = np.linalg.lstsq(a / scale, np.ones_like(t), rcond=None)[0] / scale
            error = np.sum((a @ x - 1) ** 2)
            if (x >= 0).all() and error < best_error:
                best, best_error = np.zeros(3), error
                best[chosen] = x
    return _as_costs(best)


def _as_costs(coefficients) -> dict:
    call, per_flop, per_byte = (float(c) for c in coefficients)
    costs = {"seconds": call}
    if per_flop > 0:
        costs["flop_rate"] = 1 / per_flop
    if per_byte > 0:
        costs["byte_rate"] = 1 / per_byte
    return costs


def fit_link(small: tuple[int, float], large: tuple[int, float]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) through two (message bytes, one-way seconds) points."""
    (n0, t0), (n1, t1) = small, large
    if n1 <= n0 or t1 <= t0:
        raise ValueError(f"ping-pong times do not grow with the message size: {n0} B in "
                         f"{t0:.3g} s, {n1} B in {t1:.3g} s")
    bandwidth = (n1 - n0) / (t1 - t0)
    return max(t0 - n0 / bandwidth, 0.0), bandwidth
