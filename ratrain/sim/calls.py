"""ProfileCosts: the steps of every task of a lowered Program on a hardware profile.

Walks each task's lowered calls (passes/lower.py) as the runtime runs them (rt/calls.py,
rt/executor.py): IR ops cost their node's roofline (kernels.py), runtime calls the DDR
bytes they move, sends and DP collectives become transfers on the rank's port, and a call
first waits for the in-flight collectives on the buffers it touches (the runtime's hazard
rule), so the overlap is the runtime's, no more.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from ratrain.hw.profiles import Profile
from ratrain.ir.buffers import is_grad_shard
from ratrain.ir.rules import lookup_rule
from ratrain.ir.tasks import GRAD_PRODUCERS, Kind, counterpart
from ratrain.passes.layer_buffers import is_split
from ratrain.program_format.call_ops import (CallOp, asynchronous_ops, is_call_op,
                                             registered, untraced_ops)
from ratrain.program_format.lowered import RECOMPUTE_TAG, Slot, rollback_only
from ratrain.sim.collectives import collective_cost
from ratrain.sim.costs import (collective_timed, crosses_node, dp_group,
                               gather_start_seconds, grad_scatter, link_host_seconds,
                               memory_seconds, message_path, norm_seconds, norm_share_bytes,
                               paced_by_replicas, stage_paces, scatter_bytes, slot_elements,
                               straggle_rate, sync_finish_seconds, tie_local_bytes,
                               tie_sum_seconds, undo_copy_bytes, update_seconds, view_gather)
from ratrain.sim.kernels import (cold_profile, key_text, op_speed_factor, traced_seconds,
                                 whole_node_key)
from ratrain.sim.residency import cold_fractions
from ratrain.sim.task_seconds import KernelTables
from ratrain.sim.embed_steps import EMBED_STEPS, waits_for_lookups
from ratrain.sim.vocab_steps import VOCAB_STEPS, waits_for_hidden_grad
from ratrain.sim.steps import (Compute, Post, Recv, Send, Start, Step, TieSum, Touch,
                               WorldSum, posted_receive, send_channel)

ASYNC_CALLS = asynchronous_ops()     # NOTE [one table of call ops]


# runtime calls whose Compute steps are not what their traced run time holds: a posted
# receive and a send's copy run beside transfers; a redo never runs in a committed step
UNTRACED_RUNTIME_CALLS = untraced_ops()


# where in the step a call runs, or a value it writes, not how much it computes
PLACE_PARAMS = ("layers", "use", "micro_batch", "value")


def runtime_key(call, precision: str) -> tuple:
    """A runtime call's traced-row key (NOTE [traced rows]): precision, op, params and
    the dtype and shape of every slot it reads and writes; its arena places left out, so
    a call of the same shapes in another program is the same row."""
    slots = ";".join(f"{s.dtype}{list(s.shape)}" for s in _slots(call.inputs) + list(call.outputs))
    params = ",".join(f"{k}={v}" for k, v in call.params if k not in PLACE_PARAMS)
    return precision, call.op, params, slots


def is_kernel_call(call) -> bool:
    """Does `call` run a graph node (an IR op), costed by its node (sim/kernels.py)?
    Else it is a runtime call (rt/calls.py)."""
    return not is_call_op(call.op) and lookup_rule(call.op) is not None


def _moves_data(call, steps) -> bool:
    """Whether a runtime call with these charged steps is more than compute: its run time
    is no traced row's (NOTE [traced rows] 2, 7)."""
    return call.op in UNTRACED_RUNTIME_CALLS or not all(isinstance(s, Compute) for s in steps)


def _slots(values) -> list:
    return [v for v in values if isinstance(v, Slot)]


def _moved_bytes(call) -> int:
    """A memory-bound runtime call reads its inputs and writes its outputs once;
    accumulating into a gradient (`first` false) also reads the target."""
    reads = sum(s.nbytes for s in _slots(call.inputs))
    writes = sum(s.nbytes for s in call.outputs)
    if call.op == CallOp.ACCUMULATE_GRAD and not dict(call.params)["first"]:
        reads += writes
    return reads + writes


