"""insert_recovery: keep or drop-and-recompute each (layer, micro-batch)'s activations.

Runs after schedule_1f1b (it needs the F/B order) and before the lifecycle passes, which
only append tasks at the step end. Policies decide which residuals a layer keeps; the
rest is rebuilt. In `ratrain` mode a REC task does it on the forward side, before the
RECV_B its backward waits for (forward-side recovery); in `baseline` mode and on the last
stage the backward recomputes each layer right before differentiating it.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import Kind, Task
from ratrain.passes.layer_buffers import recovers_in_backward, stage_recovers_in_backward
from ratrain.passes.residuals import recompute_flops


def _recomputable(program) -> set[int]:
    return {l.index for l in program.graph.layers if l.kind == "decoder"}


def _stage_keys(program, stage: int) -> list[tuple[int, int]]:
    decoders = _recomputable(program)
    return [(l, m) for m in range(program.micro_batches)
            for l in program.stages[stage] if l in decoders]


def _apply(program, choices: dict, stages=None):
    """`program` with `choices` and REC tasks placed (on `stages` only, if given)."""
    stages = program.tasks.keys() if stages is None else stages
    tasks = {**program.tasks, **{s: _place(program, choices, s, program.tasks[s]) for s in stages}}
    return replace(program, recompute=dict(choices), tasks=tasks)


def recompute_everything(program, stage: int):
    """`program` with every recomputable (layer, mb) of `stage` fully recomputed."""
    return _apply(program, {k: "full" for k in _stage_keys(program, stage)}, [stage])


def _stage_fits(program, stage: int, choices: dict, exact: bool) -> bool:
    from ratrain.passes.buffers import stage_peak
    from ratrain.passes.insert_update import with_syncs_and_updates
    candidate = with_syncs_and_updates(_apply(program, choices, [stage]))
    if stage_peak(candidate, stage) > program.options.budget:
        return False  # the arena is never smaller than the peak
    if not exact:
        return True
    from ratrain.passes.plan_memory import stage_arena_bytes
    return stage_arena_bytes(candidate, stage) <= program.options.budget


def _escalate(program, stage: int, base: dict) -> dict:
    """The least recompute of one stage that fits: (layer, mb) pairs escalate none ->
    selective -> full in a fixed order; bisection on the live-bytes peak finds the
    shortest prefix, then the prefix grows until the packed arena fits too."""
    keys = _stage_keys(program, stage)
    choices = base
    for mode in ("selective", "full"):
        trial = lambda n: {**base, **{k: mode for k in keys[:n]},
                           **{k: "selective" for k in keys[n:] if mode == "full"}}
        if _stage_fits(program, stage, choices, exact=True):
            return choices
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _stage_fits(program, stage, trial(mid), False) else (mid + 1, hi)
        while lo < len(keys) and not _stage_fits(program, stage, trial(lo), exact=True):
            lo += 1
        choices = trial(lo)
    return choices


# NOTE [where recovery runs]: a forward-side REC (ratrain mode) rebuilds all of a
# micro-batch's layers before its B and keeps them alive through it, so under a tight
# budget it can need more recompute than recovering in B (NOTE [backward-time recovery]):
# measured on the tiny model with 8 layers, PP=2 and 4 micro-batches under the budget
# where every pair just fits fully recomputed on the forward side, B-time recovery fits
# with 5 of stage 0's 16 pairs only selectively recomputed, and the ranks' compute per
# step was 22% longer on average with forward-side recovery. So auto decides, per stage, where
# recovery runs: on the forward side when that recomputes no more FLOPs than B-time
# recovery; else it takes B-time recovery's choices and moves micro-batches to the
# forward side from the last one down while the stage still fits (the last ones have
# the fewest micro-batches in flight, and a REC in the wait before the last B is the one
# that shortens the pipeline's drain). The recompute is then never more than the
# baseline's, and forward-side recovery runs wherever the memory allows.

def _auto(program):
    """The least recompute that fits the budget, stage by stage (stages do not share
    memory, so each is searched on its own), and where it runs (NOTE [where recovery
    runs]): `program` with its recompute choices and backward_recovery set."""
    if program.options.budget is None:
        return program
    for stage in range(len(program.stages)):
        program = _auto_stage(program, stage)
    return program


def _auto_stage(program, stage: int):
    forward = _escalate(program, stage, program.recompute)
    own = {k: v for k, v in forward.items() if k not in program.recompute}
    if not own or stage_recovers_in_backward(program, stage):
        return replace(program, recompute=forward)
    everything = frozenset((stage, m) for m in range(program.micro_batches))
    in_backward = replace(program, backward_recovery=program.backward_recovery | everything)
    backward = _escalate(in_backward, stage, program.recompute)
    # _escalate's choice fits unless it recomputes everything fully
    fits = set(own.values()) != {"full"} or _stage_fits(program, stage, forward, exact=True)
    if fits and _flops(program, forward) <= _flops(program, backward):
        return replace(program, recompute=forward)
    return _forward_where_it_fits(replace(in_backward, recompute=backward), stage)


def _flops(program, choices: dict) -> int:
    chosen = replace(program, recompute=choices)
    return sum(recompute_flops(chosen, l, m) for l, m in choices)


def _forward_where_it_fits(program, stage: int):
    """`program` (every micro-batch of `stage` recovered in B) with micro-batches moved to
    the forward side from the last one down while the stage fits."""
    fits = lambda moved, exact: _stage_fits(
        replace(program, backward_recovery=program.backward_recovery - moved), stage,
        program.recompute, exact)
    moved: frozenset = frozenset()
    for m in reversed(range(program.micro_batches)):
        if not fits(moved | {(stage, m)}, exact=False):
            break
        moved |= {(stage, m)}
    while moved and not fits(moved, exact=True):
        moved -= {min(moved)}  # the first micro-batch moved has the most in flight
    return replace(program, backward_recovery=program.backward_recovery - moved)


def _place(program, choices: dict, stage: int, tasks) -> tuple[Task, ...]:
    """REC tasks of micro-batch m go before RECV_B m (ratrain: forward side, in the wait
    for the gradient). In baseline mode, on the last stage and for the micro-batches auto
    leaves to B there are none: B rebuilds each layer right before its backward (NOTE
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


def insert_recovery(program):
    """Choose keep / recompute per (layer, micro-batch) and place REC tasks.

    Requires: stages and the 1F1B tasks. Guarantees: `program.recompute` maps every
    dropped (layer, mb) to its mode; where recovery runs on the forward side (ratrain
    mode, not the last stage, (stage, mb) not in `program.backward_recovery`, which only
    auto fills) each has one REC before its RECV_B, elsewhere none (B recomputes); only
    decoder layers are recomputed.
    """
    policy = program.options.recompute
    program = replace(program, recompute={}, backward_recovery=frozenset())
    if policy == "auto":
        chosen = _auto(program)
        return _apply(chosen, chosen.recompute)
    if policy == "none":
        return _apply(program, {})
    return _apply(program, {k: policy for s in range(len(program.stages))
                            for k in _stage_keys(program, s)})
