"""What-if programs: a program as later passes would make it, or as other options would,
built only to be measured. PIPELINE is the whole truth of what runs in what order; a pass
that must ask a memory question about a program it has not made yet asks one of these
(choose_grad_accumulation and insert_recovery's budget search, before insert_grad_sync
and insert_update run; plan_memory's budget error, for what would help). None of them is
ever a pass's output.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.ir.tasks import GATHERS, Kind
from ratrain.passes.insert_gathers import insert_gathers
from ratrain.passes.insert_grad_sync import insert_grad_sync
from ratrain.passes.insert_update import insert_update
from ratrain.passes.recovery_tasks import recompute_all_pairs, stage_keys, with_recovery


def with_syncs_and_updates(program):
    """`program` with its SYNCs and UPDs placed unless it has them, for memory questions
    asked before those passes run (recovery's budget search, choose_grad_accumulation):
    a ZeRO-2 SYNC's shard lives from where the list starts the SYNC (see NOTE [sync issue
    point]) to the UPD reading it. It is placed under after-norm (so are its options):
    the commit rule's undo copies stay NOTE [update rule fallback]'s question, as before."""
    if any(t.kind == Kind.SYNC for ts in program.tasks.values() for t in ts):
        return program
    options = replace(program.options, update_rule="after-norm")
    return insert_update(insert_grad_sync(replace(program, options=options)))


def recompute_everything(program, stage: int):
    """`program` with every recomputable (layer, mb) of `stage` fully recomputed (what
    choose_grad_accumulation asks: does the stage fit under any recompute policy?)."""
    return with_recovery(program, {k: "full" for k in stage_keys(program, stage)}, [stage])


def under_recompute_full(program):
    """The same program under --recompute full (the budget error's first fix): every
    decoder activation recomputed, REC tasks re-placed, and under ZeRO-3 the gathers of
    their uses (see NOTE [ZeRO-3 lifecycle]): what insert_recovery and insert_gathers make
    of it."""
    options = replace(program.options, recompute="full", budget=None)
    tasks = {s: tuple(t for t in ts if t.kind not in (Kind.REC, Kind.FREE, *GATHERS))
             for s, ts in program.tasks.items()}
    bare = replace(program, options=options, tasks=tasks, recompute={},
                   backward_recovery=frozenset())
    return insert_gathers(recompute_all_pairs(bare, "full"))


def under_zero(program, zero: int):
    """The same program under --zero `zero` (the budget error's ZeRO fixes): at 1 or 2 the
    same tasks with smaller shards; at 3 no PREF and a GATH per use of a view (see NOTE
    [ZeRO-3 lifecycle])."""
    options = replace(program.options, zero=zero)
    if zero < 3:
        return replace(program, options=options)
    tasks = {s: tuple(t for t in ts if t.kind not in (Kind.PREF, Kind.FREE))
             for s, ts in program.tasks.items()}
    return insert_gathers(replace(program, options=options, tasks=tasks))
