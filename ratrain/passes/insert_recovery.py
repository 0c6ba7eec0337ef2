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


def _apply(program, choices: dict):
    tasks = {s: _place(program, choices, s, ts) for s, ts in program.tasks.items()}
    return replace(program, recompute=dict(choices), tasks=tasks)


def _auto(program) -> dict:
    """The least recompute that fits the budget. Per stage, (layer, mb) pairs escalate
    none -> selective -> full in a fixed order; the shortest prefix that fits is found
    by bisection (peak memory falls as the prefix grows)."""
    from ratrain.passes.buffers import stage_peak
    budget, choices = program.options.budget, {}
    for stage in range(len(program.stages)):
        keys = _stage_keys(program, stage)
        fits = lambda c: stage_peak(_apply(program, c), stage) <= budget
        for mode in ("selective", "full"):
            base = {k: v for k, v in choices.items() if k not in keys}
            trial = lambda n: {**base, **{k: mode for k in keys[:n]},
                               **{k: "selective" for k in keys[n:] if mode == "full"}}
            if budget is None or fits(choices):
                break
            lo, hi = 0, len(keys)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(trial(mid)) else (mid + 1, hi)
            choices = trial(lo)
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
