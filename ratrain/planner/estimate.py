"""Closed-form step-time estimates of a partitioned candidate (memory: memory_estimate.py).

The planner compiles and simulates only the few candidates these estimates rank best (a
70B program takes ~25 s to compile). Time charges each piece of work what the simulator
charges it, on the same rank profile (sim/simulate.py rank_profile): per-node op costs
(sim/kernels.py) and the one cost model's helpers (sim/costs.py), on a 1F1B timeline. It
orders the search; simulated rows report the simulator's step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ratrain.passes.layer_buffers import (gathers_in_place, layer_param_count, shard_elements,
                                          unfused_grad_elements)
from ratrain.passes.residuals import kept_mask, nodes_rebuilding
from ratrain.passes.insert_update import commits_updates, needs_global_norm
from ratrain.passes.insert_tied_sum import tied_layers_on, tied_weights, weight_stages
from ratrain.sim.costs import (collective_port_bytes, collective_seconds, crosses_node,
                               dp_group, gather_local_seconds, grad_scatter,
                               layer_view_gather, link_host_seconds, message_path,
                               message_seconds, norm_seconds, norm_share_bytes,
                               prefetch_seconds, sync_finish_seconds, sync_op, sync_seconds,
                               tie_local_bytes, tie_sum_seconds, undo_copy_bytes,
                               update_seconds)
from ratrain.ir.graph import Var
from ratrain.sim.kernels import cold_profile, graph_seconds
from ratrain.sim.simulate import rank_profile
from ratrain.hw.profiles import Profile
from ratrain.passes.insert_recovery import RECOMPUTE_LEVELS as LEVELS
from ratrain.planner.memory_estimate import (StagePlan, neighbours, stage_message_bytes,
                                             stage_plan)

@dataclass(frozen=True)
class KindTimes:
    forward: float                      # seconds of one micro-batch's F of one layer
    backward: float                     # ... its B
    recompute: dict                     # level -> seconds of its REC (none: 0)
    kept: dict                          # level -> residual bytes kept from F to B
    unfused_grads: int                  # gradient elements accumulated by a pass of their
                                        # own (unfused_grad_elements)


def kind_times(kind, profile: dict, precision: str) -> KindTimes:
    """Per-layer seconds and kept bytes of a layer kind on `profile`."""
    fwd = _graph_seconds(kind, "fwd", profile, precision)
    masks = {level: kept_mask(kind, level) for level in LEVELS}
    kept = {level: sum(r.nbytes for r, k in zip(kind.residuals, mask) if k)
            for level, mask in masks.items()}
    recompute = {level: sum(s for s, n in zip(fwd, kind.fwd.nodes) if id(n) in
                            _nodes_rebuilding(kind, mask)) for level, mask in masks.items()}
    return KindTimes(sum(fwd), sum(_graph_seconds(kind, "bwd", profile, precision)),
                     recompute, kept, unfused_grad_elements(kind))


def _graph_seconds(kind, direction: str, profile: dict, precision: str) -> tuple:
    """graph_seconds, between warm and cold by NOTE [estimated residency] on a profile
    with cold costs and a cache size, as the simulator's calls."""
    warm = graph_seconds(kind, direction, profile, precision)
    cold = cold_profile(profile, precision)
    if cold is None or not profile.cache_bytes:
        return warm
    graph = kind.fwd if direction == "fwd" else kind.bwd
    fractions = node_cold_fractions(graph, int(profile.cache_bytes))
    return tuple(w + f * (c - w) for w, c, f in
                 zip(warm, graph_seconds(kind, direction, cold, precision), fractions))