def _merged(steps):
    """Adjacent Compute steps as one."""
    pending = 0.0
    for step in steps:
        if isinstance(step, Compute):
            pending += step.seconds
            continue
        if pending:
            yield Compute(pending)
            pending = 0.0
        yield step
    if pending:
        yield Compute(pending)


# NOTE [link host cost]: on MT-3000 the interconnect moves bytes by DMA, but a rank whose
# link is a TCP socket (the test cluster, ratrain/cluster) pays for every byte it sends or
# receives on its own core: the TCP stack, the copies into and out of socket buffers and
# the MPI progress that drives them. That CPU time is invisible where the rank would wait
# for the link anyway (a baseline step's end), but when a gradient all-reduce overlaps the
# backward it slows the backward: measured on the 61.67 MB/s cluster, a DP=2 ratrain
# backward took 8% longer than the baseline's, and the simulator that ignored it predicted
# the step 7-19% short. A profile's `link_host_cost` (seconds per byte; 0 or absent
# for DMA links) charges it as compute right where the transfer starts: a send's bytes after
# the send, a received message's after its wait, and a collective's port bytes twice (sent,
# and as many received) after its start. `ratrain cluster probe` measures it (GEMM slices
# timed alone and with all-reduces streaming); `ratrain simulate --cluster NAME` uses it.

