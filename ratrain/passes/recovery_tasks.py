"""REC tasks: which (layer, micro-batch) pairs of a stage can be recomputed, and a program
with chosen pairs recomputed and their RECs placed. insert_recovery places its choices
with them and what_if places recompute-everything with them; kept apart from the pass so
that the what-if programs its budget search asks about do not import it back.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task
from ratrain.passes.layer_buffers import recovers_in_backward, stage_recovers_in_backward


def _recomputable(program) -> set[int]:
    return {l.index for l in program.graph.layers if l.kind == "decoder"}


def stage_keys(program, stage: int) -> list[tuple[int, int]]:
    """Every recomputable (decoder layer, micro-batch) pair of `stage`, micro-batch by
    micro-batch: the order in which the budget search escalates them."""
    decoders = _recomputable(program)
    return [(l, m) for m in range(program.micro_batches)
            for l in program.stages[stage] if l in decoders]


def with_recovery(program, choices: dict, stages=None):
    """`program` with `choices` and REC tasks placed (on `stages` only, if given).

    Requires: the stage's F/B/RECV_B order. Guarantees: `recompute` is `choices`; the
    placed stages have one REC per chosen pair recovered on the forward side (_place)."""
    stages = program.tasks.keys() if stages is None else stages
    tasks = {**program.tasks, **{s: _place(program, choices, s, program.tasks[s]) for s in stages}}
    return replace(program, recompute=dict(choices), tasks=tasks)


def recompute_all_pairs(program, mode: str):
    """`program` with every recomputable pair of every stage recomputed under `mode`
    (selective or full) and its RECs placed: insert_recovery under a fixed policy."""
    return with_recovery(program, {k: mode for s in range(len(program.stages))
                                   for k in stage_keys(program, s)})


def _place(program, choices: dict, stage: int, tasks) -> tuple[Task, ...]:
    """REC tasks of micro-batch m go before RECV_B m (ratrain: forward side, in the wait
    for the gradient). In baseline mode, on the last stage and for the micro-batches auto
    leaves to B there are none: B rebuilds each layer right before its backward (see NOTE
    [backward-time recovery], layer_buffers.py)."""
    if stage_recovers_in_backward(program, stage):
        return tuple(tasks)
    out: list[Task] = []
    for task in tasks:
        if task.kind == Kind.RECV_B and not recovers_in_backward(program, stage,
                                                                 task.micro_batch):
            out += [Task(stage, Kind.REC, micro_batch=task.micro_batch, layer=l)
                    for l in program.stages[stage] if (l, task.micro_batch) in choices]
        out.append(task)
    return tuple(out)