# NOTE [estimated residency]: the simulator decides per call how much of its operands
# the rank's caches still hold (NOTE [cache residency], sim/residency.py) by replaying a
# stage's calls over the arena. The estimate has no arena; it walks one layer's nodes:
# a value touched again within `cache_bytes` of other values is cached; at its first
# touch an activation or cotangent from the layer before (a graph input other than a
# residual) and a value the node writes are cached when they fit, since the rank has
# just written them or reuses freed workspace; parameters and residuals, last touched
# layers ago, are not.
def node_cold_fractions(graph, capacity: int) -> tuple[float, ...]:
    """Per node of a layer `graph`: the fraction of its operand bytes not cached."""
    far = {v.id for v, name in zip(graph.inputs, graph.input_names)  # touched layers ago
           if name.startswith("res")} | {v.id for v in graph.params}
    recent: dict = {}                   # value id -> bytes, least recently touched first
    out = []
    for node in graph.nodes:
        operands = {v.id: v.nbytes for v in (*node.inputs, *node.outputs) if isinstance(v, Var)}
        cold = sum(n for i, n in operands.items()
                   if not _cached(recent, i, n, capacity, i in far))
        out.append(cold / max(sum(operands.values()), 1))
        for i, n in operands.items():
            recent.pop(i, None)
            recent[i] = n
    return tuple(out)


def _cached(recent: dict, value: int, nbytes: int, capacity: int, far: bool) -> bool:
    """Is `value` cached: touched before with less than `capacity` bytes of others
    touched since, or, at its first touch, near (not `far`) and fitting."""
    if value not in recent:
        return not far and nbytes <= capacity
    newer, seen = 0, False
    for i, n in recent.items():
        if seen:
            newer += n
        seen = seen or i == value
    return newer < capacity


def _nodes_rebuilding(kind, mask) -> set:
    """ids of the forward nodes a REC runs to rebuild the residuals `mask` drops (as
    lower.py's REC lowering does)."""
    dropped = {r.id for r, k in zip(kind.residuals, mask) if not k}
    kept = {r.id for r, k in zip(kind.residuals, mask) if k}
    return {id(n) for n in nodes_rebuilding(kind.fwd, dropped, kept)}


class Estimator:
    """Estimates for partitioned Programs on one profile (per-kind times cached)."""

    def __init__(self, profile: dict):
        self.profile = profile
        self._times: dict = {}
        self._ranks: dict = {}

    def rank_profile(self, program) -> dict:
        """The profile one rank of `program` runs on, as the simulator takes it: the
        `threads` entry for its world size (sim/simulate.rank_profile)."""
        world = program.options.world_size
        if world not in self._ranks:
            self._ranks[world] = rank_profile(self.profile, world)
        return self._ranks[world]

    def times(self, program, layer: int) -> KindTimes:
        kind = program.graph.kinds[program.graph.layers[layer].kind]
        profile = self.rank_profile(program)
        key = (id(kind), program.options.precision, profile.rank_threads)
        if key not in self._times:  # the kind is kept alive with its times: ids stay unique
            self._times[key] = (kind, kind_times(kind, profile, program.options.precision))
        return self._times[key][1]

    def stage_plans(self, program) -> list[StagePlan]:
        return [stage_plan(self, program, s) for s in range(program.options.pp)]

    def step_seconds(self, program, plans: list[StagePlan]) -> float:
        """Estimated step time of `program` with its stages' `plans`."""
        stages = [_StageModel(self, program, s, plan) for s, plan in enumerate(plans)]
        return _step(stages, program, self.rank_profile(program))

    def step_and_bound(self, program, plans: list[StagePlan]) -> tuple[float, str]:
        """step_seconds, and what bounds that step (NOTE [bound]): compute, port,
        node-memory or link."""
        stages = [_StageModel(self, program, s, plan) for s, plan in enumerate(plans)]
        profile = self.rank_profile(program)
        return _step(stages, program, profile), step_bound(stages, program, profile)

    def compute_bound(self, program) -> float:
        """A lower bound of the simulated step (the simulator costs the same graph
        nodes): stage s runs M forwards and backwards of its layers, after the first
        micro-batch's forwards on the stages before it and before the last one's
        backwards there."""
        o = program.options
        fb = [(sum(self.times(program, l).forward for l in layers),
               sum(self.times(program, l).backward for l in layers)) for layers in program.stages]
        return max(sum(f + b for f, b in fb[:s]) + o.micro_batches * (fb[s][0] + fb[s][1])
                   for s in range(o.pp))