class ProfileCosts:
    """Steps of each task of a lowered `program` on `profile` (see module docstring)."""

    def __init__(self, program, profile: dict, algorithm: str | None = None):
        if program.lowered is None:
            raise ValueError("ProfileCosts needs a lowered program (the whole pass pipeline)")
        o, profile = program.options, Profile.of(profile)
        self.program, self.profile, self.options = program, profile, o
        self.algorithm = algorithm or profile.collective_algorithm
        self.speeds = o.stage_speeds or (1.0,) * o.pp
        # each stage's slowdown, paced by the others, in every rotation the simulator
        # replays (NOTE [rank spread]); these costs charge the first (`paced` the others)
        self.rotations = stage_paces(profile, o.pp, o.dp)
        self.paces = self.rotations[0]
        self.straggles = not paced_by_replicas(profile, o.pp, o.dp)
        self.ddr = profile.ddr_bandwidth
        self.host_cost = float(profile.link_host_cost)  # NOTE [link host cost]
        self._calls = {s: {lt.task: lt.calls for lt in lowered}
                       for s, lowered in program.lowered.items()}
        self._async = {s.buffer for lowered in program.lowered.values() for lt in lowered
                       for c in lt.calls if c.op in ASYNC_CALLS
                       for s in _slots(c.inputs) + list(c.outputs)}
        self._tables: dict = {}
        self._warm = KernelTables(program.graph, profile, o.precision)
        cold = cold_profile(profile, o.precision)
        self._cold_tables = cold and KernelTables(program.graph, cold, o.precision)
        # the microbenchmark's warm and cold tables, that scale a traced row from the
        # residency its run had to a call's (NOTE [traced residency])
        untraced = profile.traced and cold and profile.with_fields(traced={})
        self._untraced = untraced and (
            KernelTables(program.graph, untraced, o.precision),
            KernelTables(program.graph, cold_profile(untraced, o.precision), o.precision))
        self._groups: dict = {}         # stage -> its DP group's members per node
        self._steps: dict = {}          # task -> its steps: a replay of two steps asks twice
        self._cold = self._cold_fractions()

    def _cold_fractions(self) -> dict:
        """(task, call index) -> the fraction of the call's operand bytes not cached
        (NOTE [cache residency]), for profiles with cold kernel costs and a cache size;
        empty otherwise (every call warm)."""
        p = self.profile
        if not p.op_costs_cold or not p.cache_bytes or self.program.memory is None:
            return {}
        out = {}
        for stage, tasks in self.program.tasks.items():
            out.update(cold_fractions(tasks, self._calls[stage],
                                      self.program.memory.stages[stage].offsets,
                                      int(p.cache_bytes)))
        return out

    def paced(self, paces: tuple[float, ...]) -> ProfileCosts:
        """These costs with the stages at `paces` (one of `rotations`): the kernel tables
        shared, the steps, which carry the pace, charged afresh."""
        other = copy.copy(self)
        other.paces, other._steps = paces, {}
        return other

    def steps(self, task) -> tuple[Step, ...]:
        if task not in self._steps:
            self._steps[task] = tuple(_merged(self._task_steps(task)))
        return self._steps[task]

    def _task_steps(self, task):
        speed, cursor, touched = self.speeds[task.stage] / self.paces[task.stage], {}, set()
        yield from waits_for_hidden_grad(self, task)  # NOTE [shard messages]
        yield from waits_for_lookups(self, task)  # NOTE [embedding messages]
        overhead = self.profile.traced.get("call_overhead")
        if overhead:  # NOTE [traced rows] 4 (calibrate/from_trace.py)
            runs = sum(not rollback_only(c) for c in self._calls[task.stage][task])
            yield Compute(overhead[0] * runs / speed)
        for i, call in enumerate(self._calls[task.stage][task]):
            if rollback_only(call):  # the simulated step commits: NOTE [commit rule]
                continue
            hazards = {s.buffer for s in _slots(call.inputs) + list(call.outputs)} & self._async
            if hazards - touched:
                yield Touch(tuple(sorted(hazards - touched)))
                touched |= hazards
            cursor["call"] = i  # which call of the task: NOTE [cache residency]
            for step in self._call_steps(task, call, cursor):
                if isinstance(step, Compute):
                    step = Compute(step.seconds / speed)
                elif isinstance(step, Start):
                    step = replace(step, finish=step.finish / speed)
                    touched -= set(step.buffers)
                yield step

    def _call_steps(self, task, call, cursor) -> list[Step]:
        """The call's steps as simulated: as charged, and where it moves data, the host
        time a traced run measured for its op (NOTE [traced rows] 7) after its wait, if
        it has one, else first."""
        steps = self._charged_steps(task, call, cursor)
        host = self.profile.traced.get("call_host", {}).get(call.op)
        if not host or not _moves_data(call, steps):
            return steps
        waits = [i for i, step in enumerate(steps) if isinstance(step, Recv)]
        at = waits[-1] + 1 if waits else 0
        return steps[:at] + [Compute(host[0])] + steps[at:]

    def _charged_steps(self, task, call, cursor) -> list[Step]:
        handler = CHARGES.get(call.op)
        if handler is not None:
            steps = handler(self, task, call)
            traced = self._traced_runtime(call, steps)
            return steps if traced is None else [Compute(traced)]
        if is_kernel_call(call):
            return [Compute(self._ir_seconds(task, call, cursor))]
        return self._traced_or(call, _memory_bound(self, task, call))

    def host_ops(self, task) -> list[str | None]:
        """For each lowered call of `task`, in call_charges' order: its op where it moves
        data (a send, a posted receive, a receive's wait, a collective's start), whose
        host time a traced run measures per op (NOTE [traced rows] 7); else None."""
        return [None if is_kernel_call(call) or rollback_only(call)
                or not _moves_data(call, self._charged_steps(task, call, {})) else call.op
                for call in self._calls[task.stage][task]]

    def _traced_runtime(self, call, steps) -> float | None:
        """A traced run's time of a runtime call that only computes: its row, else its
        steps at its op's traced speed (NOTE [traced rows] 1, 5)."""
        if not self.profile.traced or _moves_data(call, steps):
            return None
        row = traced_seconds(self.profile, runtime_key(call, self.options.precision))
        if row is not None:
            return row
        return op_speed_factor(self.profile, self.options.precision, call.op) * \
            sum(s.seconds for s in steps)

    def _traced_or(self, call, steps):
        traced = self._traced_runtime(call, steps)
        return steps if traced is None else [Compute(traced)]

    def _ir_node(self, task, call, cursor) -> tuple[str, str, int]:
        """(layer kind, graph direction, node index) of the graph node this call runs: the
        next node of the layer's graph with the call's op (lower emits a layer's calls in
        node order)."""
        layer = call.layer
        kind = self.program.graph.layers[layer].kind
        backward = task.kind in GRAD_PRODUCERS and not call.note.endswith(RECOMPUTE_TAG)
        direction = self._direction(task) if backward else "fwd"
        ops = self._table(kind, direction)[0]
        key = (layer, backward)
        i = cursor.get(key, 0)
        while i < len(ops) and ops[i] != call.op:
            i += 1
        if i == len(ops):
            raise ValueError(f"{task}: call {call.op} ({call.note}) matches no node of the "
                             f"{kind} graph in order")
        cursor[key] = i + 1
        return kind, direction, i

    def _ir_seconds(self, task, call, cursor) -> float:
        """The cost of the graph node this call runs (sim/kernels.py), its cold part by
        how much of its operands are still cached (NOTE [cache residency])."""
        return self._node_seconds(task, cursor["call"], *self._ir_node(task, call, cursor))

    def _node_seconds(self, task, call_index: int, kind: str, direction: str, i: int) -> float:
        """Node `i` of a layer kind's `direction` graph, warm or part cold (NOTE [cache
        residency]) as the task's call `call_index` finds its operands."""
        _, warm, cold = self._table(kind, direction)
        if cold is None:
            return warm[i]
        return warm[i] + self._cold.get((task, call_index), 0.0) * (cold[i] - warm[i])

    def call_charges(self, task) -> list[tuple[float, tuple | None, float, float | None]]:
        """For each lowered call of `task`, in order: (the compute seconds this model
        charges it, the key of the traced row that would replace its cost, or None where
        no row can (transfers, collectives, waits), the share of the row's seconds the
        call takes: a zb1 half of a backward GEMM takes its share, and the part of the
        charge a fully cached call would take: a kernel call's warm cost over its charge
        at the residency it finds, None where the profile has no cold costs and for runtime
        calls). What `ratrain calibrate --from` sets beside a traced run's times (NOTE
        [traced rows], NOTE [traced residency])."""
        out, cursor = [], {}
        for i, call in enumerate(self._calls[task.stage][task]):
            cursor["call"] = i
            if is_kernel_call(call):
                kind, direction, n = self._ir_node(task, call, cursor)
                seconds = self._node_seconds(task, i, kind, direction, n)
                key, share = whole_node_key(self.program.graph.kinds[kind], direction, n,
                                            self.options.precision)
                _, warm, cold = self._table(kind, direction)
                warm_part = warm[n] / seconds if self._cold and cold and seconds > 0 else None
                out.append((seconds / self.speeds[task.stage], key, share, warm_part))
                continue
            steps = self._charged_steps(task, call, cursor)
            compute = not _moves_data(call, steps)
            out.append((sum(s.seconds for s in steps if isinstance(s, Compute))
                        / self.speeds[task.stage],
                        runtime_key(call, self.options.precision) if compute else None, 1.0,
                        None))
        return out

    def _direction(self, task) -> str:
        """Which graph a backward task's calls run: the whole backward, or zb1's input
        (B) or weight (W) part (NOTE [B/W split])."""
        if task.kind == Kind.W:
            return "bwd_weight"
        return "bwd_input" if is_split(self.program) else "bwd"

    def _table(self, kind: str, direction: str):
        """(ops, warm seconds, cold seconds or None) of every node of a layer kind's
        `direction` graph: the tables the passes' costs read too (NOTE [a compute task's
        seconds], task_seconds.py)."""
        key = (kind, direction)
        if key not in self._tables:
            layer_kind = self.program.graph.kinds[kind]
            graph = {"fwd": layer_kind.fwd, "bwd": layer_kind.bwd,
                     "bwd_input": layer_kind.split.input_part,
                     "bwd_weight": layer_kind.split.weight_part}[direction]
            warm, cold = self._warm.nodes(kind, direction), None
            if self._cold_tables:
                cold = self._cold_tables.nodes(kind, direction)
            if self._untraced:
                warm, cold = self._traced_residency(kind, direction, warm, cold)
            self._tables[key] = (tuple(n.op for n in graph.nodes), warm, cold)
        return self._tables[key]

    # NOTE [traced residency]: a traced row (NOTE [traced rows]) is one time per kernel
    # shape, and each call it sampled ran at the cache residency its run gave it, while a
    # call of that shape in another program finds its operands more or less cached (NOTE
    # [cache residency]): tiny-gqa bf16's rows from pp 2, whose ranks hold half the layers
    # each, charged dp 2 ZeRO 2 (a rank holds them all) 17% short in two of three rounds
    # (bench/predict-runs/2026-11-28-b.txt), where the microbenchmark's warm and cold costs
    # charge its shared keys 5.9% more in dp 2 than in pp 2. So `calibrate --from` scales
    # each sample of a kernel call to what the call would have taken fully cached, by the
    # residency model (its warm cost w over its charge w + f (c - w), call_charges), and
    # writes the row's cold fraction, 0, as its third number; a call of cold fraction f is
    # charged row x (w + f (c - w)) / (w + f_s (c - w)), f_s the row's fraction, w and c
    # the microbenchmark's warm and cold costs of its node. The traced program is charged
    # what its run took call by call, and another program the residency model's change
    # from there. A row without f_s (calibrated over a profile without cold costs, or
    # before 2026-11-28) is charged as it is.
    def _traced_residency(self, kind: str, direction: str, warm: tuple, cold: tuple):
        """`warm` and `cold` with each traced row that records its run's cold fraction
        replaced by that row's warm and cold times (NOTE [traced residency])."""
        micro_warm, micro_cold = (t.nodes(kind, direction) for t in self._untraced)
        rows = self.profile.traced.get("calls", {})
        warm, cold = list(warm), list(cold)
        for i, (w, c) in enumerate(zip(micro_warm, micro_cold)):
            key, _ = whole_node_key(self.program.graph.kinds[kind], direction, i,
                                    self.options.precision)
            row = rows.get(key_text(key), ())
            at_source = w + row[2] * (c - w) if len(row) > 2 else 0.0
            if at_source > 0:  # the row's time (times a zb1 half's share) at its run's
                warm[i], cold[i] = warm[i] * w / at_source, warm[i] * c / at_source
        return tuple(warm), tuple(cold)

    # ---- collectives --------------------------------------------------------------------

    def memory_seconds(self, op: str, nbytes: float) -> float:
        """A memory-bound runtime call moving `nbytes` (costs.memory_seconds)."""
        return memory_seconds(self.profile, self.options.precision, op, nbytes)

    def collective(self, op: str, nbytes: float, stage: int, buffers, finish: float,
                   what: str) -> list[Step]:
        """Start `op` over `stage`'s DP group (sim/collectives.node_collective: its bytes
        move at the node's rates); `finish`: compute seconds when it is waited for. The
        rank's host then spends link_host_cost on every byte it sends and receives."""
        group = self._groups.setdefault(stage, dp_group(self.profile, self.options, stage))
        cost = collective_timed(self.profile, op, nbytes, group, self.algorithm)
        rate = cost.nbytes / cost.seconds if cost.seconds > 0 else 0.0
        start = Start(tuple(buffers), cost.latency, cost.nbytes, finish, what, rate,
                      straggle_rate(self.profile, sum(group)) if self.straggles else 0.0)
        return [start] + self.host_steps(2 * cost.nbytes)

    def host_steps(self, nbytes: float) -> list[Step]:
        """See NOTE [link host cost]: compute the rank loses to moving `nbytes` over its
        link."""
        return [Compute(link_host_seconds(self.profile, nbytes))] if self.host_cost and nbytes \
            else []

    def world_sum_seconds(self) -> float:
        return norm_seconds(self.profile, self.options, self.algorithm)


