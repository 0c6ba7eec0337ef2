"""The machine a plan is for: nodes of several ranks and the links within and between
them, from the machine flags or a machine file (NOTE [machine file]), laid over a hardware
profile's node and link fields (hw/topology.py) before the planner and the simulator read
it. A compiled program records it (NOTE [recorded machine]) so `ratrain simulate DIR`
replays on the machine the program was planned for.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ratrain.hw.profiles import Profile, ProfileError

# NOTE [machine file]: a small JSON object, every field optional:
#     {"profile": "cpu", "nodes": 4, "ranks_per_node": 8,
#      "inter_node_bandwidth": 1.25e9, "inter_node_latency": 5e-6}
# profile: the base hardware profile (a name or a path) giving each rank's compute and
# memory; nodes x ranks_per_node: the ranks planned for; inter_node_bandwidth (B/s) and
# inter_node_latency (s): the one network port a node's ranks share; node_memory_bandwidth
# (B/s): the memory a node's ranks share; link_bandwidth (B/s) and link_latency (s): the
# link between two ranks of a node (the --link-* flags). A field left out keeps the
# profile's. The machine flags (cli/options.MACHINE_FLAGS) are these fields, one each.
PROFILE_FIELDS = ("ranks_per_node", "inter_node_bandwidth", "inter_node_latency",
                  "node_memory_bandwidth", "link_bandwidth", "link_latency")
ZERO_ALLOWED = ("inter_node_latency", "link_latency")

# NOTE [recorded machine]: `ratrain compile` writes the machine it compiled for into
# program.json as "machine": the machine file's fields that were given (by flags or a
# file; the rest are the profile's), "profile" always (the --hw name, or the profile
# file's absolute path) and "profile_sha256", the hash of that profile as it was read
# (canonical JSON), so a changed file is told apart. "hw" beside it is the profile with
# the machine laid over it: what the passes costed and the planner simulated, so
# `ratrain simulate DIR` with no flags replays on it and prints the plan row's step.
# Machine flags given to simulate override the recorded fields (as flags override a
# machine file); --hw or a file's profile swaps the base profile, keeping the recorded
# fields over it. The placement (which rank runs which stage and replica) is the
# program's own: options.placement and "ranks".


@dataclass(frozen=True)
class Machine:
    profile: str | None = None          # base profile name or path
    nodes: int | None = None            # nodes planned for
    ranks_per_node: int | None = None   # ranks sharing a node (its memory, one port)
    inter_node_bandwidth: float | None = None  # B/s of a node's port
    inter_node_latency: float | None = None    # s per inter-node message
    node_memory_bandwidth: float | None = None  # B/s a node's ranks share
    link_bandwidth: float | None = None  # B/s between two ranks of a node
    link_latency: float | None = None   # s per message within a node

    def over(self, profile: Profile | Mapping) -> Profile:
        """`profile` with this machine's node and link fields where given."""
        given = {name: getattr(self, name) for name in PROFILE_FIELDS
                 if getattr(self, name) is not None}
        return Profile.of(profile).with_fields(**given)

    def ranks(self, profile: Profile | Mapping) -> int | None:
        """Ranks of `nodes` nodes of the (overlaid) profile's ranks_per_node; None
        without nodes."""
        return None if self.nodes is None else self.nodes * int(self.over(profile).ranks_per_node)

    def updated(self, **given) -> Machine:
        """This machine with the fields given (not None) replaced: flags over a file."""
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    def given(self) -> dict:
        """The fields given (not None), as a machine file holds them."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def record(self, base: Mapping) -> dict:
        """program.json's "machine" (NOTE [recorded machine]); `base`: the profile
        `self.profile` names, as read."""
        return self.given() | {"profile_sha256": profile_sha256(base)}

    @staticmethod
    def of_record(record: dict) -> Machine:
        """The machine a program.json records (Machine() for a program compiled before
        programs recorded one)."""
        return Machine(**{f.name: record[f.name] for f in fields(Machine) if f.name in record})


def profile_identity(name_or_path: str) -> str:
    """A profile's name as recorded: a built-in name as given, a file's absolute path."""
    path = Path(name_or_path)
    return str(path.resolve()) if path.suffix == ".json" and path.is_file() else name_or_path


def profile_sha256(profile: Mapping) -> str:
    """The hash of a profile's content: its canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(dict(profile), sort_keys=True).encode()).hexdigest()


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
    return isinstance(value, (int, float)) and value >= 0 and (value > 0 or name in ZERO_ALLOWED)
