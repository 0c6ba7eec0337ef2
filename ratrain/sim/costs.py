"""The one cost model: seconds of a task, a collective or a state update on a profile.

Every place that turns work into seconds calls here: the passes that weigh time and the
dry run through `task_cost_model` (Program.cost_model, `ratrain compile --report`,
`ratrain inspect --schedule-png`; compute tasks by task_seconds.py, NOTE [a compute
task's seconds]), the simulator's runtime calls (calls.py) and the planner's closed-form
estimate (planner/estimate.py). It reads
compiled Programs, so it sits above passes; hw/ only loads the profiles it is given.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ratrain.ir.tasks import Kind, Task
from ratrain.passes.layer_buffers import (gathers_in_place, layer_param_count, message_bytes,
                                          shard_elements)
from ratrain.passes.insert_tied_sum import tied_weights, weight_stages
from ratrain.program_format.call_ops import CallOp
from ratrain.hw.profiles import Profile
from ratrain.hw.topology import dp_group_nodes, node_of, node_of_rank
from ratrain.sim.collectives import Timed, node_collective
from ratrain.sim.kernels import fitted_seconds, op_costs, peak_flops, rank_profile
from ratrain.sim.task_seconds import COMPUTE_KINDS, TaskSeconds

# Bytes the AdamW update moves per parameter: read grad (4), read+write master (8) and
# the two moments (16).
UPDATE_BYTES_PER_PARAM = 28
NORM_BYTES = 8  # the global norm sums one float64 over the world


def compute_rate(profile: dict, precision: str) -> float:
    """FLOP/s a layer's kernels reach: the precision's peak times the GEMM efficiency."""
    return peak_flops(profile, precision) * Profile.of(profile).gemm_efficiency


def profile_algorithm(profile: dict) -> str:
    """How the profile's DP collectives are costed (sim/collectives.py)."""
    return Profile.of(profile).collective_algorithm


def dp_group(profile: dict, options, stage: int = 0) -> tuple[int, ...]:
    """Members of `stage`'s DP group on each node it spans (hw/topology.py: the nodes
    hold the profile's ranks_per_node consecutive ranks, the options' placement says
    which)."""
    return dp_group_nodes(options.rank_placement, stage, Profile.of(profile).ranks_per_node)


def collective_timed(profile: dict, op: str, nbytes: float, group: tuple[int, ...],
                     algorithm: str | None = None) -> Timed:
    """Latencies, bytes and transfer seconds of one member's share of `op` over a group
    with `group[k]` members on node k (sim/collectives.node_collective)."""
    return node_collective(op, group, nbytes, node_of(profile),
                           algorithm or profile_algorithm(profile))


# NOTE [stragglers]: a DP collective moves its bytes once the group's last member has
# posted it, and replicas run at different speeds (a 16-core node, pp 4 x dp 4: replica
# 1's whole pipeline ran its F and B 20-25% slower, step after step, and the other
# replicas waited 0.5-1.5 s for it at their first UPD of each step). Since the replicas
# last met (their last collective's end), each has drifted from the typical replica by
# its own relative speed times the time since: the simulator replays replica 0 as a
# typical replica, so a collective over D members posted `t` seconds after the rank's
# last collective ended starts, in expectation, t x arrival_drift x e(D) late, with
# the replicas' relative speeds independent normal of standard deviation `arrival_drift`
# (what traced runs measured, NOTE [arrival drift], calibrate/from_trace.py) and e(D)
# the expected largest of D standard normal samples (0 for one member; 0.56, 1.03, 1.42,
# 1.77 for 2, 4, 8, 16). The replay charges it before the bytes move, on a `stragglers`
# lane that `ratrain simulate` totals per stage. A profile without a traced drift
# charges none.
def expected_largest_normal(members: int) -> float:
    """E[max of `members` independent standard normal samples], by quadrature."""
    return _expected_order_statistic(members, members)


def expected_normal_order(members: int) -> tuple[float, ...]:
    """E[k-th smallest of `members` independent standard normal samples] for k = 1 ..
    members, by quadrature (one member: its mean, 0)."""
    return tuple(_expected_order_statistic(members, k) for k in range(1, members + 1))


@functools.lru_cache(maxsize=None)
def _expected_order_statistic(members: int, k: int) -> float:
    """E[k-th smallest of `members` standard normals]: the integral of x times its density
    n C(n-1, k-1) phi(x) Phi(x)^(k-1) (1 - Phi(x))^(n-k)."""
    if members <= 1:
        return 0.0
    x, cdf, density = _normal_grid()
    weight = members * math.comb(members - 1, k - 1)
    return float(np.trapezoid(x * weight * density * cdf ** (k - 1)
                              * (1.0 - cdf) ** (members - k), x))


