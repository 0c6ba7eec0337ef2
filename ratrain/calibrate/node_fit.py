"""The node fields of a profile (hw/topology.py) from what calibrate/node_probe.py measured
with every rank of the node at once: the node's memory bandwidth (NOTE [node memory]) and
how fast a DP collective moves while its rank computes (NOTE [manual progress]).
"""
from __future__ import annotations

import statistics

from ratrain.hw.topology import TRAFFIC_PER_BYTE
from ratrain.sim.collectives import REDUCED_SHARE, collective_cost


def port_bytes(op: str, members: int, nbytes: float) -> float:
    """Bytes one member moves in a ring `op` of `nbytes` (sim/collectives.py)."""
    return collective_cost(op, members, nbytes, 0.0, 1.0, "ring").nbytes


def memory_bandwidth(rows: list[dict], ranks: int) -> float | None:
    """The node's memory bandwidth that reduce-scatters and all-gathers run by every rank
    at once imply: ranks x each one's port bytes per second x memory traffic per byte
    (NOTE [node memory]), the median over the largest size's rows; None without them."""
    busy = [r for r in rows if r["members"] * r["groups"] == ranks
            and r["op"] in ("reduce_scatter", "allgather")]
    if not busy:
        return None
    largest = max(r["bytes"] for r in busy)
    return statistics.median(
        ranks * port_bytes(r["op"], r["members"], r["bytes"]) / r["seconds"]
        * TRAFFIC_PER_BYTE["reduce" if REDUCED_SHARE[r["op"]] else "copy"]
        for r in busy if r["bytes"] == largest)


def progress_share(beside: dict, rows: list[dict]) -> float | None:
    """Bytes per second the all-reduces moved while every rank ran kernels, over their
    rate waited for alone (the world's all-reduce of the same size), 0..1."""
    alone = [r for r in rows if r["op"] == "allreduce" and r["groups"] == 1
             and r["bytes"] == beside["allreduce_bytes"]]
    if not alone or beside["kernel_seconds_beside"] <= 0:
        return None
    moved = beside["allreduces_done"] * beside["allreduce_bytes"]
    return max(0.0, min(1.0, moved / beside["kernel_seconds_beside"]
                        / (beside["allreduce_bytes"] / alone[0]["seconds"])))


def node_fields(node: dict, ranks: int) -> dict:
    """Profile fields from one node probe result (`probe.py --node`): the measured rows,
    node_memory_bandwidth and collective_progress_share where they can be derived."""
    rows, beside = node["collectives"], node["beside_kernel"]
    fields = {"node_collectives": {
        "rows": [[r["op"], r["members"], r["groups"], r["bytes"], r["seconds"]] for r in rows],
        "kernel_slowdown_beside": beside["kernel_seconds_beside"] / beside["kernel_seconds"]}}
    bandwidth, share = memory_bandwidth(rows, ranks), progress_share(beside, rows)
    if bandwidth:
        fields["node_memory_bandwidth"] = bandwidth
    if share is not None:
        fields["collective_progress_share"] = share
    return fields
