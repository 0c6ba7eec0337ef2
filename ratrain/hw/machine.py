"""The machine a plan is for: nodes of several ranks and the link between them, from
`ratrain plan`'s flags or a machine file (NOTE [machine file]), laid over a hardware
profile's node fields (hw/topology.py) before the planner and the simulator read it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ratrain.hw.profiles import ProfileError
from ratrain.hw.topology import ranks_per_node

# NOTE [machine file]: a small JSON object, every field optional:
#     {"profile": "cpu", "nodes": 4, "ranks_per_node": 8,
#      "inter_node_bandwidth": 1.25e9, "inter_node_latency": 5e-6}
# profile: the base hardware profile (a name or a path) giving each rank's compute and
# memory; nodes x ranks_per_node: the ranks planned for; inter_node_bandwidth (B/s) and
# inter_node_latency (s): the one network port a node's ranks share; node_memory_bandwidth
# (B/s): the memory a node's ranks share. A field left out keeps the profile's.
NODE_FIELDS = ("ranks_per_node", "inter_node_bandwidth", "inter_node_latency",
               "node_memory_bandwidth")


@dataclass(frozen=True)
class Machine:
    profile: str | None = None          # base profile name or path
    nodes: int | None = None            # nodes planned for
    ranks_per_node: int | None = None   # ranks sharing a node (its memory, one port)
    inter_node_bandwidth: float | None = None  # B/s of a node's port
    inter_node_latency: float | None = None    # s per inter-node message
    node_memory_bandwidth: float | None = None  # B/s a node's ranks share

    def over(self, profile: dict) -> dict:
        """`profile` with this machine's node fields where given."""
        given = {name: getattr(self, name) for name in NODE_FIELDS
                 if getattr(self, name) is not None}
        return profile | given

    def ranks(self, profile: dict) -> int | None:
        """Ranks of `nodes` nodes of the (overlaid) profile's ranks_per_node; None
        without nodes."""
        return None if self.nodes is None else self.nodes * ranks_per_node(self.over(profile))

    def updated(self, **given) -> Machine:
        """This machine with the fields given (not None) replaced: flags over a file."""
        return replace(self, **{k: v for k, v in given.items() if v is not None})


def read_machine(path: str) -> Machine:
    """The machine file at `path` (NOTE [machine file]); ProfileError names the file and
    what is wrong with it."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"machine file {path} cannot be read as JSON ({e})") from None
    known = {f.name: f for f in fields(Machine)}
    unknown = sorted(set(record) - set(known)) if isinstance(record, dict) else ["(not an object)"]
    if unknown:
        raise ProfileError(f"machine file {path}: unknown field(s) {', '.join(unknown)}; "
                           f"it takes {', '.join(known)}")
    problems = [name for name, value in record.items() if not _valid(name, value)]
    if problems:
        raise ProfileError(f"machine file {path}: {', '.join(problems)} must be "
                           "positive numbers (profile: a name or path)")
    return Machine(**record)


def _valid(name: str, value) -> bool:
    if name == "profile":
        return isinstance(value, str)
    if name in ("nodes", "ranks_per_node"):
        return isinstance(value, int) and value >= 1
    return isinstance(value, (int, float)) and value >= 0 and (value > 0 or name == "inter_node_latency")