# ---- runtime calls (rt/calls.py), one handler each ------------------------------------------

def _send(c: ProfileCosts, task, call) -> list[Step]:
    """A copy of the arena slot, sent on the link within the node or, to a stage on
    another node, on the node's port."""
    nbytes, peer = call.inputs[0].nbytes, counterpart(task).stage
    latency, rate = message_path(c.profile, crosses_node(c.profile, c.options, task.stage,
                                                         peer))
    return [Compute(2 * nbytes / c.ddr),
            Send(counterpart(task), send_channel(task), latency, nbytes, rate),
            *c.host_steps(nbytes)]


def _wait_recv(c: ProfileCosts, task, call) -> list[Step]:
    return [Recv(task), *c.host_steps(sum(s.nbytes for s in call.outputs))]


def _grad_sync(c: ProfileCosts, task, call) -> list[Step]:
    op = dict(call.params)["op"]
    if op == "wait":  # reduce-scattered inside every B: the UPD waits for the last one
        return []
    grad, out = call.inputs[0], call.outputs[0]
    nbytes, out_bytes = grad.nbytes, out.nbytes
    # finish: the sum (or this rank's part of it) divided by dp, written to `out`
    return c.collective(op, nbytes, task.stage, {grad.buffer, out.buffer},
                        sync_finish_seconds(c.profile, c.options.precision, out_bytes),
                        f"{op} L{task.layer}")


