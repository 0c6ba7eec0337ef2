"""insert_prefetch: build the next step's parameter view of each layer.

Runs after insert_update. PREF[L] casts the updated master params to the compute dtype
(and all-gathers the shards under ZeRO 1/2) into view.L, so the next step's first F of L
reads a ready view and never waits. In ratrain mode PREF[L] follows UPD[L] directly, in
the step's tail, overlapping the remaining updates; the baseline builds all views after
all updates.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task


def _with_prefetch(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    out: list[Task] = []
    for task in tasks:
        out.append(task)
        if task.kind == Kind.UPD and program.options.schedule == "ratrain":
            out.append(Task(stage, Kind.PREF, layer=task.layer))
    if program.options.schedule == "baseline":
        out += [Task(stage, Kind.PREF, layer=t.layer) for t in tasks if t.kind == Kind.UPD]
    return tuple(out)


def insert_prefetch(program):
    """Add PREF[L] for every layer after its UPD.

    Requires: one UPD per layer. Guarantees: each layer has one PREF, after its UPD and
    (the task list being one step, run cyclically) before the next step's first F.
    """
    if program.options.zero == 3:  # no persistent view: insert_gathers builds them at use
        return program
    tasks = {s: _with_prefetch(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
