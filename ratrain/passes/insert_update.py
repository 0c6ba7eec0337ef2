"""insert_update: per-layer (shard) AdamW after the layer's gradient sync.

Runs after insert_grad_sync. Without global couplings each UPD[L] follows its SYNC
(ratrain mode: the UPDs follow the SYNCs in the same order, so UPD[L] overlaps the
transfer of the next layer's SYNC). With global-norm clipping or fp16 overflow checks a
NORM task (scalar all-reduce over all ranks) comes before any UPD: updates commit only
with the global scalars known, so the math is exactly that of a whole-model step.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task


def needs_global_norm(options) -> bool:
    return options.clip is not None or options.precision == "fp16"


# NOTE [update order after NORM]: with a NORM every UPD waits for the whole step's
# gradients, so the order of the updates (and of the PREFs behind them) is free. The
# ratrain schedule runs them in layer order, the order in which the next step's forwards
# read the views: the runtime does not wait for a PREF's all-gather at the step end, only
# when a task touches its view, so the next step's F of the first layer starts once that
# one layer's view is gathered while the other gathers go on behind it. In SYNC order
# (last layer first) the first layer's view would be the last one gathered.
def _with_updates(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    syncs = [i for i, t in enumerate(tasks) if t.kind == Kind.SYNC]
    at = syncs[-1] + 1
    layers = [tasks[i].layer for i in syncs]
    if needs_global_norm(program.options) and program.options.schedule == "ratrain":
        layers.sort()
    updates = [Task(stage, Kind.UPD, layer=l) for l in layers]
    if needs_global_norm(program.options):
        updates.insert(0, Task(stage, Kind.NORM))
    return tasks[:at] + tuple(updates) + tasks[at:]


def insert_update(program):
    """Add UPD[L] (and a NORM when clipping or loss scaling needs global scalars).

    Requires: one SYNC per layer. Guarantees: every UPD comes after its SYNC, in the
    SYNC order, or after a NORM in layer order in ratrain mode (NOTE [update order after
    NORM]); a NORM, when present, precedes every UPD of the stage.
    """
    tasks = {s: _with_updates(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