@functools.lru_cache(maxsize=1)
def _normal_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The quadrature's points on [-10, 10], and the standard normal's cdf and density there."""
    x = np.linspace(-10.0, 10.0, 20001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    return x, cdf, np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


# NOTE [rank spread]: the ranks of a job run their kernels at different speeds within a
# step, and not by their charges' noise alone: on 2 vCPUs a traced run of tiny pp 2 had
# one rank 5-25% slower than the other over whole steps, and of tiny dp 2 (ZeRO 1-3) one
# replica 2-20% slower (which rank, and by how much, changed from run to run). Rows are
# the median over the ranks, the typical rank; but a step waits on its slowest rank
# among those that must meet within it. A 1F1B pipeline waits on its slowest stage from
# one micro-batch to the next; the replicas of a one-stage program meet at every
# gradient collective and at the step's end, where the faster replica waited 13-18 ms a
# step of 300 (tiny dp 2 ZeRO 1 and 3, one of ZeRO 2's ranks 16 ms) for the slower.
# `ratrain calibrate --from` measures it (calibrate/from_trace._rank_spread): in each step
# of each replica of a pipeline, each stage's keyed calls ran over the run's median time
# of the same keys (in a one-stage program, each replica's); the slowest rank's excess
# over the ranks' mean, over e(N) for N ranks, is one sample of their relative speeds'
# standard deviation, were they normal (as NOTE [stragglers]), and the median is the
# traced `rank_spread` (`stage_spread` in profiles of 2026-11-29, read as it). A rank's
# speed is the machine's, not its role's: a spread measured across stages serves replicas
# too. Every rank of a one-stage program of D replicas computes 1 + spread x e(D) slower:
# the expected slowest, which paces them at every collective and at the step's end.
# Replicas so paced arrive together, so their collectives wait for no straggler (the
# arrival drift is charged between the replicas of a pipeline only). A pipeline's stages
# are not paced alike: its slowest stage paces the micro-batches in flight, but the fill
# and the drain run at each stage's own speed, and a bubble absorbs a stage's slowness.
# So the P stages compute exp(spread x z_k) slower, z_1 > ... > z_P the expected order
# statistics of P standard normals, and the simulator replays each of the P cyclic
# orders (the slowest stage first, second, ...; at most MAX_ROTATIONS of them, evenly
# spaced) and charges their mean step (`stage_paces`, sim/simulate.py); `ratrain
# simulate` prints the range and the rows of the rotation nearest the mean. One rank has
# no spread; a profile without a traced spread charges none. From a run's own trace on
# 2 vCPUs of a Xeon: tiny pp 2 predicted -7.6% before the spread, -0.5% with every stage
# at 1 + spread x e(P) (until 2026-11-29), -3.7% with the rotations (median of 18,
# bench/predict-runs/2026-11-29-i); tiny dp 2 ZeRO 1, 2 and 3, -4.9 to -10.7% (6 runs, all
# short) before the replicas were paced, -1.7% median after (on an AMD EPYC, two such
# runs: +0.9 and -3.2% paced, -1.7 and -10.1% not). The uniform pace was the expected
# slowest, not what a pipeline with bubbles to absorb it waits: from the 16-core node's
# pp 4 x dp 4 1f1b traces (spread 0.06-0.14) it charged that program's own step +9.2,
# +6.1 and +3.9% (`bench/node16-h200-2/round1`, `round2`, `bench/node16-h200`), the
# rotations -0.2, +0.3 and -8.4%; its zb1 +21.7 and +15.3%, now +11.2 and +1.7%; pp 2 x dp
# 8 -0.4 and +3.1%, now -5.2 and -2.6%. On an AMD EPYC (Zen 3, 2 vCPUs;
# bench/predict-runs/2026-11-29-k, each round predicted again by `bench/predict.py
# --rescore`) the traced spread was 0.050-0.069: a round's own tiny pp 2 step +5.2, +2.4
# and +4.4% with the uniform pace, +3.1, -0.4 and +1.9% with the rotations (+2.3, -1.4 and
# +1.0% with no pace); the nine other programs' median round 5.62% mean and 14.69% largest
# error with the uniform pace, 4.99 and 14.69% with the rotations (3.73 and 10.56% with
# no pace). Of the three machines the rotations miss the Xeon's 2 vCPUs by 3.2 points
# more and the others by less, and they are what the estimator measures: a stage's speed
# over a whole step. There a trace's log task times (over their key's median) vary by
# 0.035 (sd) between a run's ranks, 0.096 between a rank's steps (0.060-0.075 of it not
# shared with the other rank) and 0.063-0.082 between a step's tasks, and the layers' F,
# B and BL ran in two states about 1.25x apart, changing within runs and by rank; a
# model of those components drawn and simulated (16 draws, the median step) gave what
# the rotations give (median round 4.92% and 14.69%), 2026-11-29.
def paced_ranks(stages: int, replicas: int) -> int:
    """How many ranks pace each other within every step (NOTE [rank spread]): a
    pipeline's stages, else a one-stage program's replicas."""
    return stages if stages > 1 else replicas


def traced_rank_spread(traced: dict) -> list | None:
    """A profile entry's traced [rank spread, samples] (written as `stage_spread` by
    profiles of 2026-11-29), None where no trace measured one (NOTE [rank spread])."""
    return traced.get("rank_spread") or traced.get("stage_spread")


def rank_spread(profile: dict) -> float:
    """The traced spread of ranks' speeds (NOTE [rank spread]); 0 where none was traced."""
    spread = traced_rank_spread(Profile.of(profile).traced)
    return spread[0] if spread else 0.0


