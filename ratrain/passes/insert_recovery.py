"""insert_recovery: keep or drop-and-recompute each (layer, micro-batch)'s activations.

Runs after schedule_1f1b (it needs the F/B order) and before the lifecycle passes, which
only append tasks at the step end. Policies decide which residuals a layer keeps; the
rest is rebuilt. In `ratrain` mode a REC task does it on the forward side, before the
RECV_B its backward waits for (forward-side recovery); in `baseline` mode and on the last
stage the backward recomputes each layer right before differentiating it. The RECs are
placed by recovery_tasks.py; auto's budget search measures its candidates with the SYNCs
and UPDs of later passes placed early (what_if.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ratrain.ir.tasks import Kind, Task
from ratrain.passes import what_if
from ratrain.passes.buffers import stage_peak
from ratrain.passes.layer_buffers import stage_recovers_in_backward
from ratrain.passes.plan_memory import stage_arena_bytes
from ratrain.passes.recovery_tasks import recompute_all_pairs, stage_keys, with_recovery
from ratrain.passes.residuals import recompute_flops

RECOMPUTE_LEVELS = ("none", "selective", "full")  # least recompute first


def auto_recompute_level(fits: Callable[[str], bool]) -> str:
    """The level auto recomputes a stage's pairs at: the least of RECOMPUTE_LEVELS at
    which the stage fits, else full (which then recomputes the most it can). The one
    rule: the compiler asks its searched programs (_escalate), the planner's estimate its
    closed form (planner/memory_estimate.py); within the level each keeps the pairs it
    can one level lower. Requires: `fits(level)` says whether the stage fits with its
    pairs escalated to `level`; asked in order, none then selective."""
    return next((level for level in RECOMPUTE_LEVELS[:-1] if fits(level)),
                RECOMPUTE_LEVELS[-1])


def _stage_fits(program, stage: int, choices: dict, exact: bool) -> bool:
    candidate = what_if.with_syncs_and_updates(with_recovery(program, choices, [stage]))
    if stage_peak(candidate, stage) > program.options.budget:
        return False  # the arena is never smaller than the peak
    if not exact:
        return True
    return stage_arena_bytes(candidate, stage) <= program.options.budget


def _escalate(program, stage: int, base: dict) -> dict:
    """The least recompute of one stage that fits: (layer, mb) pairs escalate none ->
    selective -> full in a fixed order, to the level auto_recompute_level picks; within
    it the shortest prefix of pairs at the level (_least_prefix)."""
    keys = stage_keys(program, stage)
    searched = {"none": base}

    def least(level: str) -> dict:
        if level not in searched:
            searched[level] = _least_prefix(program, stage, keys, base, level)
        return searched[level]
    return least(auto_recompute_level(
        lambda level: _stage_fits(program, stage, least(level), exact=True)))


def _least_prefix(program, stage: int, keys: list, base: dict, level: str) -> dict:
    """`base` with the shortest prefix of `keys` at `level` (the rest one level lower)
    that fits: bisection on the live-bytes peak, then the prefix grows until the packed
    arena fits too (all of `keys` at `level` if none does)."""
    trial = lambda n: {**base, **{k: level for k in keys[:n]},
                       **{k: "selective" for k in keys[n:] if level == "full"}}
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _stage_fits(program, stage, trial(mid), False) else (mid + 1, hi)
    while lo < len(keys) and not _stage_fits(program, stage, trial(lo), exact=True):
        lo += 1
    return trial(lo)


# NOTE [where recovery runs]: auto decides, per stage, whether recovery runs on the
# forward side (REC tasks, ratrain mode) or in B (NOTE [backward-time recovery]).
# 1. Why both. A forward-side REC rebuilds all of a micro-batch's layers before its B and
#    keeps them alive through it, so under a tight budget it can need more recompute than
#    recovering in B: measured on the tiny model with 8 layers, PP=2 and 4 micro-batches
#    under the budget where every pair just fits fully recomputed on the forward side,
#    B-time recovery fits with 5 of stage 0's 16 pairs only selectively recomputed, and
#    the ranks' compute per step was 22% longer on average with forward-side recovery.
# 2. The rule. Recovery runs where it costs less (_recovery_cost: the RECs' seconds under
#    the program's cost model, or their FLOPs without one; on the forward side under
#    ZeRO-3 also the view all-gathers of RECs apart from their B): on the forward side
#    when that costs no more than B-time recovery plus one micro-batch of the stage's
#    layers fully recomputed; else it takes B-time recovery's choices and moves
#    micro-batches to the forward side from the last one down while the stage still fits
#    (the last ones have the fewest micro-batches in flight, and a REC in the wait before
#    the last B is the one that shortens the pipeline's drain).
# 3. The margin is the grain of the two searches: both escalate pairs micro-batch by
#    micro-batch and stop inside one, so costs closer than a micro-batch are a tie. Broken
#    by where each search stopped, the tie flipped with the micro-batch count: qwen2.5-32b
#    (pp 16 x dp 16, zb1, scatter) had stages 7-12 recover in B at some counts from 19 to
#    42 and on the forward side at others, 0.04-0.22 TFLOP apart, so the instances of its
#    periodic step never repeated (NOTE [periodic steps]); tiny at pp 3 did the same at
#    odd and even counts (tests/passes/test_recovery_placement.py). The tie goes to the
#    forward side, whose RECs can fill idle time. Simulated on mt3000 for llama2-7b at
#    pp 3 x dp 256 and 16 micro-batches under 20 GB, ZeRO 2 and zb1, its stage 0
#    recomputes 9.1 TFLOP more on the forward side (within the margin) and the step is
#    122.1 s against 124.2 s.
# 4. The gathers: on the same program under ZeRO-3 the two sides recompute the same
#    selective pairs to within a micro-batch, but the forward side's RECs gather every
#    view but the last layer's once more per micro-batch: 114.7 s against B-time's
#    103.4 s under zb1, 119.2 against 106.7 under 1f1b. Charged, they leave recovery in B.
# 5. The bound. The recompute is then at most one micro-batch of the stage's layers more
#    than the baseline's, and forward-side recovery runs wherever the memory allows.


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
    forward_cost = _recovery_cost(program, stage, forward, forward_side=True)
    backward_cost = _recovery_cost(program, stage, backward, forward_side=False)
    if fits and forward_cost <= backward_cost + _grain(program, stage):
        return replace(program, recompute=forward)
    return _forward_where_it_fits(replace(in_backward, recompute=backward), stage)


def _recovery_cost(program, stage: int, choices: dict, forward_side: bool) -> float:
    """What recovering `stage`'s pairs in `choices` costs: under the program's cost model
    the seconds of their RECs and, on the forward side under ZeRO-3, of the view
    all-gathers they add (a REC uses its layer's view apart from its B, except the stage's
    last layer, whose REC runs right before the B and shares its gather: NOTE [ZeRO-3
    lifecycle], insert_gathers.py); without a cost model the FLOPs recomputed."""
    chosen = replace(program, recompute=choices)
    pairs = [(l, m) for l, m in choices if l in program.stages[stage]]
    if program.cost_model is None:
        return float(sum(recompute_flops(chosen, l, m) for l, m in pairs))
    cost, last = program.cost_model(chosen), program.stages[stage][-1]
    gathers = [(l, m) for l, m in pairs if l != last] \
        if forward_side and program.options.zero == 3 else []
    return sum(cost(Task(stage, Kind.REC, micro_batch=m, layer=l)) for l, m in pairs) + \
        sum(cost(Task(stage, Kind.GATH_R, micro_batch=m, layer=l)) for l, m in gathers)


def _grain(program, stage: int) -> float:
    """One micro-batch of `stage`'s layers fully recomputed, in _recovery_cost's unit: how
    far apart two _escalate searches can stop (NOTE [where recovery runs])."""
    one = {(l, m): "full" for l, m in stage_keys(program, stage) if m == 0}
    return _recovery_cost(program, stage, one, forward_side=False)


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
        return with_recovery(chosen, chosen.recompute)
    if policy == "none":
        return with_recovery(program, {})
    return recompute_all_pairs(program, policy)
