"""schedule_1f1b: the per-stage order of forwards, backwards and their pipeline comms.

Runs after partition_stages and before the lifecycle passes (insert_recovery,
insert_grad_sync, ...), which add tasks around the F/B skeleton built here. Assumes a
non-interleaved pipeline: stage s holds one contiguous block of layers, rank == stage.
"""
from __future__ import annotations

from ratrain.ir.tasks import Kind, Schedule, Task


def schedule_1f1b(num_stages: int, num_micro_batches: int) -> Schedule:
    """Non-interleaved 1F1B order for every stage, with SEND/RECV around each F and B.

    Requires num_stages >= 1 and num_micro_batches >= 1.
    Guarantees: each (stage, micro_batch) has exactly one F and one B, in micro-batch
    order; stage s runs warmup_forwards(s) forwards first, then alternates F and B, then
    drains the remaining B's (NOTE [1F1B warm-up count]); at most min(P - s, M)
    activations are in flight on stage s; every SEND has exactly one matching RECV on
    the neighbour stage, and the dry run finds no deadlock.
    """
    if num_stages < 1 or num_micro_batches < 1:
        raise ValueError(f"schedule_1f1b needs num_stages >= 1 and num_micro_batches >= 1, "
                         f"got {num_stages} and {num_micro_batches}")
    return {stage: _stage_program(stage, num_stages, num_micro_batches)
            for stage in range(num_stages)}


# NOTE [1F1B warm-up count]:
# The last stage can run B(m) right after F(m): warm-up 0. Stage s must stay one
# micro-batch ahead of stage s + 1 in forwards: when s + 1 starts its first backward,
# the gradient for mb 0 still needs one more hop (and one more time slot) to come back
# to s, and s fills that slot with one more forward. So warmup(s) = warmup(s + 1) + 1 =
# P - s - 1, capped at M since there are only M micro-batches. After the warm-up each
# steady-state round does one F then one B, so stage s holds at most warmup(s) + 1 =
# min(P - s, M) micro-batches of activations; stage 0 is the memory-heaviest. With unit
# F/B times and free comms the step then takes 2 (M + P - 1) slots, of which each stage
# is busy 2 M: bubble fraction (P - 1) / (M + P - 1).
def warmup_forwards(stage: int, num_stages: int, num_micro_batches: int) -> int:
    """Forwards stage runs before its first backward (NOTE [1F1B warm-up count])."""
    return min(num_stages - stage - 1, num_micro_batches)


def compute_order(stage: int, num_stages: int, num_micro_batches: int) -> list[Task]:
    """Just the F and B tasks of one stage, in 1F1B order."""
    warmup = warmup_forwards(stage, num_stages, num_micro_batches)
    forward = [Task(stage, Kind.F, micro_batch=m) for m in range(num_micro_batches)]
    backward = [Task(stage, Kind.B, micro_batch=m) for m in range(num_micro_batches)]
    steady = [task for pair in zip(forward[warmup:], backward) for task in pair]
    return forward[:warmup] + steady + backward[num_micro_batches - warmup:]


def _stage_program(stage: int, num_stages: int, num_micro_batches: int) -> tuple[Task, ...]:
    program = []
    for task in compute_order(stage, num_stages, num_micro_batches):
        program += with_comms(task, num_stages)
    return tuple(program)


def with_comms(task: Task, num_stages: int) -> list[Task]:
    """Wrap an F or B with the receive it waits for and the send it feeds."""
    first, last = task.stage == 0, task.stage == num_stages - 1
    if task.kind == Kind.F:
        recv, send, skip_recv, skip_send = Kind.RECV_F, Kind.SEND_F, first, last
    else:
        recv, send, skip_recv, skip_send = Kind.RECV_B, Kind.SEND_B, last, first
    before = [] if skip_recv else [Task(task.stage, recv, micro_batch=task.micro_batch)]
    after = [] if skip_send else [Task(task.stage, send, micro_batch=task.micro_batch)]
    return before + [task] + after
