"""Hardware profiles: what one rank's device and links can do, loaded from JSON.

A profile is a JSON file (`ratrain/hw/<name>.json`, or any path), all fields per rank
(one MPI rank drives one MT-3000 cluster, or one CPU process); its fields, units and
readers are the table of docs/DESIGN.md section 7.1, their one list, and `Profile` its
typed form (NOTE [typed profile]). The compiler reads `usable_memory` as the default
--budget; the one cost model (ratrain/sim/costs.py) turns tasks and calls into seconds on
it for `ratrain compile --report`, the pictures, the planner and the simulator. This
module imports nothing else of ratrain.
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

PROFILE_DIR = Path(__file__).parent
NUMBER_FIELDS = ("fp16_flops", "fp32_flops", "gemm_efficiency", "ddr_bandwidth",
                 "link_bandwidth", "link_latency", "usable_memory", "gsm_bytes", "am_bytes",
                 "cores")
ALGORITHMS = ("ring", "tree", "auto")
NODE_FIELDS = ("node_memory_bandwidth", "inter_node_bandwidth", "inter_node_latency")


class ProfileError(ValueError):
    """An unknown profile name, an unreadable file or a profile missing a field."""


# NOTE [typed profile]: a profile is read once into a frozen `Profile` (load_profile, or
# Profile.of for a dict a program.json, a writer or a test holds) and passed down; code
# reads its fields as attributes, so a misspelt field is an AttributeError where it is
# read, and a field the table does not know is refused where the profile is read. Each
# optional field holds its default once read (the node's among them: ranks_per_node,
# node_memory_bandwidth, the port, collective_progress_share), so no reader carries a
# fallback. The JSON a profile was read from is kept as given (`to_dict`): program.json's
# "hw", a machine laid over a profile, a narrowed one and the profiles `ratrain calibrate`
# writes are that JSON, key for key and in its order, so a recompile writes the same bytes.
# As a read-only mapping over that JSON (`profile["name"]`, `profile | {...}`, a plain
# dict) a profile also serves its writers and the tests that build changed ones.
@dataclass(frozen=True, eq=False)
class Profile(Mapping):
    # required in a profile read from JSON (REQUIRED); None only in a partial one (`of`)
    name: str = None                    # the profile's name (--hw NAME)
    fp32_flops: float = None            # FLOP/s: peak FP32 rate of one rank
    fp16_flops: float = None            # FLOP/s: peak FP16 rate (bf16's without bf16_flops)
    gemm_efficiency: float = None       # fraction of peak a GEMM-class kernel reaches
    ddr_bandwidth: float = None         # B/s of memory-bound ops and runtime copies
    link_bandwidth: float = None        # B/s between two ranks of one node
    link_latency: float = None          # s per message between two ranks of one node
    usable_memory: int = None           # B a rank may use: the default --budget
    gsm_bytes: int = None               # B of shared on-chip memory (a CPU's last level)
    am_bytes: int = None                # B of per-core on-chip memory (a CPU's L1)
    cores: int = None                   # compute cores per rank
    # optional: the default where the JSON leaves it out
    description: str = ""               # what machine
    sources: dict = field(default_factory=dict)  # {field: where its number comes from}
    calibrated: bool = False            # measured by `ratrain calibrate`
    calibration: str | None = None     # full, quick (NOTE [this machine's profile])
    cpu_model: str | None = None       # the CPU model measured (hw/identity.profile_label)
    bf16_flops: float | None = None    # FLOP/s: peak bf16 rate, if measured
    gemm_shape_curve: list = field(default_factory=list)  # [[dim, factor], ...]
    link_host_cost: float = 0.0         # s of compute a rank loses per byte it moves
    collective_algorithm: str = "ring"  # ring, tree, auto
    sm_bytes: int | None = None        # B of per-core SM (descriptive)
    node_cores: int | None = None      # cores of the node; None: `cores`, one rank a node
    default_precision: str = "fp32"     # --precision when not given
    default_zero: int = 0               # --zero when not given and dp > 1
    op_costs: dict = field(default_factory=dict)       # {precision: {op: fit}}
    op_costs_cold: dict = field(default_factory=dict)  # as op_costs, caches swept
    cache_bytes: int | None = None     # B one rank keeps cached (NOTE [cache share])
    traced: dict = field(default_factory=dict)  # traced rows (NOTE [traced rows])
    threads: dict = field(default_factory=dict)  # {count: fields measured at it}
    rank_threads: int | None = None    # threads of one rank of a job: set by narrowing
                                        # (sim/kernels.rank_profile), else None
    ranks_per_node: int | None = None  # ranks sharing a node; None: NOTE [node defaults]
    node_memory_bandwidth: float | None = None  # B/s the node's ranks share; None: same
    inter_node_bandwidth: float | None = None   # B/s of the node's one port; None: same
    inter_node_latency: float | None = None     # s per message between nodes; None: same
    collective_progress_share: float | None = None  # NOTE [manual progress]; None: same
    node_collectives: dict = field(default_factory=dict)  # {rows, kernel_slowdown_beside}
    given: dict = field(default=None, repr=False)  # the JSON as read (to_dict); never
                                        # changed: with_fields makes a new profile

    def __post_init__(self):
        """Keeps the JSON given (every field not None, if not passed) and fills the node's
        defaults (NOTE [node defaults])."""
        if self.given is None:
            given = {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}
            object.__setattr__(self, "given", given)
        for name, value in node_defaults(self).items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, record: Mapping, where: str = "profile",
                  partial: bool = False) -> Profile:
        """The profile of a JSON object; ProfileError names a field the table does not
        know (with the nearest known one) or, unless `partial`, a required one missing."""
        unknown = [f for f in record if f not in FIELDS]
        missing = [] if partial else [f for f in REQUIRED if f not in record]
        if unknown or missing:
            raise ProfileError(f"hardware {where}: " + "; ".join(
                [f"unknown field {f!r}{_nearest(f)}" for f in unknown]
                + ([f"missing {', '.join(missing)}"] if missing else [])))
        return cls(**record, given=dict(record))

    @staticmethod
    def of(profile: Profile | Mapping) -> Profile:
        """`profile` as a Profile: itself, or read from a dict (a program's "hw", a writer's
        or a test's; a partial one, as a test of one cost builds, leaves the required
        fields it lacks None)."""
        return profile if isinstance(profile, Profile) else \
            Profile.from_dict(profile, partial=True)

    def to_dict(self) -> dict:
        """The JSON this profile was read from, key for key in its order (a new dict)."""
        return dict(self.given)

    def with_fields(self, **fields) -> Profile:
        """This profile with `fields` laid over its JSON (a machine, a threads entry)."""
        return Profile.from_dict(self.to_dict() | fields)

    @property
    def threads_per_rank(self) -> int:
        """Threads each rank runs: `rank_threads` once narrowed, else `cores`."""
        return int(self.rank_threads or self.cores or 1)

    def __getitem__(self, name: str):
        return self.given[name]

    def __iter__(self):
        return iter(self.given)

    def __len__(self) -> int:
        return len(self.given)

    def __or__(self, other: Mapping) -> dict:
        return self.to_dict() | dict(other)

    def __ror__(self, other: Mapping) -> dict:
        return dict(other) | self.to_dict()


FIELDS = tuple(f.name for f in fields(Profile) if f.name != "given")
REQUIRED = ("name",) + NUMBER_FIELDS


def _nearest(name: str) -> str:
    close = difflib.get_close_matches(name, FIELDS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# NOTE [node defaults]: the node fields a profile leaves out (DESIGN 7.1's table, NOTE
# [node memory], hw/topology.py):
#   1. ranks_per_node: node_cores // threads per rank where the profile gives node_cores
#      (a calibrated profile narrowed to a job), else 1 (each rank its own node);
#   2. node_memory_bandwidth: the per-rank DDR rate of the `threads` entry measured with
#      one rank per core (all ranks streaming at once, `ratrain calibrate`) times
#      node_cores; else the profile's own ddr_bandwidth per rank times the node's ranks
#      (each rank its own memory, as an MT-3000 cluster's DDR);
#   3. inter_node_bandwidth and inter_node_latency: the link's;
#   4. collective_progress_share: 0 for a profile measured by `ratrain calibrate` (its
#      ranks talk through the mpich wheel's shared memory, which moves bytes only inside
#      MPI calls: NOTE [progress while kernels run], rt/comm.py), 1 for devices whose links
#      are driven by DMA engines.
def node_defaults(profile: Profile) -> dict:
    """The node fields of `profile` as numbers, those it leaves out (None or, for the
    memory, 0) filled (NOTE [node defaults])."""
    ranks = profile.ranks_per_node
    if ranks is None:
        ranks = 1 if profile.node_cores is None else \
            max(1, int(profile.node_cores) // profile.threads_per_rank)
    memory, one = profile.node_memory_bandwidth, profile.threads.get("1") or {}
    if not memory and "ddr_bandwidth" in one and profile.node_cores is not None:
        memory = one["ddr_bandwidth"] * int(profile.node_cores)
    elif not memory and profile.ddr_bandwidth is not None:
        memory = profile.ddr_bandwidth * int(ranks)
    share = profile.collective_progress_share
    return {"ranks_per_node": int(ranks), "node_memory_bandwidth": _number(memory),
            "inter_node_bandwidth": _number(_given_or(profile.inter_node_bandwidth,
                                                      profile.link_bandwidth)),
            "inter_node_latency": _number(_given_or(profile.inter_node_latency,
                                                    profile.link_latency)),
            "collective_progress_share": float(_given_or(share, 0.0 if profile.calibrated
                                                         else 1.0))}


def _given_or(value, default):
    return default if value is None else value


def _number(value) -> float | None:
    """A float, None in a partial profile that lacks what it comes from."""
    return None if value is None else float(value)


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path) -> Profile:
    """The profile of a built-in name (`mt3000`, `cpu`) or of a JSON file path; a
    ProfileError names the file and each field that is wrong (NOTE [typed profile])."""
    path = Path(name_or_path)
    if path.suffix != ".json" or not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ProfileError(f"unknown hardware profile {str(name_or_path)!r}: known profiles "
                           f"are {', '.join(known_profiles())}, or give a path to a .json file")
    try:
        profile = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"cannot read hardware profile {path}: {e}") from None
    _check_profile(profile, path)
    return Profile.from_dict(profile, f"profile {path}")


def _check_profile(profile: dict, path: Path) -> None:
    missing = [f for f in ("name",) + NUMBER_FIELDS if f not in profile]
    bad = [f for f in NUMBER_FIELDS if f in profile and not
           (isinstance(profile[f], (int, float)) and profile[f] > 0)]
    problems = ([f"missing {', '.join(missing)}"] if missing else []) \
        + ([f"{', '.join(bad)} must be positive numbers"] if bad else []) \
        + _simulator_problems(profile)
    if problems:
        raise ProfileError(f"hardware profile {path}: " + "; ".join(problems))


def _simulator_problems(profile: dict) -> list[str]:
    problems = []
    curve = profile.get("gemm_shape_curve", [])
    if not (isinstance(curve, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and v > 0
                                                        for v in p) for p in curve)):
        problems.append("gemm_shape_curve must be a list of [dimension, factor] pairs of "
                        "positive numbers")
    if profile.get("collective_algorithm", "ring") not in ALGORITHMS:
        problems.append(f"collective_algorithm must be one of {', '.join(ALGORITHMS)}")
    return problems + _node_problems(profile)


def _node_problems(profile: dict) -> list[str]:
    """The node fields (hw/topology.py), each named when it is wrong."""
    problems = [f"{f} must be a positive number" for f in NODE_FIELDS if f in profile
                and not (isinstance(profile[f], (int, float)) and profile[f] > 0)]
    ranks = profile.get("ranks_per_node", 1)
    if not (isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1):
        problems.append("ranks_per_node must be a whole number of ranks, at least 1")
    share = profile.get("collective_progress_share", 0.0)
    if not (isinstance(share, (int, float)) and 0 <= share <= 1):
        problems.append("collective_progress_share must be a number from 0 to 1")
    return problems
