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


# ---- on nodes of several ranks (NOTE [node memory], hw/topology.py) -----------------------
#
# A DP group spread over nodes, `group` = its members on each node (hw/topology.
# dp_group_nodes), is costed as MPI libraries run it on such machines:
#
# | group               | how                                                          |
# |---------------------|--------------------------------------------------------------|
# | one node, L members | the formula above over L, at the node's copy rate for L      |
# | K nodes, 1 each     | the formula above over K, on the node's port                 |
# | K nodes, L each     | reduce-scatter within the node (S), the op over the K nodes  |
# |                     | on S / L per rank with the L ranks sharing the port, then    |
# |                     | all-gather within the node (S); all-gather: the inter-node   |
# |                     | all-gather first, then the node's                            |
#
# Within a node, reduce phases move at copy_rate(L, "reduce"), gathers at
# copy_rate(L, "copy"): an all-reduce is half of each; where the profile holds the
# node's measured collectives, from those instead (NOTE [measured node collectives]).
#
# NOTE [measured node collectives]: the copy-rate model above undercharges MPICH's
# shared-memory collectives at gradient sizes. Timed with the mpich 5.0.2 wheel on a
# 16-core machine, every rank in a group at once, 65.5 MB (the 58M LLaMA's embedding
# gradient): reduce-scatter 48 / 40 / 34 ms in groups of 4 / 8 / 16 members, all-gather
# 28 / 28 / 27 ms, all-reduce 78 / 94 / 100 ms, where the model charges the groups of 4
# 5.5, 5.5 and 11 ms: one member's rate hardly grows as its group shrinks, since every
# rank of the node is copying at once. So a profile whose `node_collectives` rows were
# timed with as many ranks as the node holds charges a collective within the node from
# the row of the same op with the nearest member count (largest size timed), scaled by
# the bytes one member moves (the ring's, as node_fit.port_bytes): the per-byte time
# MPICH really took, algorithm included. Rows of another rank count, or none, keep the
# copy-rate model.

REDUCED_SHARE = {"allreduce": 0.5, "reduce_scatter": 1.0, "allgather": 0.0}


@dataclass(frozen=True)
class Timed:
    latency: float                      # seconds of per-step latencies
    nbytes: float                       # bytes this member moves
    seconds: float                      # transfer seconds alone, at the rates they move at

    def __add__(self, other: "Timed") -> "Timed":
        return Timed(self.latency + other.latency, self.nbytes + other.nbytes,
                     self.seconds + other.seconds)


def _ring_bytes(op: str, members: int, nbytes: float) -> float:
    return collective_cost(op, members, nbytes, 0.0, 1.0, "ring").nbytes


def measured_row(op: str, members: int, node) -> tuple | None:
    """See NOTE [measured node collectives]: the node's timed row of `op` with every rank of
    the node busy, members nearest to `members` (by ratio), the largest size; None
    without one."""
    rows = [r for r in node.collective_rows if r[0] == op and r[1] * r[2] == node.ranks
            and r[1] > 1]
    if not rows:
        return None
    return min(rows, key=lambda r: (abs(math.log(r[1] / members)), -r[3]))


def _within_node(op: str, members: int, nbytes: float, node, algorithm: str) -> Timed:
    cost = collective_cost(op, members, nbytes, node.link_latency, node.link_bandwidth,
                           algorithm)
    row = measured_row(op, members, node)
    if row is not None:
        _, row_members, _, row_bytes, row_seconds = row
        per_byte = row_seconds / _ring_bytes(op, row_members, row_bytes)
        return Timed(cost.latency, cost.nbytes,
                     per_byte * _ring_bytes(op, members, nbytes))
    reduced = REDUCED_SHARE[op] * cost.nbytes
    seconds = reduced / node.copy_rate(members, "reduce") + \
        (cost.nbytes - reduced) / node.copy_rate(members, "copy")
    return Timed(cost.latency, cost.nbytes, seconds)


def _across_nodes(op: str, nodes: int, nbytes: float, sharing: int, node,
                  algorithm: str) -> Timed:
    rate = node.port_bandwidth / max(1, sharing)
    cost = collective_cost(op, nodes, nbytes, node.port_latency, rate, algorithm)
    return Timed(cost.latency, cost.nbytes, cost.nbytes / rate)


def node_collective(op: str, group: tuple[int, ...], nbytes: float, node,
                    algorithm: str = "ring") -> Timed:
    """One member's cost of `op` over a DP group with `group[k]` members on node k (the
    table above); `node` is hw/topology.Node. For reduce-scatter `nbytes` is the whole
    input, for all-gather the whole output, as collective_cost."""
    nodes, local = len(group), max(group, default=1)
    if nodes * local <= 1:
        return Timed(0.0, 0.0, 0.0)
    if nodes == 1:
        return _within_node(op, local, nbytes, node, algorithm)
    if local == 1:
        return _across_nodes(op, nodes, nbytes, 1, node, algorithm)
    inner = _across_nodes(op, nodes, nbytes / local, local, node, algorithm)
    if op == "allgather":
        return inner + _within_node("allgather", local, nbytes, node, algorithm)
    scatter = _within_node("reduce_scatter", local, nbytes, node, algorithm)
    if op == "reduce_scatter":
        return scatter + inner
    return scatter + inner + _within_node("allgather", local, nbytes, node, algorithm)
