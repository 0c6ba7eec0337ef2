"""lower_comms: post every pipeline receive early, with a fixed global message order.

Runs right after schedule_pipeline, before any lifecycle task is added, so the receive
buffer's lifetime (from POST) is known to every later pass and to plan_memory. A POST
goes before the compute task that precedes its RECV: the transfer then overlaps that
compute, and the RECV only waits for what has not yet arrived.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task

_POST = {Kind.RECV_F: Kind.POST_F, Kind.RECV_B: Kind.POST_B}
_COMPUTE = {Kind.F, Kind.B, Kind.BL, Kind.W, Kind.REC}


def _with_posts(stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    out: list[Task] = []
    for task in tasks:
        if task.kind in _POST:
            computes = [i for i, t in enumerate(out) if t.kind in _COMPUTE]
            at = computes[-1] if computes else len(out)
            out.insert(at, Task(stage, _POST[task.kind], micro_batch=task.micro_batch))
        out.append(task)
    return tuple(out)


def lower_comms(program):
    """Add a POST before the compute task preceding each RECV.

    Requires: the 1F1B tasks. Guarantees: every RECV has exactly one POST earlier on
    its stage, with at most one compute task between them; SEND/RECV pairs are unchanged.
    """
    return replace(program, tasks={s: _with_posts(s, ts) for s, ts in program.tasks.items()})
