"""insert_prefetch: build the next step's parameter view of each layer.

Runs after insert_update. PREF[L] casts the updated master params to the compute dtype
(and all-gathers the shards under ZeRO 1/2) into view.L, so the next step's first F of L
reads a ready view and never waits. In ratrain mode PREF[L] follows UPD[L] directly, in
the step's tail, overlapping the remaining updates; the baseline builds all views after
all updates. Under the commit rule with gathered views the PREFs follow the last UPD in
layer order (NOTE [gather order under the commit rule]).
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task
from ratrain.passes.insert_update import commits_updates


# NOTE [gather order under the commit rule]: speculative UPDs run in SYNC order, last
# layer first, but the next step's forwards read the views first layer first, and the
# all-gathers of ZeRO views queue on the same port as the gradient syncs. A PREF right
# behind each UPD would send the first layer's view last, so the next step's first F
# would wait for every gather of the stage. So the PREFs of gathered views follow the
# stage's last UPD, in layer order (as after-norm's do, NOTE [update order after NORM]),
# still before the NORM: they do not wait for the world sum. A PREF that only casts
# (ZeRO 0) uses no port and follows its UPD at once.
def _gathers_after_updates(program) -> bool:
    o = program.options
    return commits_updates(o) and o.zero >= 1  # commits_updates: ratrain schedule only


def _with_prefetch(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    out: list[Task] = []
    updates = [t for t in tasks if t.kind == Kind.UPD]
    in_order = _gathers_after_updates(program)
    for task in tasks:
        out.append(task)
        if task.kind == Kind.UPD and program.options.schedule == "ratrain" and not in_order:
            out.append(Task(stage, Kind.PREF, layer=task.layer))
        if in_order and updates and task is updates[-1]:
            out += [Task(stage, Kind.PREF, layer=l) for l in sorted(t.layer for t in updates)]
    if program.options.schedule == "baseline":
        out += [Task(stage, Kind.PREF, layer=t.layer) for t in updates]
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