def _grad_scatter(c: ProfileCosts, task, call) -> list[Step]:
    """Concatenate one micro-batch's gradients in fp32, reduce-scatter them, then add
    this rank's part into its shard (NOTE [gradient accumulation])."""
    shard = call.outputs[0]
    g = grad_scatter(sum(s.nbytes for s in call.inputs), scatter_bytes(call), shard.nbytes)
    return [Compute(g.concat / c.ddr),
            *c.collective("reduce_scatter", g.reduced, task.stage, {shard.buffer},
                          g.add / c.ddr, f"reduce_scatter {call.note} mb{task.micro_batch}")]


def _owned_bytes(c: ProfileCosts, grads) -> float:
    """Bytes of the gradient part this rank counts in the norm: its shard under ZeRO-2,
    1/dp of a full gradient otherwise."""
    return sum(s.nbytes if is_grad_shard(s.buffer) else s.nbytes / c.options.dp
               for s in grads)


def _global_norm(c: ProfileCosts, task, call) -> list[Step]:
    """Sum of squares of the gradient part this rank owns, an overflow check and in-place
    unscaling in fp16, then the world-wide scalar sum. Under the commit rule the UPDs took
    the shares already: only the world sum is left (NOTE [commit rule])."""
    if "layers" in dict(call.params):
        return [WorldSum(c.world_sum_seconds())]
    share = norm_share_bytes(_owned_bytes(c, call.inputs), sum(s.nbytes for s in call.outputs),
                             bool(call.outputs))  # fp16: unscaled in place
    return [Compute(share / c.ddr),
            WorldSum(c.world_sum_seconds())]


