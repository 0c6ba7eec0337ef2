"""Seconds of a compute task (F, B, BL, W, REC) on a rank's profile: its kernels' node costs.

The one definition of a compute task's seconds (NOTE [a compute task's seconds]): the
simulator (calls.ProfileCosts) charges each IR call of a lowered task from the tables
here, and the passes that weigh time (partition_stages, zb1's W order, where recovery
runs) ask the same sums before lowering, through Program.cost_model (costs.task_cost_model).
"""
from __future__ import annotations

from ratrain.ir.tasks import Kind, Task
from ratrain.ir.vocab import stage_embed_layer, stage_vocab_layer
from ratrain.passes.layer_buffers import is_split, recovers_in_backward
from ratrain.passes.residuals import rebuild_node_indices
from ratrain.sim.kernels import graph_seconds

COMPUTE_KINDS = (Kind.F, Kind.B, Kind.BL, Kind.W, Kind.REC, Kind.S, Kind.T, Kind.E, Kind.G)


# NOTE [a compute task's seconds]: a compute task costs the sum of the seconds of the
# graph nodes its lowered IR calls run (passes/lower.py), each node kernels.node_seconds
# on the rank's profile (kernels.rank_profile) over its stage's speed: F every forward
# node of the stage's layers; B (BL: one layer of it) every node of each layer's backward,
# or under zb1 of its input part, and under backward-time recovery first the forward nodes
# that rebuild the layer (residuals.rebuild_node_indices); W[L] the weight part of L's
# backward (a split node its share of the whole one, kernels.graph_seconds); REC the
# rebuilding nodes; S and T the forward and backward of the stage's shard of a
# vocabulary-parallel head (see NOTE [vocabulary-parallel head]: the fused cross-entropy's
# kernels on the shard's rows), E and G those of its shard of the embedding (see NOTE
# [vocabulary-parallel embedding]: the embedding's kernels on the shard's rows). The
# simulator charges those calls from the same tables (KernelTables), so for every compute
# task the passes' cost is the sum of ProfileCosts.call_charges over its IR calls on a
# profile without cold costs (tested, tests/sim/test_task_seconds.py). What the passes
# cannot know before lowering and memory planning stays the simulator's alone: (1) the
# runtime calls a compute task also makes (load_ids, the input copy, the loss cotangent's
# fill, accumulate_grad, W operand copies: DDR bytes of arena slots); (2) the cold part of
# a call's cost, which needs the arena's offsets (NOTE [cache residency]); (3) a traced
# profile's per-call overhead (NOTE [traced rows] 4); (4) the kernel slowdown while
# transfers run (NOTE [kernels beside collectives]). The passes compare schedules and
# placements of the same kernels, which these leave in the same order.

class KernelTables:
    """Seconds of every node of each layer kind's graphs in `direction` (fwd, bwd,
    bwd_input, bwd_weight: kernels.graph_seconds) on one rank's `profile`, computed once."""

    def __init__(self, graph, profile: dict, precision: str):
        self.graph, self.profile, self.precision = graph, profile, precision
        self._seconds: dict = {}

    def nodes(self, kind: str, direction: str) -> tuple[float, ...]:
        key = (kind, direction)
        if key not in self._seconds:
            self._seconds[key] = graph_seconds(self.graph.kinds[kind], direction,
                                               self.profile, self.precision)
        return self._seconds[key]

    def layer(self, layer: int, direction: str) -> float:
        """All of `layer`'s nodes in `direction`, one micro-batch, at speed 1."""
        return sum(self.nodes(self.graph.layers[layer].kind, direction))

    def rebuild(self, layer: int, mode: str) -> float:
        """The forward nodes that rebuild `layer`'s residuals dropped under `mode`."""
        kind = self.graph.layers[layer].kind
        seconds = self.nodes(kind, "fwd")
        return sum(seconds[i] for i in rebuild_node_indices(self.graph.kinds[kind], mode))


def backward_direction(program) -> str:
    """The graph a B runs of each layer: the whole backward, or zb1's input part."""
    return "bwd_input" if is_split(program) else "bwd"


class TaskSeconds:
    """Seconds of `program`'s compute tasks on one rank's `profile` (NOTE [a compute
    task's seconds]); `layer_pass` is what partition_stages balances."""

    def __init__(self, program, profile: dict):
        self.program = program
        self.tables = KernelTables(program.graph, profile, program.options.precision)
        self.speeds = program.options.stage_speeds or (1.0,) * program.options.pp

    def __call__(self, task: Task) -> float:
        return self._at_speed_1(task) / self.speeds[task.stage]

    def layer_pass(self, layer: int) -> float:
        """F and B of one micro-batch through `layer` (the whole backward, whatever the
        schedule: zb1's W's run it too), at speed 1."""
        return self.tables.layer(layer, "fwd") + self.tables.layer(layer, "bwd")

    def _at_speed_1(self, task: Task) -> float:
        p, t = self.program, self.tables
        if task.kind == Kind.F:
            return sum(t.layer(l, "fwd") for l in p.stages[task.stage])
        if task.kind == Kind.B:
            return sum(self._backward(task, l) for l in p.stages[task.stage])
        if task.kind == Kind.BL:
            return self._backward(task, task.layer)
        if task.kind == Kind.W:
            return t.layer(task.layer, "bwd_weight")
        if task.kind == Kind.REC:
            return t.rebuild(task.layer, p.recompute.get((task.layer, task.micro_batch), "full"))
        if task.kind in (Kind.S, Kind.T):  # the stage's shard's cross-entropy, forward or
            # backward (NOTE [vocabulary-parallel head])
            return t.layer(stage_vocab_layer(p, task.stage), "fwd" if task.kind == Kind.S
                           else "bwd")
        if task.kind in (Kind.E, Kind.G):  # the stage's shard's embedding lookup or its
            # backward (NOTE [vocabulary-parallel embedding])
            return t.layer(stage_embed_layer(p, task.stage), "fwd" if task.kind == Kind.E
                           else "bwd")
        raise ValueError(f"{task}: not a compute task ({', '.join(map(str, COMPUTE_KINDS))})")

    def _backward(self, task: Task, layer: int) -> float:
        """One layer's part of a B: its backward (zb1: input part), after rebuilding it
        where B recovers (NOTE [backward-time recovery])."""
        p, m = self.program, task.micro_batch
        seconds = self.tables.layer(layer, backward_direction(p))
        if (layer, m) in p.recompute and recovers_in_backward(p, task.stage, m):
            seconds += self.tables.rebuild(layer, p.recompute[(layer, m)])
        return seconds
