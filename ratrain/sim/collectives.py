"""Analytic costs of the DP collectives: what one member's port sends, and the latency.

The simulator replays one pipeline (the ranks of DP replica 0); every collective over a
stage's DP group is costed from the group size alone, so thousands of ranks cost the same
to simulate as one pipeline. Formulas (n members, S bytes, per member):

| algorithm | all-reduce              | reduce-scatter / all-gather |
|-----------|-------------------------|-----------------------------|
| ring      | 2(n-1) a, 2(n-1)/n S    | (n-1) a, (n-1)/n S          |
| tree      | 2 ceil(log2 n) a, 2 S   | ceil(log2 n) a, (n-1)/n S   |

ring is the bandwidth-optimal ring; tree is a pipelined binary tree for all-reduce
(reduce up, broadcast down: each link carries S once each way) and recursive halving or
doubling for reduce-scatter and all-gather. `auto` takes whichever ends first alone on the
link, as MPI libraries choose by message size and group size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# phases: an all-reduce is a reduce-scatter then an all-gather
PHASES = {"allreduce": 2, "reduce_scatter": 1, "allgather": 1}


@dataclass(frozen=True)
class Cost:
    latency: float                      # seconds of per-step latencies, link not busy
    nbytes: float                       # bytes this member's port sends


def _ring(op: str, n: int, nbytes: float, alpha: float) -> Cost:
    steps = PHASES[op] * (n - 1)
    return Cost(steps * alpha, steps / n * nbytes)


def _tree(op: str, n: int, nbytes: float, alpha: float) -> Cost:
    rounds = math.ceil(math.log2(n))
    if op == "allreduce":
        return Cost(2 * rounds * alpha, 2.0 * nbytes)
    return Cost(rounds * alpha, (n - 1) / n * nbytes)


def collective_cost(op: str, n: int, nbytes: float, alpha: float, bandwidth: float,
                    algorithm: str = "ring") -> Cost:
    """Cost of `op` (allreduce, reduce_scatter, allgather) of `nbytes` over `n` members.

    For reduce-scatter `nbytes` is the whole input, for all-gather the whole output.
    """
    if n <= 1:
        return Cost(0.0, 0.0)
    if algorithm == "ring":
        return _ring(op, n, nbytes, alpha)
    if algorithm == "tree":
        return _tree(op, n, nbytes, alpha)
    return min(_ring(op, n, nbytes, alpha), _tree(op, n, nbytes, alpha),
               key=lambda c: c.latency + c.nbytes / bandwidth)
