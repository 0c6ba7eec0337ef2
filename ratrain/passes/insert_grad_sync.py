"""insert_grad_sync: one SYNC per layer per step, issued after the layer's last backward.

Runs after insert_recovery (the F/B/REC order is final). In `ratrain` mode each SYNC[L]
is a non-blocking collective issued as soon as layer L's part of the step's last B is
done (NOTE [sync issue point]); in `baseline` the syncs run blocking at the step end.
All-reduce under ZeRO 0/1, reduce-scatter under ZeRO 2, over the stage's DP group.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task

# NOTE [sync issue point]: a stage's B runs its layers last to first, so in the task list
# the SYNCs follow the step's last B in reverse layer order. The runtime
# (rt/executor.early_syncs) and the simulator issue SYNC[L] when layer L's backward
# inside that B has finished, so communication of later layers overlaps the backward of
# earlier ones; plan_memory therefore gives a ZeRO-2 shard its bytes from that B on. The baseline starts them only
# after every task of the stage is done, and waits for each.


def last_backward_index(tasks) -> int:
    return max(i for i, t in enumerate(tasks) if t.kind == Kind.B)


def syncs_started_in_backward(tasks, waits_only) -> tuple[int | None, list[int]]:
    """NOTE [sync issue point]: (index of the step's last B, indices of the SYNCs right
    after it that start inside it). `waits_only(i)`: SYNC i only waits for the
    per-micro-batch reduce-scatters; it stays in place (waiting early would stall B)."""
    if not any(t.kind == Kind.B for t in tasks):
        return None, []
    if any(t.kind == Kind.W for t in tasks):  # zb1: each SYNC starts where the list puts it
        return last_backward_index(tasks), []
    last, syncs = last_backward_index(tasks), []
    for i in range(last + 1, len(tasks)):
        if tasks[i].kind not in (Kind.SYNC, Kind.SEND_B, Kind.FREE):
            break
        if tasks[i].kind == Kind.SYNC and not waits_only(i):
            syncs.append(i)
    return last, syncs


def last_weight_indices(tasks) -> dict[int, int]:
    """layer -> index of its step's last W (zb1 programs; NOTE [zb1 schedule])."""
    return {t.layer: i for i, t in enumerate(tasks) if t.kind == Kind.W}


def _after_last_weights(stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    """NOTE [zb1 schedule]: SYNC[L] right after the step's last W of layer L."""
    last = {i: layer for layer, i in last_weight_indices(tasks).items()}
    out = []
    for i, task in enumerate(tasks):
        out.append(task)
        if i in last:
            out.append(Task(stage, Kind.SYNC, layer=last[i]))
    return tuple(out)


def _with_syncs(program, stage: int, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    syncs = [Task(stage, Kind.SYNC, layer=l) for l in reversed(program.stages[stage])]
    if program.options.schedule == "baseline":
        return tasks + tuple(syncs)
    if program.options.pipeline_schedule == "zb1":
        return _after_last_weights(stage, tasks)
    at = last_backward_index(tasks) + 1
    if at < len(tasks) and tasks[at].kind == Kind.SEND_B:
        at += 1  # the gradient the previous stage waits for goes out first
    return tasks[:at] + tuple(syncs) + tasks[at:]


def insert_grad_sync(program):
    """Add SYNC[L] for every layer L of every stage.

    Requires: F/B(/W) tasks (and RECs) in final order. Guarantees: each layer has
    exactly one SYNC; in ratrain mode the stage's SYNCs directly follow its last B (and
    that B's SEND_B, which the previous stage waits for), or under zb1 each SYNC[L] its
    layer's last W; in baseline mode they end the stage's list.
    """
    tasks = {s: _with_syncs(program, s, ts) for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)
