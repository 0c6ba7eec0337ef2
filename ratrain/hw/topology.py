"""A profile's node: how many ranks share one node's memory and one network port, and
where each rank sits. Pure functions over a loaded Profile (hw/profiles.py fills the
node's defaults); the simulator's collectives (sim/collectives.py) cost from it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from ratrain.hw.profiles import Profile
from ratrain.program_format.placement import Placement, node_of_rank

# NOTE [node memory]: a transfer between two ranks of one node is a copy through shared
# memory: the sender's bytes are read from its buffer and written into the receiver's
# (the bounce cells in between stay in the caches), 2 bytes of memory traffic per byte
# moved; a reduction also reads the receiver's partial sum, 3. Every rank of the node
# that runs the same collective at the same time (the DP group's members on the node:
# all replicas run the same tasks at the same times) shares the node's memory bandwidth,
# so one rank's share moves node_memory_bandwidth / (ranks x traffic per byte) bytes per
# second, and never more than a lone pair's link_bandwidth.
TRAFFIC_PER_BYTE = {"reduce": 3, "copy": 2}


@dataclass(frozen=True)
class Node:
    ranks: int                          # ranks sharing the node (memory, one port)
    memory_bandwidth: float             # B/s all the node's ranks share
    port_bandwidth: float               # B/s of the node's one inter-node port
    port_latency: float                 # s per inter-node message
    link_bandwidth: float               # B/s between two ranks of the node, alone
    link_latency: float                 # s per message within the node
    progress_share: float               # share of its speed an intra-node collective
                                        # keeps while its rank computes (NOTE [manual
                                        # progress], sim/engine.py)
    kernel_slowdown: float = 1.0        # how much longer its kernels take while such a
                                        # collective moves (NOTE [kernels beside
                                        # collectives], sim/engine.py)
    collective_rows: tuple = ()         # (op, members, groups, bytes, seconds) that
                                        # `ratrain calibrate` timed on every rank of the
                                        # node at once (NOTE [measured node collectives])

    def copy_rate(self, concurrent: int, phase: str) -> float:
        """B/s one rank's share of an intra-node `phase` (reduce, copy) moves while
        `concurrent` ranks of the node run it at once (NOTE [node memory])."""
        shared = self.memory_bandwidth / (max(1, concurrent) * TRAFFIC_PER_BYTE[phase])
        return min(self.link_bandwidth, shared)


def node_of(profile: Profile | Mapping) -> Node:
    """The node of a (narrowed) profile, its defaults filled (NOTE [node defaults],
    hw/profiles.py)."""
    profile = Profile.of(profile)
    return Node(
        ranks=int(profile.ranks_per_node),
        memory_bandwidth=float(profile.node_memory_bandwidth),
        port_bandwidth=float(profile.inter_node_bandwidth),
        port_latency=float(profile.inter_node_latency),
        link_bandwidth=float(profile.link_bandwidth),
        link_latency=float(profile.link_latency),
        progress_share=float(profile.collective_progress_share),
        kernel_slowdown=_kernel_slowdown(profile),
        collective_rows=tuple(tuple(row) for row in profile.node_collectives.get("rows", ())))


def _kernel_slowdown(profile: Profile) -> float:
    """How much longer kernels take beside a collective: what a traced run measured
    (NOTE [traced rows] 6, calibrate/from_trace.py), else what calibrate's probe did."""
    traced = profile.traced.get("kernel_slowdown_beside")
    return float(traced[0] if traced else
                 profile.node_collectives.get("kernel_slowdown_beside", 1.0))


@lru_cache(maxsize=4096)
def dp_group_nodes(placement: Placement, stage: int, ranks: int) -> tuple[int, ...]:
    """Members of `stage`'s DP group on each node it spans, in node order."""
    counts: dict[int, int] = {}
    for replica in range(placement.dp):
        node = node_of_rank(placement.rank(stage, replica), ranks)
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts[n] for n in sorted(counts))


def crossings(placement: Placement, stage: int, ranks: int) -> int:
    """Replicas whose `stage` and `stage + 1` run on different nodes."""
    return sum(node_of_rank(placement.rank(stage, r), ranks)
               != node_of_rank(placement.rank(stage + 1, r), ranks)
               for r in range(placement.dp))


def placements(pp: int, dp: int, ranks: int) -> list[Placement]:
    """The placements of pp x dp ranks on nodes of `ranks` that differ in what crosses
    nodes (each stage's DP group per node, and how many replicas' neighbour stages sit
    on different nodes), the smallest block of each: pipeline-major first."""
    seen, out = set(), []
    for block in (b for b in range(1, dp + 1) if dp % b == 0):
        placement = Placement(pp, dp, block)
        key = (tuple(dp_group_nodes(placement, s, ranks) for s in range(pp)),
               tuple(crossings(placement, s, ranks) for s in range(pp - 1)))
        if key not in seen:
            seen.add(key)
            out.append(placement)
    return out


def node_per_rank(profile: Profile | Mapping) -> Profile:
    """`profile` as a node per rank whose one link is its port (the model before nodes):
    what a test of the links alone, or a user describing one rank per host, wants."""
    profile = Profile.of(profile)
    return profile.with_fields(ranks_per_node=1, inter_node_bandwidth=profile.link_bandwidth,
                               inter_node_latency=profile.link_latency)
