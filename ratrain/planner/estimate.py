"""Closed-form memory and step-time estimates of a partitioned candidate.

The planner compiles and simulates only the few candidates these estimates rank best (a
70B program takes ~25 s to compile). Memory follows what plan_memory will see (the
persistent state of buffers.py, gradient buffers, activations in flight, one
micro-batch's recomputed residuals, messages, the backward workspace) and the choices
choose_grad_accumulation and insert_recovery(auto) will make. Time reuses the
simulator's per-node roofline (sim/kernels.py) and the one cost model's collective,
update and cast costs (sim/costs.py) on a 1F1B timeline. Reported step times are the
simulator's; this orders the search.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ratrain.passes.buffers import (CATEGORIES, backward_workspace, gathers_in_place,
                                    layer_param_count, message_bytes, persistent_buffers,
                                    recovers_in_backward, shard_elements,
                                    unfused_grad_elements, undo_buffer)
from ratrain.passes.residuals import kept_mask, nodes_rebuilding
from ratrain.passes.insert_update import commits_updates, needs_global_norm
from ratrain.passes.partition_stages import in_flight_micro_batches
from ratrain.sim.costs import (collective_seconds, dp_group, local_params, message_seconds,
                               norm_seconds, sync_seconds, update_bytes, view_cast_bytes,
                               view_gather)
from ratrain.sim.kernels import graph_seconds

LEVELS = ("none", "selective", "full")  # recompute levels, least recompute first


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
    fwd = graph_seconds(kind, "fwd", profile, precision)
    masks = {level: kept_mask(kind, level) for level in LEVELS}
    kept = {level: sum(r.nbytes for r, k in zip(kind.residuals, mask) if k)
            for level, mask in masks.items()}
    recompute = {level: sum(s for s, n in zip(fwd, kind.fwd.nodes) if id(n) in
                            _nodes_rebuilding(kind, mask)) for level, mask in masks.items()}
    return KindTimes(sum(fwd), sum(graph_seconds(kind, "bwd", profile, precision)),
                     recompute, kept, unfused_grad_elements(kind))


def _nodes_rebuilding(kind, mask) -> set:
    """ids of the forward nodes a REC runs to rebuild the residuals `mask` drops (as
    lower.py's REC lowering does)."""
    dropped = {r.id for r, k in zip(kind.residuals, mask) if not k}
    kept = {r.id for r, k in zip(kind.residuals, mask) if k}
    return {id(n) for n in nodes_rebuilding(kind.fwd, dropped, kept)}


@dataclass(frozen=True)
class StagePlan:
    local_grads: bool                   # full fp32 gradients (else reduce-scattered shards)
    level: str                          # recompute level of most (layer, mb) pairs
    lowered: int                        # pairs of the last window kept one level lower
    need: dict                          # estimated bytes at the peak, by category


class Estimator:
    """Estimates for partitioned Programs on one profile (per-kind times cached)."""

    def __init__(self, profile: dict):
        self.profile = profile
        self._times: dict = {}

    def times(self, program, layer: int) -> KindTimes:
        kind = program.graph.kinds[program.graph.layers[layer].kind]
        key = (id(kind), program.options.precision)
        if key not in self._times:  # the kind is kept alive with its times: ids stay unique
            self._times[key] = (kind, kind_times(kind, self.profile, program.options.precision))
        return self._times[key][1]

    def stage_plans(self, program) -> list[StagePlan]:
        return [_stage_plan(self, program, s) for s in range(program.options.pp)]

    def step_seconds(self, program, plans: list[StagePlan]) -> float:
        """Estimated step time of `program` with its stages' `plans`."""
        stages = [_StageModel(self, program, s, plan) for s, plan in enumerate(plans)]
        return _step(stages, program, self.profile)

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


# ---- memory -------------------------------------------------------------------------------

def stage_bytes(est: Estimator, program, stage: int, level: str, local: bool) -> dict[str, int]:
    """Bytes of the stage at its peak, by plan_memory's CATEGORIES, with every decoder
    pair recomputed at `level` and full (`local`) or sharded fp32 gradients."""
    layers = program.stages[stage]
    need = dict.fromkeys(CATEGORIES, 0)
    for b in persistent_buffers(program, stage):
        need[b.category] += b.nbytes
    need["grads"] = sum(4 * shard_elements(layer_param_count(program, l), program, not local)
                        for l in layers)
    decoder = [program.graph.layers[l].kind == "decoder" for l in layers]
    times = [est.times(program, l) for l in layers]
    kept = sum(t.kept[level if d else "none"] for t, d in zip(times, decoder))
    if program.options.recompute == "auto":  # leaves to B what FSR cannot fit
        program = replace(program, backward_recovery=frozenset(  # NOTE [where recovery runs]
            (stage, m) for m in range(program.options.micro_batches)))
    in_backward = recovers_in_backward(program, stage, 0)  # NOTE [backward-time recovery]
    rebuilt = 0 if in_backward else \
        sum(t.kept["none"] - t.kept[level] for t, d in zip(times, decoder) if d)
    need["activations"] = in_flight_micro_batches(program, stage) * kept + rebuilt
    # at the peak: the message received, the one sent, and a cotangent posted or sent back
    neighbours = _neighbours(program, stage)
    need["comm"] = (1 + neighbours) * _message_bytes(program, stage) if neighbours else 0
    scatter = frozenset() if local else frozenset(layers)  # scattered grads stay in ws
    modes = {l: level for l, d in zip(layers, decoder) if d and level != "none"}
    need["workspace"] = backward_workspace(replace(program, scatter_grads=scatter), stage, 0,
                                           modes)[1]  # the modes count only in backward
    return max(need, _sync_need(program, stage, need, local, kept + rebuilt),
               _commit_need(program, stage, need), key=total)


def _commit_need(program, stage: int, need: dict) -> dict:
    """The bytes at the NORM under the commit rule (NOTE [commit rule]): the persistent
    state, every gradient the updates read and every layer's undo copy."""
    if not commits_updates(program.options):
        return need
    o, layers = program.options, program.stages[stage]
    counts = [layer_param_count(program, l) for l in layers]
    persistent = {c: b for c, b in need.items() if c in ("params", "optimizer", "views")}
    grads = sum(4 * shard_elements(n, program, o.zero >= 2) for n in counts)
    undo = sum(undo_buffer(program, l).nbytes for l in layers)
    return {**dict.fromkeys(CATEGORIES, 0), **persistent, "grads": grads,
            "optimizer": persistent.get("optimizer", 0) + undo}


def _sync_need(program, stage: int, need: dict, local: bool, one_micro_batch: int) -> dict:
    """The bytes while ZeRO-2 SYNCs reduce-scatter full gradients (activations and
    workspaces are gone by then, and the B workspace can be the smaller peak): during
    the k-th SYNC (reverse layer order) the gradients of the layers not yet synced and
    the shards of those synced, not yet consumed by their UPD, are alive. In ratrain
    mode every shard exists from the step's last B on (buffers._syncs_inside_backward),
    with that B's activations (`one_micro_batch`), messages and workspace."""
    if program.options.zero < 2 or not local:
        return need
    counts = [layer_param_count(program, l) for l in reversed(program.stages[stage])]
    full = [4 * n for n in counts]
    shard = [4 * shard_elements(n, program, True) for n in counts]
    persistent = {c: b for c, b in need.items() if c in ("params", "optimizer", "views")}
    if program.options.schedule == "ratrain":
        return {**dict.fromkeys(CATEGORIES, 0), **persistent, "grads": sum(full) + sum(shard),
                "activations": one_micro_batch, "workspace": need["workspace"],
                "comm": _neighbours(program, stage) * _message_bytes(program, stage)}
    grads = max(sum(full[k:]) + sum(shard[:k + 1]) for k in range(len(full)))
    return {**dict.fromkeys(CATEGORIES, 0), **persistent, "grads": grads}


def _neighbours(program, stage: int) -> int:
    return (stage > 0) + (stage < program.options.pp - 1)


def _message_bytes(program, stage: int) -> int:
    """One activation or cotangent message of the stage: its output, or for the last
    stage (whose output is the loss) the previous stage's."""
    if program.options.pp == 1:
        return 0
    return message_bytes(program, stage if stage < program.options.pp - 1 else stage - 1)


def _stage_plan(est: Estimator, program, stage: int) -> StagePlan:
    """What choose_grad_accumulation and insert_recovery will likely pick, and the peak."""
    o = program.options
    budget = np.inf if o.budget is None else o.budget
    local = o.zero < 2 or o.grad_accum == "local" or (
        o.grad_accum == "auto" and total(stage_bytes(est, program, stage, "full", True)) <= budget)
    need = lambda level: stage_bytes(est, program, stage, level, local)
    if o.recompute != "auto":
        return StagePlan(local, o.recompute, 0, need(o.recompute))
    level = next((lv for lv in LEVELS if total(need(lv)) <= budget), "full")
    if level == "none":
        return StagePlan(local, level, 0, need(level))
    return _auto_plan(est, program, stage, local, level, need(level))


def total(need: dict) -> int:
    return sum(need.values())


# NOTE [auto estimate]: insert_recovery's auto escalates (layer, micro-batch) pairs in
# micro-batch-major order, first to selective, then to full with the rest selective. The
# peak sits in the last window of min(P - s, M) micro-batches in flight, whose pairs come
# last in that order; so the first level whose all-pairs estimate fits is used for every
# pair but the k of the last window that the remaining headroom keeps one level lower.
def _auto_plan(est, program, stage: int, local: bool, level: str, need: dict) -> StagePlan:
    o, layers = program.options, program.stages[stage]
    decoders = [est.times(program, l) for l in layers if program.graph.layers[l].kind == "decoder"]
    lower = LEVELS[LEVELS.index(level) - 1]
    extra = sum(t.kept[lower] - t.kept[level] for t in decoders) / max(len(decoders), 1)
    window = in_flight_micro_batches(program, stage) * len(decoders)
    headroom = o.budget - total(need)
    lowered = min(window, int(headroom // extra)) if extra > 0 and headroom >= 0 else 0
    return StagePlan(local, level, max(lowered, 0), need)


# ---- time ---------------------------------------------------------------------------------

class _StageModel:
    """Per-micro-batch and per-step seconds of one stage."""

    def __init__(self, est: Estimator, program, stage: int, plan: StagePlan):
        p, o = est.profile, program.options
        layers = program.stages[stage]
        times = [est.times(program, l) for l in layers]
        params = [layer_param_count(program, l) for l in layers]
        itemsize = np.dtype(program.graph.dtype).itemsize
        ddr, bandwidth = p["ddr_bandwidth"], p["link_bandwidth"]
        group = dp_group(p, o, stage)  # its members per node (NOTE [node memory])
        reduce = lambda n: collective_seconds(p, "reduce_scatter", o.dp, 4 * n, group=group)
        message, sends = _message_bytes(program, stage), _neighbours(program, stage)
        self.forward = sum(t.forward for t in times)
        self.backward = sum(t.backward for t in times)
        # gradient accumulation: the ops that make a gradient add it into the fp32
        # gradient as they write it (NOTE [fused gradient accumulation]), the others by an
        # accumulate_grad pass; or concatenate, reduce-scatter and add into the shard
        # (sim/calls.py)
        accumulate = sum((itemsize + 8) * t.unfused_grads if plan.local_grads else
                         (itemsize + 4) * n + 12 * n / o.dp
                         for n, t in zip(params, times)) / ddr
        self.recompute = _recompute_per_micro_batch(program, stage, times, plan)
        self.compute = (self.forward + self.backward + self.recompute + accumulate
                        + 2 * sends * message / ddr)
        self.port = sends * message / bandwidth + (0.0 if plan.local_grads else
                                                   sum(map(reduce, params)))
        self.message = message_seconds(p, message)
        self._add_view_gathers(p, program, layers)
        # what is left to reduce after the last B: under scatter its last reduce-scatter
        # (the stage's first layer), else every layer's SYNC
        self.sync = (reduce(params[0]) if not plan.local_grads else
                     sum(sync_seconds(p, o, n, stage=stage) for n in params))
        self.update = sum(update_bytes(local_params(n, o)) for n in params) / ddr
        self.prefetch = 0.0 if o.zero == 3 else \
            sum(sum(_view_gather_seconds(p, program, l, gathers_in_place(program, l)))
                if o.zero >= 1 else view_cast_bytes(n, itemsize) / ddr
                for l, n in zip(layers, params))

    def _add_view_gathers(self, p: dict, program, layers) -> None:
        """NOTE [ZeRO-3 lifecycle]: every micro-batch gathers each layer's view for its F
        and again for its B (shared gathers ignored): on the port, overlapping compute
        when prefetched, else waited for before each use; the shard casts and the copies
        into the views in DDR."""
        o = program.options
        if o.zero != 3:
            return
        ddr, port = zip(*(_view_gather_seconds(p, program, l, in_place=False) for l in layers))
        gathers = 2 * sum(port)
        self.compute += 2 * sum(ddr)
        if o.zero3_prefetch == 0:
            self.compute += gathers
        else:
            self.port += gathers


def _view_gather_seconds(profile: dict, program, layer: int, in_place: bool):
    """(DDR seconds, port seconds) of building the layer's view from the DP group's
    master shards (costs.view_gather, as the simulator's PREF and gather_view)."""
    itemsize = np.dtype(program.graph.dtype).itemsize
    params = layer_param_count(program, layer)
    g = view_gather(shard_elements(params, program, True), itemsize, program.options.dp,
                    itemsize * params, in_place)
    return ((g.cast + g.unpack) / profile["ddr_bandwidth"],
            collective_seconds(profile, "allgather", program.options.dp, g.gathered,
                               group=dp_group(profile, program.options,
                                              program.stage_of_layer(layer))))


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


def _step(stages: list[_StageModel], program, profile: dict) -> float:
    """1F1B: a micro-batch through every stage, M - 1 bottleneck slots, then the tail."""
    o = program.options
    first = sum(s.compute + s.message for s in stages)
    slot = max(max(s.compute, s.port) for s in stages)
    compute_end = first + (o.micro_batches - 1) * slot
    # stage s's last B ends before stages s-1..0 have run theirs
    last_backward = [compute_end - sum(t.backward + t.message for t in stages[:s])
                     for s in range(len(stages))]
    synced = [end + s.sync for end, s in zip(last_backward, stages)]
    if o.schedule == "ratrain":
        tails = [max(s.update, s.prefetch) for s in stages]
    else:
        tails = [s.update + s.prefetch for s in stages]
    if commits_updates(o):  # updates before the norm, which ends the step (NOTE [commit rule])
        return max(a + b for a, b in zip(synced, tails)) + norm_seconds(profile, o)
    if needs_global_norm(o):
        world = norm_seconds(profile, o)
        return max(synced) + world + max(tails)
    return max(a + b for a, b in zip(synced, tails))