# ---- time ---------------------------------------------------------------------------------

class _StageModel:
    """Per-micro-batch and per-step seconds of one stage, each from the cost helper the
    simulator charges the same work with (sim/costs.py, sim/calls.py)."""

    def __init__(self, est: Estimator, program, stage: int, plan: StagePlan):
        p, layers = est.rank_profile(program), program.stages[stage]
        self.tied = tied_layers_on(program, stage)  # NOTE [tied weights in the estimate]
        params = [layer_param_count(program, l) for l in layers]
        # gradient accumulation: the ops that make a gradient add it into the fp32
        # gradient as they write it (NOTE [fused gradient accumulation]), the others by an
        # accumulate_grad pass; or reduce-scatter each micro-batch's (costs.grad_scatter),
        # but for a tied layer's, which its TIE sums whole (choose_grad_accumulation)
        scatters = [] if plan.local_grads else [_grad_scatter(program, n) for l, n in
                                                zip(layers, params) if l not in self.tied]
        self.group = dp_group(p, program.options, stage)  # its members per node
        self._add_micro_batch(est, p, program, stage, plan, scatters)
        self._add_step_end(p, program, stage, params, scatters)
        self._add_tie(p, program, stage)

    def _add_micro_batch(self, est, p: dict, program, stage: int, plan: StagePlan,
                         scatters) -> None:
        """Seconds of one micro-batch: its compute, its port time and a message's."""
        o, layers = program.options, program.stages[stage]
        times = [est.times(program, l) for l in layers]
        message, sends = stage_message_bytes(program, stage), neighbours(program, stage)
        self.forward = sum(t.forward for t in times)
        self.backward = sum(t.backward for t in times)
        local = [t for l, t in zip(layers, times) if plan.local_grads or l in self.tied]
        accumulate = sum((itemsize(program) + 8) * t.unfused_grads for t in local) + \
            sum(g.concat + g.add for g in scatters)
        scatter_port = sum(collective_seconds(p, "reduce_scatter", o.dp, g.reduced,
                                              group=self.group) for g in scatters)
        self.recompute = _recompute_per_micro_batch(program, stage, times, plan)
        # see NOTE [link host cost]: messages sent and received, collectives' port bytes twice
        host = link_host_seconds(p, 2 * sends * message + 2 * sum(
            collective_port_bytes(p, "reduce_scatter", o.dp, g.reduced) for g in scatters))
        self.compute = (self.forward + self.backward + self.recompute + host
                        + (accumulate + 2 * sends * message) / p.ddr_bandwidth)
        # a message to a stage on another node goes on the node's port (sim/calls _send)
        across = any(crosses_node(p, o, stage, peer) for peer in (stage - 1, stage + 1)
                     if 0 <= peer < o.pp)
        self.across = across
        self.message = message_seconds(p, message, across)
        self.port = sends * message / message_path(p, across)[1] + scatter_port
        last_scatter = collective_seconds(p, "reduce_scatter", o.dp, scatters[0].reduced,
                                          group=self.group) if scatters else 0.0
        self._add_view_gathers(p, program, layers, scatter_port, last_scatter)

    def _add_step_end(self, p: dict, program, stage: int, params, scatters) -> None:
        """Seconds of the step's end: what is left to reduce after the last B (under
        scatter its last reduce-scatter, of the stage's first layer, else every layer's
        SYNC) and the compute of those SYNCs, the updates, the norm's share and PREF."""
        o, layers = program.options, program.stages[stage]
        synced = [(l, n) for l, n in zip(layers, params) if not scatters or l in self.tied]
        syncs = {l: sync_seconds(p, o, n, stage=stage) for l, n in synced}
        finishes = {l: _sync_compute(p, program, n) for l, n in synced}
        self.sync = sum(syncs.values()) + (collective_seconds(
            p, "reduce_scatter", o.dp, scatters[0].reduced, group=self.group) if scatters else 0.0)
        self.sync_compute = sum(finishes.values())
        updates = {l: _update_seconds(p, program, n) for l, n in zip(layers, params)}
        self.update = sum(updates.values())
        # the tied layers' SYNCs and UPDs wait for the TIE (insert_tied_sum)
        self.tied_sync = sum(syncs.get(l, 0.0) + finishes.get(l, 0.0) for l in self.tied)
        self.tied_update = sum(updates[l] for l in self.tied)
        self.norm_share = 0.0 if commits_updates(o) or not needs_global_norm(o) else \
            sum(_norm_share_bytes(program, n) for n in params) / p.ddr_bandwidth
        self.prefetch = 0.0 if o.zero == 3 else sum(
            prefetch_seconds(program, p, l, gathers_in_place(program, l)) for l in layers)

    def _add_tie(self, p: dict, program, stage: int) -> None:
        """See NOTE [tied weights in the estimate]: the stage's TIE, as the simulator's
        tie_sum calls cost it: adding the stage's copies of each tied gradient (compute),
        the blocking all-reduce with the other tie stages (`tie_sum`, the same on every
        tie stage) and the host's share of its port bytes (NOTE [link host cost])."""
        self.tie_local = self.tie_sum = self.tie_host = 0.0
        if not self.tied:
            return
        for w in tied_weights(program):
            copies = sum(program.stage_of_layer(l) == stage for l in w.layers)
            nbytes = 4 * program.graph.param_types()[w.name].size
            members = len(weight_stages(program, w))
            if not copies:
                continue
            self.tie_local += tie_local_bytes(copies, nbytes) / p.ddr_bandwidth
            if members > 1:
                self.tie_sum += tie_sum_seconds(p, nbytes, members)
                self.tie_host += link_host_seconds(
                    p, 2 * collective_port_bytes(p, "allreduce", members, nbytes))

    def _add_view_gathers(self, p: dict, program, layers, scatter_port: float,
                          last_scatter: float) -> None:
        """See NOTE [ZeRO-3 lifecycle]: every micro-batch gathers each layer's view for its F
        and again for its B (shared gathers ignored): on the port, overlapping compute
        when prefetched (but for the wait behind the B's last reduce-scatter,
        `last_scatter`), else waited for before each use (NOTE [gathers behind
        scatters]); the shard casts and the copies into the views in DDR."""
        o = program.options
        if o.zero != 3:
            return
        gathers = [layer_view_gather(program, l, gathers_in_place(program, l)) for l in layers]
        port = 2 * sum(collective_seconds(p, "allgather", o.dp, g.gathered, group=self.group)
                       for g in gathers)
        self.compute += 2 * sum(gather_local_seconds(p, o.precision, g) for g in gathers) + \
            link_host_seconds(p, 4 * sum(collective_port_bytes(p, "allgather", o.dp, g.gathered)
                                         for g in gathers))
        if o.zero3_prefetch == 0:
            self.compute += port + scatter_port
        else:
            self.port += port
            self.compute += last_scatter