def _tie_sum(c: ProfileCosts, task, call) -> list[Step]:
    """See NOTE [tied weights]: add this stage's copies, all-reduce the sum with the other tie
    stages (blocking, over the pipeline link) and write it into every copy."""
    nbytes = call.inputs[0].nbytes
    if "rows" in dict(call.params):  # the whole weight's rows (a vocabulary-parallel head)
        nbytes = 4 * dict(call.params)["vocab"] * call.inputs[0].shape[-1]
    local = Compute(tie_local_bytes(len(call.inputs), nbytes) / c.ddr)  # inputs are outputs
    members = len(dict(call.params)["stages"])
    if members == 1:
        return [local]
    p = c.profile
    port = collective_cost("allreduce", members, nbytes, p.link_latency, p.link_bandwidth,
                           c.algorithm).nbytes
    return [local, TieSum(tie_sum_seconds(p, nbytes, members, c.algorithm)),
            *c.host_steps(2 * port)]


def _adamw(c: ProfileCosts, task, call) -> list[Step]:
    """AdamW; a speculative one (NOTE [commit rule]) also reads its gradient share for the
    norm (twice in fp16: finite check, then squares, and unscales it in place) and copies
    master, m and v into undo.L."""
    update = update_seconds(c.profile, slot_elements(call.outputs[0]), c.options.precision)
    params = dict(call.params)
    if not params.get("speculative"):
        return [Compute(update)]
    grad = call.inputs[0]
    share = norm_share_bytes(_owned_bytes(c, (grad,)), grad.nbytes,
                             bool(params.get("loss_scale")))
    undo = undo_copy_bytes(slot_elements(call.outputs[0]))
    return [Compute(update + (share + undo) / c.ddr)]


