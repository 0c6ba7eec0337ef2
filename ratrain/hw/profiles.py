"""Hardware profiles: what one rank's device and links can do, and task costs from them.

A profile is a JSON file (`ratrain/hw/<name>.json`, or any path) with the fields below,
all per rank (one MPI rank drives one MT-3000 cluster, or one CPU process). The compiler
reads `usable_memory` as the default --budget; `ratrain compile --report`, the pictures
and the simulator turn tasks into seconds with `task_cost_model`.

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
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ratrain.ir.tasks import Kind, Task

PROFILE_DIR = Path(__file__).parent
NUMBER_FIELDS = ("fp16_flops", "fp32_flops", "gemm_efficiency", "ddr_bandwidth",
                 "link_bandwidth", "link_latency", "usable_memory", "gsm_bytes", "am_bytes",
                 "cores")
ALGORITHMS = ("ring", "tree", "auto")
# Bytes the AdamW update moves per parameter: read grad (4), read+write master (8) and
# the two moments (16).
UPDATE_BYTES_PER_PARAM = 28


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
    return problems


# ---- task costs -------------------------------------------------------------------------

def compute_rate(profile: dict, precision: str) -> float:
    """FLOP/s a layer's kernels reach: the precision's peak times the GEMM efficiency."""
    peak = profile["fp16_flops"] if precision == "fp16" else profile["fp32_flops"]
    return peak * profile["gemm_efficiency"]


def message_seconds(profile: dict, nbytes: float) -> float:
    return profile["link_latency"] + nbytes / profile["link_bandwidth"]


def ring_seconds(profile: dict, nbytes: float, ranks: int, phases: int) -> float:
    """A ring collective over `ranks`: `phases` = 2 for all-reduce (reduce-scatter +
    all-gather), 1 for reduce-scatter or all-gather alone: phases (D-1)/D x bytes / bw."""
    if ranks <= 1:
        return 0.0
    steps = phases * (ranks - 1)
    return steps * profile["link_latency"] + steps / ranks * nbytes / profile["link_bandwidth"]


def task_cost_model(program, profile: dict) -> Callable[[Task], float]:
    """Seconds per task of `program` on `profile` (for dry_run and the pictures)."""
    from ratrain.passes.buffers import layer_param_count
    o, rate = program.options, compute_rate(profile, program.options.precision)
    cost = program.layer_cost
    params = lambda l: layer_param_count(program, l)
    shard = lambda n: n / o.dp if o.zero >= 1 else n
    table: dict[Kind, Callable[[Task], float]] = {
        Kind.F: lambda t: sum(cost(l).fwd_flops for l in program.stages[t.stage]) / rate,
        Kind.B: lambda t: sum(cost(l).bwd_flops + _recomputed_in_backward(program, t, l)
                              for l in program.stages[t.stage]) / rate,
        Kind.REC: lambda t: recompute_flops(program, t.layer, t.micro_batch) / rate,
        Kind.SEND_F: lambda t: message_seconds(profile, cost(program.stages[t.stage][-1]).output_bytes),
        Kind.SEND_B: lambda t: message_seconds(profile, cost(program.stages[t.stage - 1][-1]).output_bytes),
        Kind.SYNC: lambda t: ring_seconds(profile, 4 * params(t.layer), o.dp, 1 if o.zero >= 2 else 2),
        Kind.UPD: lambda t: UPDATE_BYTES_PER_PARAM * shard(params(t.layer)) / profile["ddr_bandwidth"],
        Kind.PREF: lambda t: _prefetch_seconds(profile, o, cost(t.layer).param_bytes, params(t.layer)),
        Kind.NORM: lambda t: ring_seconds(profile, 8, o.dp * o.pp, 2),
        Kind.TIE: lambda t: _tie_seconds(program, profile),
        **dict.fromkeys((Kind.GATH_F, Kind.GATH_R, Kind.GATH_B), lambda t: _prefetch_seconds(
            profile, o, cost(t.layer).param_bytes, params(t.layer))),
    }
    return lambda task: table[task.kind](task) if task.kind in table else 0.0


def _tie_seconds(program, profile: dict) -> float:
    """NOTE [tied weights]: add the copies of each tied weight's gradient, all-reduce the
    sum over the tie stages."""
    from ratrain.passes.insert_tied_sum import tie_stages, tied_weights
    nbytes = sum(4 * program.graph.param_types()[w.name].size for w in tied_weights(program))
    return 3 * nbytes / profile["ddr_bandwidth"] + \
        ring_seconds(profile, nbytes, len(tie_stages(program)), 2)


def _recomputed_in_backward(program, task: Task, layer: int) -> int:
    """FLOPs B spends rebuilding the layer (NOTE [backward-time recovery])."""
    from ratrain.passes.buffers import recovers_in_backward
    if (layer, task.micro_batch) not in program.recompute or \
            not recovers_in_backward(program, task.stage, task.micro_batch):
        return 0
    return recompute_flops(program, layer, task.micro_batch)


def recompute_flops(program, layer: int, micro_batch: int) -> int:
    """FLOPs a REC spends: the whole forward under full recompute; under selective only
    the non-GEMM ops (GEMM outputs are kept, see residuals.kept_mask)."""
    mode = program.recompute.get((layer, micro_batch), "full")
    kind = program.graph.kinds[program.graph.layers[layer].kind]
    return _forward_flops(kind.fwd, skip_gemm=mode == "selective")


@lru_cache(maxsize=64)
def _forward_flops(graph, skip_gemm: bool) -> int:
    from ratrain.ir.costs import node_flops
    from ratrain.ir.rules import lookup_rule
    return sum(node_flops(n) for n in graph.nodes
               if not (skip_gemm and (lookup_rule(n.op).kernel or "") == "gemm"))


def _prefetch_seconds(profile: dict, options, view_bytes: int, num_params: int) -> float:
    """Build a layer's next view: cast the (local) fp32 master to the compute dtype in
    DDR, then under ZeRO 1-3 all-gather the shards of the view over the DP group."""
    local = num_params / options.dp if options.zero >= 1 else num_params
    cast = (4 * local + view_bytes * local / num_params) / profile["ddr_bandwidth"]
    gather = ring_seconds(profile, view_bytes, options.dp, 1) if options.zero >= 1 else 0.0
    return cast + gather