# NOTE [gathers behind scatters]: a rank's DP collectives share one FIFO channel of its
# port (sim/replay.py), so a ZeRO-3 gather at use (zero3_prefetch 0) issued when a layer's
# B ends queues behind the reduce-scatter that B has just started (gradients scattered
# each micro-batch), and the next layer waits for both. Charged as compute: every
# micro-batch's reduce-scatters as well as its gathers (13B on 256 mt3000 clusters: 8
# micro-batches of 2 simulated 960 s, estimated 850 s without this, 970 s with it).
# Gathers issued ahead (zero3_prefetch > 0) overlap compute, but the next F's first gather
# still queues behind the reduce-scatter of the stage's first layer, which its B starts
# last: that one is charged as compute each micro-batch (LLaMA-2-7B on 768 mt3000
# clusters, pp 3 x dp 256, ZeRO 3, scattered: simulated 116.2 s, estimated 110.2 s
# without it, 113.9 s with it; the simulated F's waited 0.32 s each for their gathers).

def itemsize(program) -> int:
    """Bytes of one element of the model's dtype (its views, gradients, messages)."""
    return np.dtype(program.graph.dtype).itemsize


def _grad_scatter(program, params: int):
    """costs.grad_scatter of one micro-batch's gradients of a layer of `params`."""
    return grad_scatter(itemsize(program) * params, 4 * params,
                        4 * shard_elements(params, program, True))