def _prefetch_view(c: ProfileCosts, task, call) -> list[Step]:
    """Cast the fp32 master to the view's dtype; under ZeRO 1/2 gather it (_view_gather).
    A `redo` one (rollback only) costs nothing: NOTE [commit rule]."""
    if dict(call.params).get("redo"):
        return []
    if not dict(call.params)["gather"]:
        view = sum(s.nbytes for s in call.outputs)
        return [Compute(c.memory_seconds(CallOp.PREFETCH_VIEW, call.inputs[0].nbytes + view))]
    return _view_gather(c, task, call, f"allgather L{task.layer}")


def _gather_view(c: ProfileCosts, task, call) -> list[Step]:
    """See NOTE [ZeRO-3 lifecycle]: a view gathered for one use (_view_gather)."""
    return _view_gather(c, task, call,
                        f"allgather {call.note} for {dict(call.params)['use']}")


def _view_gather(c: ProfileCosts, task, call, label: str) -> list[Step]:
    """Cast the master shard, all-gather the cast shards on the DP link (a Start: later
    calls overlap it until one touches the view), and copy the gathered view into place
    when it is waited for, unless it was gathered in place (NOTE [views gathered in
    place], passes/layer_buffers.py)."""
    g = view_gather(slot_elements(call.inputs[0]), np.dtype(call.outputs[0].dtype).itemsize,
                    c.options.dp, sum(s.nbytes for s in call.outputs),
                    bool(dict(call.params).get("in_place")))
    return [Compute(gather_start_seconds(c.profile, c.options.precision, g)),
            *c.collective("allgather", g.gathered, task.stage,
                          {s.buffer for s in call.outputs}, g.unpack / c.ddr, label)]


def _memory_bound(c: ProfileCosts, task, call) -> list[Step]:
    return [Compute(_moved_bytes(call) / c.ddr)]


# what each runtime call (rt/calls.py) costs, checked at import to cover the grammar
# exactly (NOTE [one table of call ops], program_format/call_ops.py)
CHARGES = registered({
    **dict.fromkeys((CallOp.COPY, CallOp.FILL, CallOp.LOAD_IDS, CallOp.LOAD_TARGETS,
                     CallOp.RECORD_LOSS, CallOp.ACCUMULATE_GRAD), _memory_bound),
    CallOp.SEND: _send,
    CallOp.POST_RECV: lambda c, task, call: [Post(posted_receive(task))],
    CallOp.WAIT_RECV: _wait_recv,
    CallOp.GRAD_SYNC: _grad_sync,
    CallOp.GRAD_SCATTER: _grad_scatter,
    CallOp.GLOBAL_NORM: _global_norm,
    CallOp.TIE_SUM: _tie_sum,
    CallOp.ADAMW: _adamw,
    CallOp.REDO_UPDATE: lambda c, task, call: [],  # the simulated step commits: NOTE [commit rule]
    CallOp.PREFETCH_VIEW: _prefetch_view,
    CallOp.GATHER_VIEW: _gather_view,
    **VOCAB_STEPS,  # NOTE [vocabulary-parallel head]
    **EMBED_STEPS,  # NOTE [vocabulary-parallel embedding]
}, "sim/calls.py CHARGES")