def paced_by_replicas(profile: dict, stages: int, replicas: int) -> bool:
    """Whether a one-stage program's replicas pace each other (NOTE [rank spread])."""
    return stages == 1 and paced_ranks(stages, replicas) > 1 and rank_spread(profile) > 0


MAX_ROTATIONS = 8                       # stage speed rotations simulated, at most


def stage_paces(profile: dict, stages: int, replicas: int) -> tuple[tuple[float, ...], ...]:
    """How much slower than its charges each stage computes (NOTE [rank spread]), one
    tuple per rotation the simulator replays and averages: a P-stage pipeline's stages
    at exp(spread x z) for z the expected order statistics of P standard normals, in each
    of P cyclic orders (MAX_ROTATIONS of them, evenly spaced, for more stages); a one-stage
    program of D replicas at 1 + spread x e(D), paced by the slowest replica; no spread,
    or one rank, none."""
    spread, paced = rank_spread(profile), paced_ranks(stages, replicas)
    if spread == 0 or paced == 1:
        return ((1.0,) * stages,)
    if stages == 1:
        return ((1.0 + spread * expected_largest_normal(replicas),),)
    slow = [math.exp(spread * z) for z in reversed(expected_normal_order(stages))]
    turns = sorted({k * stages // MAX_ROTATIONS for k in range(MAX_ROTATIONS)}) \
        if stages > MAX_ROTATIONS else range(stages)
    return tuple(tuple(slow[(s + k) % stages] for s in range(stages)) for k in turns)


def straggle_rate(profile: dict, members: int) -> float:
    """Seconds a collective over `members` replicas waits, in expectation, for the latest
    of them, per second since the rank's last collective ended (NOTE [stragglers])."""
    drift = Profile.of(profile).traced.get("arrival_drift")
    return drift[0] * expected_largest_normal(members) if drift else 0.0


def collective_seconds(profile: dict, op: str, members: int, nbytes: float,
                       algorithm: str | None = None,
                       group: tuple[int, ...] | None = None) -> float:
    """Seconds of `op` (allreduce, reduce_scatter, allgather) of `nbytes` over `members`
    ranks alone on the link: its latencies plus its transfer. `group`: the members on
    each node (dp_group); without it, one member per node."""
    cost = collective_timed(profile, op, nbytes, group or (1,) * members, algorithm)
    return cost.latency + cost.seconds


def collective_port_bytes(profile: dict, op: str, members: int, nbytes: float,
                          algorithm: str | None = None,
                          group: tuple[int, ...] | None = None) -> float:
    """Bytes one member sends for `op` of `nbytes` over `members` ranks (`group`: their
    count on each node, dp_group; without it, one member per node)."""
    return collective_timed(profile, op, nbytes, group or (1,) * members, algorithm).nbytes


def link_host_seconds(profile: dict, nbytes: float) -> float:
    """NOTE [link host cost] (calls.py): compute a rank loses to moving `nbytes` over its
    link (sent or received); 0 on DMA links."""
    return nbytes * float(Profile.of(profile).link_host_cost)


def crosses_node(profile: dict, options, stage: int, peer: int) -> bool:
    """Whether stage `stage` and `peer` of DP replica 0 run on different nodes (under
    the options' placement, NOTE [placement])."""
    ranks, placement = Profile.of(profile).ranks_per_node, options.rank_placement
    return node_of_rank(placement.rank(stage, 0), ranks) != \
        node_of_rank(placement.rank(peer, 0), ranks)


def message_path(profile: dict, across: bool = False) -> tuple[float, float]:
    """(latency, bandwidth) of a pipeline message between neighbour stages: the link
    within a node, the node's port (`across`) between nodes."""
    node = node_of(profile)
    return (node.port_latency, node.port_bandwidth) if across else \
        (node.link_latency, node.link_bandwidth)


def message_seconds(profile: dict, nbytes: float, across: bool = False) -> float:
    """One pipeline message of `nbytes` between neighbour stages (message_path)."""
    latency, bandwidth = message_path(profile, across)
    return latency + nbytes / bandwidth


def memory_seconds(profile: dict, precision: str, op: str, nbytes: float) -> float:
    """A memory-bound runtime call moving `nbytes`: the profile's measured cost of `op`
    (`ratrain calibrate` times the runtime's own calls), else DDR bandwidth."""
    profile = Profile.of(profile)
    measured = op_costs(profile, precision, op)
    return nbytes / profile.ddr_bandwidth if measured is None else \
        fitted_seconds(measured, 0, nbytes)


# ---- bytes of a lowered runtime call's collective ---------------------------------------------

def slot_elements(slot) -> int:
    return math.prod(slot.shape)


def scatter_bytes(call) -> int:
    """A grad_scatter's reduce-scatter input: the micro-batch's gradients concatenated in
    fp32 (NOTE [gradient accumulation])."""
    return 4 * sum(slot_elements(s) for s in call.inputs)


def gather_bytes(call, dp: int) -> int:
    """A prefetch_view's or gather_view's all-gather output (view_gather): `dp` master
    shards cast to the view's dtype first (rt/calls.py), so fp16 views move half the
    master's bytes."""
    itemsize = np.dtype(call.outputs[0].dtype).itemsize
    return view_gather(slot_elements(call.inputs[0]), itemsize, dp, 0, True).gathered


@dataclass(frozen=True)
class GradScatter:
    """One micro-batch's gradients of a layer reduce-scattered into this rank's shard
    (NOTE [gradient accumulation], rt/calls.py)."""
    concat: int                         # DDR bytes: read the gradients, write them as fp32
    reduced: int                        # bytes of the reduce-scatter's fp32 input
    add: int                            # DDR bytes of adding this rank's part into its
                                        # shard: read the part, read and write the shard


def grad_scatter(grad_bytes: int, fp32_bytes: int, shard_bytes: int) -> GradScatter:
    """Concatenate `grad_bytes` of gradients into `fp32_bytes`, reduce-scatter them and
    add this rank's part into its `shard_bytes` fp32 shard."""
    return GradScatter(grad_bytes + fp32_bytes, fp32_bytes, 3 * shard_bytes)


# ---- the lifecycle tasks: SYNC, UPD, PREF, NORM --------------------------------------------

def sync_op(options) -> str:
    """The collective of a layer's SYNC: ZeRO-2 and 3 reduce-scatter the fp32 gradient."""
    return "reduce_scatter" if options.zero >= 2 else "allreduce"


def sync_seconds(profile: dict, options, num_params: int, algorithm: str | None = None,
                 stage: int = 0) -> float:
    """A layer's SYNC of its fp32 gradient over `stage`'s DP group, alone on the link."""
    return collective_seconds(profile, sync_op(options), options.dp, 4 * num_params, algorithm,
                              dp_group(profile, options, stage))


def sync_finish_seconds(profile: dict, precision: str, out_bytes: float) -> float:
    """Finishing a SYNC once its collective is done: the sum (or this rank's part of it)
    divided by dp, read and written into its `out_bytes` output."""
    return memory_seconds(profile, precision, CallOp.GRAD_SYNC, 2 * out_bytes)


def norm_share_bytes(owned: float, grad_bytes: float, scaled: bool) -> float:
    """DDR bytes of taking a gradient's share of the global norm: the `owned` bytes this
    rank counts read once, or under a loss scale twice (finite check, then squares) with
    the whole `grad_bytes` gradient unscaled in place (read and written)."""
    return (2 * owned + 2 * grad_bytes) if scaled else owned


def undo_copy_bytes(elements: float) -> float:
    """See NOTE [commit rule]: DDR bytes of a speculative update's undo copies of `elements`
    parameters: master, m and v (fp32) read and written into undo.L."""
    return 2 * 3 * 4 * elements


def update_bytes(elements: float) -> float:
    """DDR bytes one AdamW update of `elements` parameters moves."""
    return UPDATE_BYTES_PER_PARAM * elements


def update_seconds(profile: dict, elements: float, precision: str | None = None) -> float:
    """One AdamW update of `elements` parameters: measured (with `precision`) or DDR."""
    if precision is None:
        return update_bytes(elements) / Profile.of(profile).ddr_bandwidth
    return memory_seconds(profile, precision, CallOp.ADAMW, update_bytes(elements))


def view_cast_bytes(elements: float, itemsize: int) -> float:
    """DDR bytes of casting `elements` fp32 master values into a view of `itemsize`."""
    return (4 + itemsize) * elements


@dataclass(frozen=True)
class ViewGather:
    """Building a layer's view from the DP group's master shards (rt/calls.py)."""
    cast: int                           # DDR bytes: read the fp32 shard, write it cast
    gathered: int                       # bytes the all-gather delivers: dp cast shards
    unpack: int                         # DDR bytes of copying them into the view (0 in place)


def view_gather(shard: int, itemsize: int, dp: int, view_bytes: int,
                in_place: bool) -> ViewGather:
    """Cast the master shard of `shard` elements, all-gather the cast shards and, unless
    gathered in place (NOTE [views gathered in place], passes/layer_buffers.py), copy them into
    the `view_bytes` view."""
    gathered = dp * shard * itemsize
    return ViewGather(view_cast_bytes(shard, itemsize), gathered,
                      0 if in_place else gathered + view_bytes)


# NOTE [gather start]: starting a view's all-gather is the rank's own work: the runtime casts
# the master shard (numpy), builds the request and MPI's start copies the rank's own
# shard into the output (rt/calls._start_gather, rt/comm.start_param_allgather). On the
# 2-core machine of bench/predict.py a 1.6 MB fp32 shard took 0.24 ms per start, 0.09 ms
# of it inside MPI's start, where the cast's DDR bytes charged 0.09 ms in all: a dp 2
# ZeRO-3 tiny step starts 21 of them and ran 3.3 ms longer than simulated for it.
# `ratrain calibrate` times that start as the runtime runs it (calibrate/rt_cases.py: the
# `gather_view` case, over a DP group of the rank alone) per cast byte; a profile without
# the case charges the cast's bytes at DDR bandwidth.
def gather_start_seconds(profile: dict, precision: str, g: ViewGather) -> float:
    """The compute of starting the view_gather `g` (NOTE [gather start])."""
    profile = Profile.of(profile)
    measured = op_costs(profile, precision, CallOp.GATHER_VIEW)
    return g.cast / profile.ddr_bandwidth if measured is None else \
        fitted_seconds(measured, 0, g.cast)


def gather_local_seconds(profile: dict, precision: str, g: ViewGather) -> float:
    """The rank's own compute for the view_gather `g`: its start and, unless gathered in
    place, the copy into the view (the simulator charges the two apart: sim/calls.py)."""
    return gather_start_seconds(profile, precision, g) + \
        g.unpack / Profile.of(profile).ddr_bandwidth


def layer_view_gather(program, layer: int, in_place: bool) -> ViewGather:
    """A layer's view_gather: its master shard over the DP group into its view."""
    itemsize, params = np.dtype(program.graph.dtype).itemsize, layer_param_count(program, layer)
    return view_gather(shard_elements(params, program, True), itemsize, program.options.dp,
                       program.layer_cost(layer).param_bytes, in_place)


def prefetch_seconds(program, profile: dict, layer: int, in_place: bool,
                     algorithm: str | None = None) -> float:
    """A layer's PREF (in_place: as PREF gathers) or ZeRO-3 GATH alone: cast the fp32
    master to the view's dtype, under ZeRO 1-3 as a view_gather over the DP group."""
    o, view = program.options, program.layer_cost(layer).param_bytes
    if o.zero == 0:
        params = layer_param_count(program, layer)
        return memory_seconds(profile, o.precision, CallOp.PREFETCH_VIEW, 4 * params + view)
    g = layer_view_gather(program, layer, in_place)
    return gather_local_seconds(profile, o.precision, g) + \
        collective_seconds(profile, "allgather", o.dp, g.gathered, algorithm,
                           dp_group(profile, o, program.stage_of_layer(layer)))


def norm_seconds(profile: dict, options, algorithm: str | None = None) -> float:
    """The global norm's world-wide sum of one float64."""
    return collective_seconds(profile, "allreduce", options.world_size, NORM_BYTES, algorithm)


def tie_local_bytes(copies: int, nbytes: float) -> float:
    """See NOTE [tied weights]: DDR bytes of a tie_sum on a stage holding `copies` copies of
    an `nbytes` gradient: each copy read for the sum and written with it."""
    return 2 * copies * nbytes


def tie_sum_seconds(profile: dict, nbytes: float, members: int,
                    algorithm: str | None = None) -> float:
    """See NOTE [tied weights]: all-reduce a tied weight's gradient sum over its `members`
    tie stages (blocking, alone on the link)."""
    return collective_seconds(profile, "allreduce", members, nbytes, algorithm)


# ---- the dry run's per-task costs ------------------------------------------------------------

def bound_cost_model(profile: dict | None) -> Callable | None:
    """Program.cost_model on `profile` (None without one): the passes that weigh time
    (partition_stages, zb1's W order, where recovery runs) see the compute costs the
    simulator charges (NOTE [a compute task's seconds], task_seconds.py), whether
    `ratrain compile` or the planner compiles."""
    return partial(task_cost_model, profile=profile) if profile else None


def task_cost_model(program, profile: dict) -> TaskCosts:
    """Seconds per task of `program` on `profile` narrowed to the job's ranks
    (kernels.rank_profile), each task alone (for the passes, dry_run and the pictures):
    compute tasks as task_seconds.TaskSeconds sums their kernels, the others by the
    helpers above (the simulator costs the lowered calls)."""
    o = program.options
    profile = rank_profile(profile, o.world_size)
    compute = TaskSeconds(program, profile)
    params = lambda l: layer_param_count(program, l)
    prefetch = lambda t: prefetch_seconds(program, profile, t.layer,
                                          gathers_in_place(program, t.layer))
    table: dict[Kind, Callable[[Task], float]] = {
        **dict.fromkeys(COMPUTE_KINDS, compute),
        Kind.SEND_F: lambda t: message_seconds(profile, message_bytes(program, t.stage),
                                               crosses_node(profile, o, t.stage, t.stage + 1)),
        Kind.SEND_B: lambda t: message_seconds(profile, message_bytes(program, t.stage - 1),
                                               crosses_node(profile, o, t.stage, t.stage - 1)),
        Kind.SYNC: lambda t: sync_seconds(profile, o, params(t.layer), stage=t.stage),
        Kind.UPD: lambda t: update_seconds(profile, shard_elements(params(t.layer), program,
                                                                   o.zero >= 1), o.precision),
        Kind.PREF: prefetch,
        Kind.NORM: lambda t: norm_seconds(profile, o),
        Kind.TIE: lambda t: _tie_seconds(program, profile, t.stage),
        **dict.fromkeys((Kind.GATH_F, Kind.GATH_R, Kind.GATH_B), prefetch),
    }
    return TaskCosts(table, compute.layer_pass)


@dataclass(frozen=True)
class TaskCosts:
    """A program's cost model on a profile: called with a task, its seconds (0 for a
    task that costs nothing alone: FREE, RECV, POST); `layer_pass(layer)` the F and B of
    one micro-batch through a layer at speed 1 (partition_stages balances it)."""
    table: dict                         # Kind -> (task -> seconds)
    layer_pass: Callable[[int], float]

    def __call__(self, task: Task) -> float:
        cost = self.table.get(task.kind)
        return cost(task) if cost is not None else 0.0


def _tie_seconds(program, profile: dict, stage: int) -> float:
    """See NOTE [tied weights]: per tied weight, add the stage's copies of its gradient and
    all-reduce the sum over the tie stages (one tie_sum call each, passes/lower_state.py)."""
    seconds = 0.0
    for w in tied_weights(program):
        copies = sum(program.stage_of_layer(l) == stage for l in w.layers)
        nbytes = 4 * program.graph.param_types()[w.name].size
        members = len(weight_stages(program, w))
        if copies:
            seconds += tie_local_bytes(copies, nbytes) / Profile.of(profile).ddr_bandwidth + \
                tie_sum_seconds(profile, nbytes, members)
    return seconds