def _sync_compute(profile: dict, program, params: int) -> float:
    """Compute a layer's SYNC costs its rank (sim/calls.py _grad_sync): the collective's
    finish and NOTE [link host cost] on its port bytes, sent and received."""
    o = program.options
    out = 4 * shard_elements(params, program, o.zero >= 2)
    port = collective_port_bytes(profile, sync_op(o), o.dp, 4 * params)
    return sync_finish_seconds(profile, o.precision, out) + link_host_seconds(profile, 2 * port)


def _update_seconds(profile: dict, program, params: int) -> float:
    """A layer's UPD as the simulator's adamw call costs it: the update, and under the
    commit rule the norm share and the undo copies (NOTE [commit rule])."""
    o = program.options
    elements = shard_elements(params, program, o.zero >= 1)
    seconds = update_seconds(profile, elements, o.precision)
    if commits_updates(o):
        seconds += (_norm_share_bytes(program, params) + undo_copy_bytes(elements)) \
            / profile.ddr_bandwidth
    return seconds


def _norm_share_bytes(program, params: int) -> float:
    """costs.norm_share_bytes of a layer's gradient as the update reads it: its shard
    under ZeRO 2-3, of which it owns all, else the full gradient, of which 1/dp."""
    o = program.options
    grad = 4 * shard_elements(params, program, o.zero >= 2)
    return norm_share_bytes(grad if o.zero >= 2 else grad / o.dp, grad, o.precision == "fp16")


def _recompute_per_micro_batch(program, stage: int, times, plan: StagePlan) -> float:
    """Average REC seconds per micro-batch: every decoder pair at the plan's level but
    the `lowered` ones, one level lower (NOTE [auto estimate])."""
    decoders = [t for l, t in zip(program.stages[stage], times)
                if program.graph.layers[l].kind == "decoder"]
    if not decoders or plan.level == "none":
        return 0.0
    m = program.options.micro_batches
    per_pair = lambda level: sum(t.recompute[level] for t in decoders) / len(decoders)
    lower = LEVELS[LEVELS.index(plan.level) - 1]
    pairs = len(decoders) * m
    return ((pairs - plan.lowered) * per_pair(plan.level) + plan.lowered * per_pair(lower)) / m


# NOTE [bound]: the table's `bound` column says which resource the estimate's busiest
# stage waits on. Per step a stage computes M x compute + update seconds and keeps its
# links busy M x port + sync seconds, and a tie stage its TIE's all-reduce (the 1F1B slot
# of _step is the larger of compute and port per micro-batch; the sync follows the last
# backward). The stage with the most of either decides: compute where its compute is the
# larger, else the link its traffic takes: the node's port when its DP group spans nodes,
# its pipeline messages cross nodes (NOTE [placement]) or it sums a tied weight with
# another stage (costed on the port, sim/costs.tie_sum_seconds), node memory when it all
# stays within a node of
# several ranks (node-memory: NOTE [node memory], hw/topology.py), else its own link.
def step_bound(stages: list[_StageModel], program, profile: dict) -> str:
    """NOTE [bound] of the stages' estimate."""
    m = program.options.micro_batches
    work = lambda s: m * s.compute + s.update
    traffic = lambda s: m * s.port + s.sync + s.tie_sum
    busiest = max(stages, key=lambda s: max(work(s), traffic(s)))
    if work(busiest) >= traffic(busiest):
        return "compute"
    if len(busiest.group) > 1 or busiest.across or busiest.tie_sum:
        return "port"
    return "node-memory" if Profile.of(profile).ranks_per_node > 1 else "link"


