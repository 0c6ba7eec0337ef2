"""A profile's node: how many ranks share one node's memory and one network port, and
where each rank sits. Pure functions over a loaded profile dict (hw/profiles.py lists the
fields and their defaults); the simulator's collectives (sim/collectives.py) cost from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

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


def rank_threads(profile: dict) -> int:
    """Threads each rank runs: `rank_threads` once narrowed to a job
    (sim/kernels.rank_profile), else the profile's `cores`."""
    return int(profile.get("rank_threads") or profile.get("cores") or 1)


def ranks_per_node(profile: dict) -> int:
    """`ranks_per_node` if given, else node_cores // threads per rank (a calibrated
    profile narrowed to a job), else 1 (each rank its own node)."""
    if "ranks_per_node" in profile:
        return int(profile["ranks_per_node"])
    if "node_cores" in profile:
        return max(1, int(profile["node_cores"]) // rank_threads(profile))
    return 1


def default_memory_bandwidth(profile: dict, ranks: int) -> float:
    """The node's memory bandwidth when the profile does not say: the per-rank DDR rate
    of the `threads` entry measured with one rank per core (all ranks streaming at once,
    `ratrain calibrate`) times node_cores; else the profile's own ddr_bandwidth per rank
    times the node's ranks (each rank its own memory, as an MT-3000 cluster's DDR)."""
    one = profile.get("threads", {}).get("1")
    if one and "node_cores" in profile:
        return one["ddr_bandwidth"] * int(profile["node_cores"])
    return profile["ddr_bandwidth"] * ranks


def default_progress_share(profile: dict) -> float:
    """0 for a profile measured by `ratrain calibrate`: its ranks talk through the mpich
    wheel's shared memory, which moves bytes only inside MPI calls (NOTE [progress while
    kernels run], rt/comm.py); 1 for devices whose links are driven by DMA engines."""
    return 0.0 if profile.get("calibrated") else 1.0


def node_of(profile: dict) -> Node:
    """The node of a (narrowed) profile, its optional fields filled with their defaults
    (hw/profiles.py lists them)."""
    ranks = ranks_per_node(profile)
    return Node(
        ranks=ranks,
        memory_bandwidth=float(profile.get("node_memory_bandwidth")
                               or default_memory_bandwidth(profile, ranks)),
        port_bandwidth=float(profile.get("inter_node_bandwidth", profile["link_bandwidth"])),
        port_latency=float(profile.get("inter_node_latency", profile["link_latency"])),
        link_bandwidth=float(profile["link_bandwidth"]),
        link_latency=float(profile["link_latency"]),
        progress_share=float(profile.get("collective_progress_share",
                                         default_progress_share(profile))),
        kernel_slowdown=float(profile.get("node_collectives", {})
                              .get("kernel_slowdown_beside", 1.0)),
        collective_rows=tuple(tuple(row) for row in
                              profile.get("node_collectives", {}).get("rows", ())))


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


def node_per_rank(profile: dict) -> dict:
    """`profile` as a node per rank whose one link is its port (the model before nodes):
    what a test of the links alone, or a user describing one rank per host, wants."""
    return profile | {"ranks_per_node": 1, "inter_node_bandwidth": profile["link_bandwidth"],
                      "inter_node_latency": profile["link_latency"]}
