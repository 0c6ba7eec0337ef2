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


def _with_updates(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    syncs = [i for i, t in enumerate(tasks) if t.kind == Kind.SYNC]
    at = syncs[-1] + 1
    updates = [Task(stage, Kind.UPD, layer=tasks[i].layer) for i in syncs]
    if needs_global_norm(program.options):
        updates.insert(0, Task(stage, Kind.NORM))
    return tasks[:at] + tuple(updates) + tasks[at:]


def insert_update(program):
    """Add UPD[L] (and a NORM when clipping or loss scaling needs global scalars).

    Requires: one SYNC per layer. Guarantees: every UPD comes after its SYNC, in the
    SYNC order; a NORM, when present, precedes every UPD of the stage.
    """
    tasks = {s: _with_updates(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
