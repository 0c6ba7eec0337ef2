"""Placement: which (stage, replica) each rank of a compiled program runs, a choice of the
plan (NOTE [placement]). Part of the program format: the options record it, the runtime's
communicators and the simulator's nodes (hw/topology.py) read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# NOTE [placement]: which (stage, replica) each rank runs. Nodes hold consecutive ranks
# (ranks_per_node of them; `ratrain run --hosts` starts them host by host), so the rank
# order decides what shares a node. Ranks come in blocks of `block` replicas x pp
# stages, stage-major within a block:
#     rank = (replica // block) x block x pp + stage x block + replica % block
# block 1 is pipeline-major (rank = replica x pp + stage: a pipeline fills a node first,
# DP groups cross nodes), block dp is DP-major (rank = stage x dp + replica: a stage's DP
# group fills a node first, pipeline messages cross nodes), and the divisors of dp in
# between put `block` replicas of ranks_per_node / block stages on a node. Text forms:
# "pipeline", "dp", "dp:B" (blocks of B replicas).
PLACEMENT_FORMS = ("pipeline", "dp", "dp:B")


@dataclass(frozen=True)
class Placement:
    pp: int                             # pipeline stages
    dp: int                             # DP replicas of every stage
    block: int = 1                      # replicas of a stage on consecutive ranks

    def __post_init__(self):
        if self.block < 1 or self.dp % self.block:
            raise ValueError(f"--placement dp:{self.block} needs a block of replicas that "
                             f"divides dp {self.dp}")

    def rank(self, stage: int, replica: int) -> int:
        group, within = divmod(replica, self.block)
        return group * self.block * self.pp + stage * self.block + within

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank: the inverse of rank()."""
        group, rest = divmod(rank, self.block * self.pp)
        stage, within = divmod(rest, self.block)
        return stage, group * self.block + within

    def __str__(self) -> str:
        if self.block == 1 or self.pp == 1:  # pp 1: every block gives rank = replica
            return "pipeline"
        return "dp" if self.block == self.dp else f"dp:{self.block}"


@lru_cache(maxsize=256)
def parse_placement(text: str, pp: int, dp: int) -> Placement:
    """The placement `text` names (PLACEMENT_FORMS) for pp x dp ranks. ValueError names
    the forms when `text` is none of them or its block does not divide dp."""
    if text == "pipeline":
        return Placement(pp, dp, 1)
    if text == "dp":
        return Placement(pp, dp, dp)
    head, _, block = text.partition(":")
    if head != "dp" or not block.isdigit():
        raise ValueError(f"--placement must be one of {', '.join(PLACEMENT_FORMS)} "
                         f"(got {text!r})")
    return Placement(pp, dp, int(block))


def node_of_rank(rank: int, ranks_per_node: int) -> int:
    """The node (host) a rank runs on: nodes hold `ranks_per_node` consecutive ranks
    (NOTE [placement]). The one statement of that rule: the simulator's nodes
    (hw/topology.py), `ratrain run --hosts` (rt/hosts.py) and the test cluster
    (cluster/harness.py) all place ranks by it."""
    return rank // max(1, ranks_per_node)


def nodes_spanned(ranks: int, ranks_per_node: int) -> int:
    """Nodes that `ranks` ranks fill under node_of_rank: the last rank's node and those
    before it."""
    return node_of_rank(ranks - 1, ranks_per_node) + 1 if ranks > 0 else 0
