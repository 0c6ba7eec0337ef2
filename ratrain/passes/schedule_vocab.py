"""schedule_vocab: where the vocabulary-parallel head's S and T tasks go in every stage's
1F1B or zb1 order (NOTE [vocabulary-parallel schedule]).

Called by schedule_pipeline (schedule_zb1.py) under --vocab-parallel, with the function
that builds the plain schedule for a number of stages. Assumes the graph was split by
models/trace.split_head (one shard layer per stage).
"""
from __future__ import annotations

from ratrain.ir.tasks import Kind, Schedule, Task
from ratrain.passes.dryrun import dry_run

# NOTE [vocabulary-parallel schedule]: the shards of the LM head act as one more pipeline
# stage whose work is spread over every rank. The schedule is built for P + 1 stages
# (1F1B or zb1, as the options ask), the last of them the shards' turn: its F(m) is
# S(m), its B(m) T(m). A dry run of that wide schedule (on the program's cost model:
# the virtual stage's F and B cost the last stage's S and T; unit costs without one)
# says when the virtual F(m) and B(m) start; each real stage then runs S(m) just before
# its first compute task (with the receive in front of it) that starts at or after the
# virtual F(m)'s start, T(m) likewise for the virtual B(m), and the virtual stage's
# tasks and the messages to and from it go. So S(m) runs on every stage as soon as hn(m)
# can be there, T(m) one task later, when the statistics' all-gather has had that task's
# time to cross, and the last stage's B(m) follows its T(m) as it followed the virtual
# stage's B(m) before. Every stage runs S0 T0 S1 T1 ... in that order (the virtual stage
# alternates F and B), so the pipeline group's non-blocking collectives are issued in one
# order on every rank, as MPI requires. The 1F1B warm-up of the wide schedule is one
# forward longer on every stage (min(P + 1 - s, M) micro-batches in flight, NOTE [1F1B
# warm-up count]): the last stage now waits for the shards' T(m) before B(m), and that
# one more micro-batch in flight on every stage is what keeps the bubble from growing
# (the activation memory grows from P to P + 1 micro-batches, as in Vocabulary
# Parallelism, Yeung et al. 2025); plan_memory counts it, since it plans the list.


def wide_cost(program, num_stages: int, unit_cost):
    """Seconds of a task of the wide schedule: the cost model's (`unit_cost(task,
    layers)` without one) for the real stages' tasks, the last stage's S and T for the
    virtual stage's F and B, nothing for its other tasks and the messages to and from it."""
    model = program.cost_model(program) if program.cost_model else None
    last = num_stages - 1

    def cost(task: Task) -> float:
        if task.stage == num_stages:
            if task.kind not in (Kind.F, Kind.B):
                return 0.0
            kind = Kind.S if task.kind == Kind.F else Kind.T
            return model(Task(last, kind, micro_batch=task.micro_batch)) if model else 1.0
        if _is_virtual_message(task, last):
            return 0.0
        if model:
            return model(task)
        return unit_cost(task, len(program.stages[task.stage]))
    return cost


def _is_virtual_message(task: Task, last: int) -> bool:
    return task.stage == last and task.kind in (Kind.SEND_F, Kind.RECV_B, Kind.POST_B)


def _next_compute_starts(row) -> list[float]:
    """For each position of a stage's timeline, the start of the next compute task at or
    after it (infinity past the last)."""
    out, start = [0.0] * len(row), float("inf")
    for i in reversed(range(len(row))):
        if row[i].task.kind in (Kind.F, Kind.B, Kind.W):
            start = row[i].start
        out[i] = start
    return out


def _fold(stage: int, last: int, row, marks: list[tuple[float, int, Task]]) -> tuple:
    """The stage's tasks with S and T inserted at their marks (time, order, task)."""
    pending, out = sorted(marks, key=lambda mark: mark[1]), []
    starts = _next_compute_starts(row)
    for timing, start in zip(row, starts):
        if timing.task.kind not in (Kind.SEND_F, Kind.SEND_B):
            while pending and pending[0][0] <= start:
                out.append(pending.pop(0)[2])
        if not _is_virtual_message(timing.task, last):
            out.append(timing.task)
    return tuple(out + [task for _, _, task in pending])


def schedule_vocabulary(program, build, cost) -> Schedule:
    """Every stage's tasks with its S(m) and T(m) placed (NOTE [vocabulary-parallel
    schedule]). `build(n)`: the plain schedule (F, B, W and messages) of n stages;
    `cost`: seconds of its tasks (wide_cost).

    Guarantees: each stage runs one S and one T per micro-batch, in the order S0 T0 S1
    T1 ...; the last stage's S(m) follows its F(m) and its T(m) precedes its B(m); no
    task sends to or receives from stage P; the rest is build(P + 1)'s order.
    """
    P = len(program.stages)
    wide = build(P + 1)
    timeline = dry_run(wide, cost).timeline
    virtual = {(t.task.kind, t.task.micro_batch): t.start for t in timeline[P]
               if t.task.kind in (Kind.F, Kind.B)}
    out = {}
    for stage in range(P):
        marks = [(virtual[(kind, m)], 2 * m + (kind == Kind.B),
                  Task(stage, Kind.S if kind == Kind.F else Kind.T, micro_batch=m))
                 for kind, m in virtual]
        out[stage] = _fold(stage, P - 1, timeline[stage], marks)
    return out
