"""insert_recovery: keep or drop-and-recompute each (layer, micro-batch)'s activations.

Runs after schedule_1f1b (it needs the F/B order) and before the lifecycle passes, which
only append tasks at the step end. Policies decide which residuals a layer keeps; a REC
task rebuilds the rest. In `ratrain` mode a REC goes on the forward side, before the
RECV_B its backward waits for (forward-side recovery); in `baseline` right before the B.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ratrain.ir.rules import lookup_rule
from ratrain.ir.tasks import Kind, Task


@lru_cache(maxsize=1024)
def kept_mask(kind, mode: str) -> tuple[bool, ...]:
    """Which of a layer kind's residuals survive from F to B under `mode`.

    none: all; full: only the layer's inputs; selective: inputs and GEMM outputs (the
    expensive values), recomputing norms, RoPE, attention and SwiGLU from them.
    """
    inputs = {v.id for v in kind.fwd.inputs}
    gemm_outputs = {o.id for n in kind.fwd.nodes
                    if (lookup_rule(n.op).kernel or "") == "gemm" for o in n.outputs}
    keep = {"none": lambda r: True, "full": lambda r: r.id in inputs,
            "selective": lambda r: r.id in inputs or r.id in gemm_outputs}[mode]
    return tuple(keep(r) for r in kind.residuals)


def _recomputable(program) -> set[int]:
    return {l.index for l in program.graph.layers if l.kind == "decoder"}


def _stage_keys(program, stage: int) -> list[tuple[int, int]]:
    decoders = _recomputable(program)
    return [(l, m) for m in range(program.options.micro_batches)
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
    candidate = _apply(program, choices, [stage])
    if stage_peak(candidate, stage) > program.options.budget:
        return False  # the arena is never smaller than the peak
    if not exact:
        return True
    from ratrain.passes.plan_memory import plan_stage
    return plan_stage(candidate, stage)[1].arena_bytes <= program.options.budget


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


def _auto(program) -> dict:
    """The least recompute that fits the budget, stage by stage (stages do not share
    memory, so each is searched on its own)."""
    if program.options.budget is None:
        return {}
    choices: dict = {}
    for stage in range(len(program.stages)):
        choices = _escalate(program, stage, choices)
    return choices


def _place(program, choices: dict, stage: int, tasks) -> tuple[Task, ...]:
    """REC tasks of micro-batch m go before RECV_B m (ratrain: forward side, in the wait
    for the gradient) or right before B m (baseline, and the last stage)."""
    forward_side = program.options.schedule == "ratrain" and stage < len(program.stages) - 1
    anchor = Kind.RECV_B if forward_side else Kind.B
    out: list[Task] = []
    for task in tasks:
        if task.kind == anchor:
            out += [Task(stage, Kind.REC, micro_batch=task.micro_batch, layer=l)
                    for l in program.stages[stage] if (l, task.micro_batch) in choices]
        out.append(task)
    return tuple(out)


def insert_recovery(program):
    """Choose keep / recompute per (layer, micro-batch) and place REC tasks.

    Requires: stages and the 1F1B tasks. Guarantees: `program.recompute` maps every
    dropped (layer, mb) to its mode; each has one REC before its B (before the RECV_B
    in ratrain mode); only decoder layers are recomputed.
    """
    policy = program.options.recompute
    if policy == "auto":
        choices = _auto(program)
    elif policy == "none":
        choices = {}
    else:
        choices = {k: policy for s in range(len(program.stages)) for k in _stage_keys(program, s)}
    return _apply(program, choices)
