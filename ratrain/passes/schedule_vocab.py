"""schedule_vocab: where the vocabulary-parallel head's S and T tasks, and the embedding's E
and G, go in every stage's 1F1B or zb1 order (NOTE [vocabulary-parallel schedule]).

Called by schedule_pipeline (schedule_zb1.py) under --vocab-parallel, with the function
that builds the plain schedule for given stages. Assumes the graph was split by
models/trace.split_head (one shard layer per stage), and by split_embedding where the
embedding is split.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Schedule, Task
from ratrain.ir.vocab import is_embedding_split
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
# A split embedding (NOTE [vocabulary-parallel embedding]) is one more virtual stage, in
# front of stage 0: its F(m) is E(m), its B(m) G(m), they cost stage 0's E and G, and
# every real stage runs E(m) and G(m) where that stage's F(m) and B(m) start, as above.
# So E(m) precedes stage 0's F(m), which waits for the lookups' reduce, and G(m) follows
# stage 0's B(m), whose gout.mb it broadcasts. A stage in front adds no micro-batch in
# flight to the real stages (stage s still holds min(P + 1 - s, M)). The pipeline
# group's collectives (E, S, T, G) are issued in one order on every rank: every stage
# inserts the marks of both virtual stages in the order of their times (E before S
# before T before G at equal times, then by micro-batch), and the verifier checks that
# order is the same on every stage.


# the order of marks that start at the same time (NOTE [vocabulary-parallel schedule])
_MARK_ORDER = {Kind.E: 0, Kind.S: 1, Kind.T: 2, Kind.G: 3}
_VIRTUAL_TASK = {("first", Kind.F): Kind.E, ("first", Kind.B): Kind.G,
                 ("last", Kind.F): Kind.S, ("last", Kind.B): Kind.T}


class _Wide:
    """The wide schedule's stages: a virtual first one (the embedding's shards) when the
    embedding is split, the program's, then a virtual last one (the head's shards)."""

    def __init__(self, program):
        self.real = len(program.stages)
        self.front = int(is_embedding_split(program))
        self.stages = ((),) * self.front + tuple(program.stages) + ((),)

    def virtual(self, wide_stage: int) -> str | None:
        """Which virtual stage `wide_stage` is ("first", "last"), or None for a real one."""
        if self.front and wide_stage == 0:
            return "first"
        return "last" if wide_stage == self.real + self.front else None

    def is_virtual_message(self, task: Task) -> bool:
        """A message between a real stage and a virtual one (wide stage numbers)."""
        if self.front and task.stage == self.front:
            if task.kind in (Kind.RECV_F, Kind.POST_F, Kind.SEND_B):
                return True
        return task.stage == self.real + self.front - 1 and \
            task.kind in (Kind.SEND_F, Kind.RECV_B, Kind.POST_B)


def wide_cost(program, unit_cost):
    """Seconds of a task of the wide schedule: the cost model's (`unit_cost(task,
    layers)` without one) for the real stages' tasks, the last stage's S and T for the
    virtual last stage's F and B, stage 0's E and G for the virtual first stage's,
    nothing for their other tasks and the messages to and from them."""
    model = program.cost_model(program) if program.cost_model else None
    wide = _Wide(program)

    def cost(task: Task) -> float:
        side = wide.virtual(task.stage)
        if side is not None:
            if task.kind not in (Kind.F, Kind.B):
                return 0.0
            kind = _VIRTUAL_TASK[(side, task.kind)]
            real = 0 if side == "first" else wide.real - 1
            return model(Task(real, kind, micro_batch=task.micro_batch)) if model else 1.0
        if wide.is_virtual_message(task):
            return 0.0
        task = replace(task, stage=task.stage - wide.front)
        if model:
            return model(task)
        return unit_cost(task, len(program.stages[task.stage]))
    return cost


def _next_compute_starts(row) -> list[float]:
    """For each position of a stage's timeline, the start of the next compute task at or
    after it (infinity past the last)."""
    out, start = [0.0] * len(row), float("inf")
    for i in reversed(range(len(row))):
        if row[i].task.kind in (Kind.F, Kind.B, Kind.W):
            start = row[i].start
        out[i] = start
    return out


def _fold(stage: int, wide: _Wide, row, marks: list[tuple[float, tuple, Task]]) -> tuple:
    """The stage's tasks (numbered as the real stage) with the marks' tasks (time, order,
    task) inserted, in order, each before the first compute task starting at or after
    its time (not between a task and its send)."""
    pending, out = sorted(marks, key=lambda mark: mark[1]), []
    starts = _next_compute_starts(row)
    for timing, start in zip(row, starts):
        if timing.task.kind not in (Kind.SEND_F, Kind.SEND_B):
            while pending and pending[0][0] <= start:
                out.append(pending.pop(0)[2])
        if not wide.is_virtual_message(timing.task):
            out.append(replace(timing.task, stage=stage))
    return tuple(out + [task for _, _, task in pending])


def schedule_vocabulary(program, build, cost) -> Schedule:
    """Every stage's tasks with its S(m) and T(m) placed, and its E(m) and G(m) where the
    embedding is split (NOTE [vocabulary-parallel schedule]). `build(stages)`: the plain
    schedule (F, B, W and messages) of those stages (layers per stage); `cost`: seconds
    of its tasks (wide_cost).

    Guarantees: each stage runs one S and one T per micro-batch, in the order S0 T0 S1
    T1 ...; the last stage's S(m) follows its F(m) and its T(m) precedes its B(m); with
    E and G, E(m) precedes stage 0's F(m), G(m) follows its B(m), and E, S, T, G come in
    one order on every stage; no task sends to or receives from a virtual stage; the rest
    is the wide schedule's order.
    """
    wide = _Wide(program)
    timeline = dry_run(build(wide.stages), cost).timeline
    times = {}
    for wide_stage, row in timeline.items():
        side = wide.virtual(wide_stage)
        for t in row if side else ():
            if t.task.kind in (Kind.F, Kind.B):
                times[(_VIRTUAL_TASK[(side, t.task.kind)], t.task.micro_batch)] = t.start
    out = {}
    for stage in range(wide.real):
        marks = [(start, (start, _MARK_ORDER[kind], m), Task(stage, kind, micro_batch=m))
                 for (kind, m), start in times.items()]
        out[stage] = _fold(stage, wide, timeline[stage + wide.front], marks)
    return out
