"""Hardware profiles: what one rank's device and links can do, loaded from JSON.

A profile is a JSON file (`ratrain/hw/<name>.json`, or any path) with the fields below,
all per rank (one MPI rank drives one MT-3000 cluster, or one CPU process). The compiler
reads `usable_memory` as the default --budget; the one cost model (ratrain/sim/costs.py)
turns tasks and calls into seconds on it for `ratrain compile --report`, the pictures,
the planner and the simulator. This module imports nothing else of ratrain.

| field              | unit      | meaning                                                  |
|--------------------|-----------|----------------------------------------------------------|
| name               | -         | the profile's name (`--hw NAME`)                         |
| fp16_flops         | FLOP/s    | peak FP16 rate of one rank                               |
| fp32_flops         | FLOP/s    | peak FP32 rate of one rank                               |
| gemm_efficiency    | 0..1      | fraction of peak a layer's kernels reach (GEMM-bound)    |
| ddr_bandwidth      | B/s       | effective DDR bandwidth (optimizer update, view casts)   |
| link_bandwidth     | B/s       | bandwidth of one link between ranks                      |
| link_latency       | s         | latency of one message between ranks                     |
| usable_memory      | B         | DDR a rank may use: the default --budget                 |
| gsm_bytes          | B         | shared on-chip memory (GSM; a CPU's last-level cache)    |
| am_bytes           | B         | per-core on-chip memory (AM; a CPU core's L1)            |
| cores              | -         | compute cores per rank                                   |
| default_precision  | fp32/fp16 | --precision when not given                               |
| default_zero       | 0/1/2/3   | --zero when not given and --dp > 1                       |

Optional: description, calibrated (false until `ratrain calibrate` measured the numbers),
sm_bytes, sources (field -> where the number comes from), and for the simulator (ratrain/sim):

| field                | unit           | meaning                                         |
|----------------------|----------------|-------------------------------------------------|
| gemm_shape_curve     | [[dim, x], ..] | factor x on gemm_efficiency for a GEMM or       |
|                      |                | attention kernel whose smallest dimension is    |
|                      |                | dim; linear in log2(dim) between points, flat   |
|                      |                | outside them (default: 1 for every shape)       |
| collective_algorithm | ring/tree/auto | how DP collectives are costed, see              |
|                      |                | sim/collectives.py (default: ring)              |
| link_host_cost       | s/B            | compute a rank loses per byte it sends or       |
|                      |                | receives (TCP links; NOTE [link host cost] in   |
|                      |                | sim/calls.py; default 0: DMA links)             |
| op_costs             | {precision:    | measured kernel and runtime-call costs: per op  |
|                      |  {op: fit}}    | `measured` [[FLOPs, bytes, s], ..] and a fit    |
|                      |                | (seconds, flop_rate, byte_rate) for other       |
|                      |                | shapes (`ratrain calibrate`)                    |
| op_costs_cold        | as op_costs    | the same kernels timed with swept caches; with  |
|                      |                | cache_bytes, a call costs between the two by    |
|                      |                | its operands' residency (sim/residency.py)      |
| cache_bytes          | B              | working set one rank keeps in the caches        |
| node_cores           | -              | cores of a node the ranks share (cpu)           |
| threads              | {count: {..}}  | fields measured at that many threads per rank   |
|                      |                | (op_costs, op_costs_cold, cache_bytes,          |
|                      |                | fp32_flops, ddr_bandwidth); the                 |
|                      |                | simulator takes the entry for node_cores //     |
|                      |                | ranks and records it as rank_threads            |

The node (hw/topology.py; NOTE [node memory] there), each field optional, its default
derived from the fields above:

| field                     | unit | meaning (default)                                |
|---------------------------|------|--------------------------------------------------|
| ranks_per_node            | -    | ranks sharing one node's memory and port         |
|                           |      | (node_cores // threads per rank, else 1)         |
| node_memory_bandwidth     | B/s  | memory bandwidth the node's ranks share: their   |
|                           |      | transfers within the node copy through it        |
|                           |      | (threads["1"].ddr_bandwidth x node_cores, the    |
|                           |      | per-rank rate with every core's rank streaming;  |
|                           |      | else ddr_bandwidth x ranks_per_node)             |
| inter_node_bandwidth      | B/s  | the node's one network port, shared by all its   |
|                           |      | ranks (link_bandwidth)                           |
| inter_node_latency        | s    | one message between nodes (link_latency)         |
| collective_progress_share | 0..1 | speed a DP collective keeps while its rank       |
|                           |      | computes (NOTE [manual progress], sim/engine.py; |
|                           |      | 0 for calibrated profiles, whose MPI moves       |
|                           |      | shared-memory bytes only inside its calls; else  |
|                           |      | 1, links driven by DMA engines)                  |
| node_collectives          | {..} | what `ratrain calibrate` measured with every     |
|                           |      | rank at once: `rows` [op, members, groups,       |
|                           |      | bytes, s] and `kernel_slowdown_beside` (a GEMM   |
|                           |      | loop's time with all-reduces streaming over its  |
|                           |      | time alone); node_memory_bandwidth and           |
|                           |      | collective_progress_share are derived from them  |
|                           |      | (calibrate/node_fit.py)                          |

link_bandwidth and link_latency are then those of two ranks of one node; a profile
without the node fields is a node per rank whose link is its port, as before.
"""
from __future__ import annotations

import json
from pathlib import Path

PROFILE_DIR = Path(__file__).parent
NUMBER_FIELDS = ("fp16_flops", "fp32_flops", "gemm_efficiency", "ddr_bandwidth",
                 "link_bandwidth", "link_latency", "usable_memory", "gsm_bytes", "am_bytes",
                 "cores")
ALGORITHMS = ("ring", "tree", "auto")
NODE_FIELDS = ("node_memory_bandwidth", "inter_node_bandwidth", "inter_node_latency")


class ProfileError(ValueError):
    """An unknown profile name, an unreadable file or a profile missing a field."""


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path) -> dict:
    """The profile dict of a built-in name (`mt3000`, `cpu`) or of a JSON file path."""
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
    return profile


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
