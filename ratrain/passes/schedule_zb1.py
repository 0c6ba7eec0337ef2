"""schedule_zb1: zero-bubble ZB-H1 order per stage: 1F1B's forwards and input-gradient
backwards (B), with each layer's weight gradients (W) deferred into the idle time.

Runs where schedule_1f1b runs (schedule_pipeline picks by --pipeline-schedule); the
lifecycle passes then place SYNC[L] right after the step's last W of layer L. Same
assumptions as 1F1B: non-interleaved, one contiguous block of layers per stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ratrain.ir.tasks import Kind, Schedule, Task
from ratrain.ir.vocab import is_vocab_parallel
from ratrain.passes.schedule_1f1b import (compute_order, schedule_1f1b, warmup_forwards,
                                          with_comms)
from ratrain.passes.schedule_vocab import schedule_vocabulary, wide_cost

# NOTE [zb1 schedule]: ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).
# B computes only the input gradient, so a gradient crosses a stage in F-time instead of
# (B + W)-time; the W's a stage owes fill the slots where 1F1B idles. Stage s keeps
# 1F1B's order of F's and B's and its bound b = min(P - s, M) on the micro-batches between
# their F and their B, and allows one more between their F and their last W: F(m) waits
# for B(m - b) and for the W's of micro-batch m - b - 1. That one deferred micro-batch is
# what lets the last stage run F B F B W F B W ... and pass each gradient on before its
# W (F B W strictly, under a bound of b from F to the last W, left the dry run at
# 3 M + 2 (P - 1) slots); it costs memory: the stage keeps that micro-batch's W operands
# (NOTE [weight operands]) until its W's. Every stage but the last runs B(m) only after
# the W's of the micro-batches before m, so a B never creates W operands while an older
# micro-batch holds its own: F(m + b) may still run before the W's of m, which then run
# while the stage waits for B(m + 1)'s gradient, and the stage's peak stays 1F1B's plus
# one micro-batch's W operands (tests/passes/test_zb1.py). The last stage, whose B's
# start the gradient on its way through every other stage, runs each B as soon as it
# can, and holds one micro-batch's W operands more than that (it holds P - 1
# micro-batches fewer than stage 0 from F to B; with F = B = W, waiting there too costs
# a slot: 3 M + 2 (P - 1)). The W's are placed by replaying
# the step with the program's cost model (unit costs without one): at each point a stage
# runs its next F or B when its input is there and the bounds allow, else a W it owes,
# else waits. A layer's W's stay in micro-batch order, so every gradient sums its
# micro-batches in 1F1B's order (same bits). With F = B = W the step takes 3 M + 2 P - 3
# slots against 1F1B's 3 (M + P - 1). After the last B the W's left are ordered by
# Johnson's rule for a two-machine flow shop (W's on the cores, then the layer's SYNC on
# the DP link), which minimises the time the last SYNC ends: the layers whose W's are
# shorter than their SYNC first, shortest W first, then the others, longest SYNC first.
# SYNC[L] follows its layer's last W in the list (insert_grad_sync).

Cost = Callable[[Task], float]


def unit_cost(task: Task, layers_per_stage: int = 1) -> float:
    """F = B = 1, a micro-batch's W's 1 in all, SYNC 0: the costs of the ZB-H1 paper,
    for a program compiled without a profile (with one, Program.cost_model: NOTE [a
    compute task's seconds], sim/task_seconds.py)."""
    if task.kind == Kind.W:
        return 1.0 / layers_per_stage
    return 1.0 if task.kind in (Kind.F, Kind.B) else 0.0


@dataclass
class _Stage:  # one stage's state while zb1_compute_order replays the step
    stage: int
    order: list[Task]                   # 1F1B order of F and B still to run
    bound: int                          # micro-batches between F and B (1F1B's order)
    owed: list[Task] = field(default_factory=list)  # W's whose B ran, in run order
    done: list[Task] = field(default_factory=list)  # program so far (F, B, W)
    clock: float = 0.0                  # when the stage's last task so far ends
    freed: int = 0                      # micro-batches whose W's all ran


def _w_tasks(stage: int, layers, micro_batch: int) -> list[Task]:
    return [Task(stage, Kind.W, layer=l, micro_batch=micro_batch) for l in reversed(layers)]


def _ready_at(st: _Stage, task: Task, ends: dict, last: int) -> float | None:
    """When task's input is there (None: not yet known)."""
    if task.kind == Kind.F:
        return 0.0 if st.stage == 0 else ends.get((st.stage - 1, Kind.F, task.micro_batch))
    if st.stage == last:
        return 0.0
    return ends.get((st.stage + 1, Kind.B, task.micro_batch))


def _blocked_by_bound(st: _Stage, task: Task) -> bool:
    """Would F make more than bound + 1 micro-batches between their F and their last W?
    (1F1B's order keeps bound between F and B.)"""
    return task.kind == Kind.F and task.micro_batch >= st.freed + st.bound + 1


def _run(st: _Stage, task: Task, at: float, cost: Cost, ends: dict, layers) -> None:
    st.clock = max(st.clock, at) + cost(task)
    st.done.append(task)
    if task.kind == Kind.W:
        st.owed.remove(task)
        if not any(w.micro_batch == task.micro_batch for w in st.owed):
            st.freed += 1
    else:
        st.order.pop(0)
        ends[(st.stage, task.kind, task.micro_batch)] = st.clock
        if task.kind == Kind.B:
            st.owed += _w_tasks(st.stage, layers, task.micro_batch)
            st.freed += not layers  # a stage without layers (the shards' turn) owes no W


def _waits_for_weights(st: _Stage, task: Task, last: int) -> bool:
    """Must B wait for the W's of earlier micro-batches? (Every stage but the last.)"""
    return task.kind == Kind.B and st.stage != last and \
        any(w.micro_batch < task.micro_batch for w in st.owed)


def _step(st: _Stage, cost: Cost, ends: dict, last: int, layers) -> bool:
    """Run one task on the stage if it can; False when it must wait for a neighbour."""
    task = st.order[0]
    ready = _ready_at(st, task, ends, last)
    if _blocked_by_bound(st, task) or _waits_for_weights(st, task, last) or ready is None \
            or ready > st.clock:
        if st.owed:
            _run(st, st.owed[0], st.clock, cost, ends, layers)
            return True
        if ready is None or _blocked_by_bound(st, task):
            return False
    _run(st, task, ready, cost, ends, layers)
    return True


def johnson_order(layers, w_seconds: Callable[[int], float],
                  sync_seconds: Callable[[int], float]) -> list[int]:
    """Layers in the order that ends the last SYNC first (NOTE [zb1 schedule])."""
    first = sorted((l for l in layers if w_seconds(l) < sync_seconds(l)), key=w_seconds)
    rest = sorted((l for l in layers if w_seconds(l) >= sync_seconds(l)),
                  key=lambda l: -sync_seconds(l))
    return first + rest


def _cool_down(st: _Stage, cost: Cost) -> list[Task]:
    """The W's owed after the last B, grouped by layer in Johnson's order."""
    layers = list(dict.fromkeys(w.layer for w in st.owed))
    owed = lambda l: [w for w in st.owed if w.layer == l]
    order = johnson_order(layers, lambda l: sum(cost(w) for w in owed(l)),
                          lambda l: cost(Task(st.stage, Kind.SYNC, layer=l)))
    return [w for l in order for w in owed(l)]


def zb1_compute_order(stages: tuple[tuple[int, ...], ...], num_micro_batches: int,
                      cost: Cost | None = None) -> dict[int, list[Task]]:
    """The F, B and W tasks of every stage in ZB-H1 order (NOTE [zb1 schedule])."""
    P, M = len(stages), num_micro_batches
    cost = cost or (lambda t: unit_cost(t, len(stages[t.stage])))
    states = [_Stage(s, compute_order(s, P, M), warmup_forwards(s, P, M) + 1)
              for s in range(P)]
    ends: dict = {}
    while any(st.order for st in states):
        moved = False
        for st in sorted((st for st in states if st.order), key=lambda st: st.clock):
            if _step(st, cost, ends, P - 1, stages[st.stage]):
                moved = True
                break
        if not moved:
            raise RuntimeError("zb1 schedule: no stage can move (a bug in the replay)")
    return {st.stage: st.done + _cool_down(st, cost) for st in states}


def schedule_zb1(stages: tuple[tuple[int, ...], ...], num_micro_batches: int,
                 cost: Cost | None = None) -> Schedule:
    """ZB-H1 order for every stage, with SEND/RECV around each F and B.

    Requires: stages (layer indices per stage), num_micro_batches >= 1; `cost` seconds
    per F, B, W and SYNC task (default unit_cost). Guarantees: each (stage, micro_batch)
    has one F, one B and one W per layer of the stage; F's and B's in 1F1B's order
    (schedule_1f1b); each W after its B, a layer's W's in micro-batch order; at most
    min(P - s, M) micro-batches between their F and their B on stage s, and one more
    between their F and their last W; on every stage but the last, each B after the W's
    of the micro-batches before it; every SEND has one matching RECV and the dry run
    finds no deadlock.
    """
    if not stages or num_micro_batches < 1:
        raise ValueError(f"schedule_zb1 needs stages and num_micro_batches >= 1, got "
                         f"{len(stages)} stages and {num_micro_batches}")
    P = len(stages)
    return {s: tuple(t for task in tasks for t in
                     (with_comms(task, P) if task.kind != Kind.W else [task]))
            for s, tasks in zb1_compute_order(stages, num_micro_batches, cost).items()}


def schedule_pipeline(program):
    """The pass: schedule_1f1b, or schedule_zb1 under --pipeline-schedule zb1 (with the
    program's cost model, NOTE [zb1 schedule]), for the program's stages and M; under
    --vocab-parallel with the shards' S and T (and E and G) placed (NOTE
    [vocabulary-parallel schedule]).

    Requires: stages. Guarantees: program.tasks holds that schedule.
    """
    M, zb1 = program.micro_batches, program.options.pipeline_schedule == "zb1"
    if is_vocab_parallel(program):
        wide = wide_cost(program, unit_cost)  # the virtual stages' F and B cost S, T (E, G)
        build = (lambda stages: schedule_zb1(stages, M, wide)) if zb1 else \
            (lambda stages: schedule_1f1b(len(stages), M))
        return replace(program, tasks=schedule_vocabulary(program, build, wide))
    if zb1:
        cost = program.cost_model(program) if program.cost_model else None
        return replace(program, tasks=schedule_zb1(program.stages, M, cost))
    return replace(program, tasks=schedule_1f1b(len(program.stages), M))