def _step(stages: list[_StageModel], program, profile: dict) -> float:
    """1F1B: a micro-batch through every stage, M - 1 bottleneck slots, then the tail."""
    o = program.options
    first = sum(s.compute + s.message for s in stages)
    slot = max(max(s.compute, s.port) for s in stages)
    compute_end = first + (o.micro_batches - 1) * slot
    # stage s's last B ends before stages s-1..0 have run theirs
    last_backward = [compute_end - sum(t.backward + t.message for t in stages[:s])
                     for s in range(len(stages))]
    # every SYNC but the tied layers', which follow the TIE
    synced = [end + s.sync + s.sync_compute - s.tied_sync for end, s in zip(last_backward, stages)]
    tail = max if o.schedule == "ratrain" else (lambda update, prefetch: update + prefetch)
    if needs_global_norm(o) and not commits_updates(o):  # the TIE just before the NORM
        synced = _past_tie(stages, synced)
        world = norm_seconds(profile, o)
        return max(a + s.norm_share for a, s in zip(synced, stages)) + world + \
            max(tail(s.update, s.prefetch) for s in stages)
    # the TIE follows the other layers' UPDs; the tied layers' UPDs and the PREFs follow it
    ready = [a + s.update - s.tied_update for a, s in zip(synced, stages)]
    ends = [end + tail(s.tied_update, s.prefetch) if s.tied else a + tail(s.update, s.prefetch)
            for a, end, s in zip(synced, _past_tie(stages, ready), stages)]
    if commits_updates(o):  # updates before the norm, which ends the step (NOTE [commit rule])
        return max(ends) + norm_seconds(profile, o)
    return max(ends)


# NOTE [tied weights in the estimate]: a stage holding a layer that binds a tied weight
# (NOTE [tied weights], insert_tied_sum.py) runs a TIE after its other layers' UPDs (or,
# when the NORM precedes the UPDs, right before the NORM), then its tied layers' SYNCs
# and UPDs. The TIE adds the stage's copies of the gradient and all-reduces the sum with
# the other tie stages of its replica, blocking: it ends on every tie stage the
# all-reduce's seconds after the last of them has reached it and added its copies. The
# estimate charges exactly that (sim/costs.tie_local_bytes and tie_sum_seconds, as the
# simulator's tie_sum call). Without it, llama3.2-1b on 4 mt3000 nodes of 8 ranks with
# 1.25 GB/s ports, DP-major (the embedding's 1 GB fp32 gradient summed between stage 0
# and the last stage over their nodes' ports, 0.84 s), was estimated 38-41% short of
# its simulated step. A tied layer's gradient is always accumulated whole (never
# reduce-scattered per micro-batch: choose_grad_accumulation), so it keeps its SYNC.
def _past_tie(stages: list[_StageModel], ready: list[float]) -> list[float]:
    """See NOTE [tied weights in the estimate]: when each tie stage is past its TIE and its
    tied layers' SYNCs, the TIE starting on every tie stage once the last has reached it
    (`ready`) and added its copies; other stages' `ready` as given."""
    tie = [(r + s.tie_local, s.tie_sum) for r, s in zip(ready, stages) if s.tied]
    if not tie:
        return ready
    end = max(r for r, _ in tie) + max(seconds for _, seconds in tie)
    return [end + s.tie_host + s.tied_sync if s.tied else r for r, s in zip(ready, stages)]
