"""insert_gathers: under ZeRO-3, all-gather each layer's view right before it is used.

Runs after insert_prefetch (last of the task-placing passes; under ZeRO-3 there is no
PREF). Each rank keeps only its shard of a layer; the full view lives in one of a ring of
`zero3_prefetch + 1` view slots (`zview.<k>`, persistent, sized for the stage's largest
layer view) and is gathered into it once per use (NOTE [ZeRO-3 lifecycle]).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ratrain.ir.buffers import BufferKind, buffer_name
from ratrain.ir.tasks import GATHERS, Kind, Task

# NOTE [ZeRO-3 lifecycle]: a stage's *uses* of layer views are, in task order, every
# (F, layer) in layer order, every (REC[L], L) and every (B, layer) in reverse layer
# order. Consecutive uses of the same layer (the last stage's F then B of one
# micro-batch, a REC right before its B) share one gather. Gather g writes view slot
# g mod S (S = zero3_prefetch + 1 slots) and is *issued* right after the last use of
# gather g - S, the slot's previous tenant, has finished (the first S gathers at the
# step start): so up to S - 1 gathers are in flight on the DP link while a layer
# computes, and with zero3_prefetch = 0 each gather starts only when its use is next
# (the GPU-style "gather at use"). `lower` puts a gather's `gather_view` call (cast the
# master shard, non-blocking all-gather) inside the task holding its issue point, right
# after the last call of the layer whose use frees the slot; only the first S gathers are
# calls of their own GATH rows. So the runtime, the reference executor and the simulator
# all start it there, and the hazard rule completes it right before its first use
# touches the slot. In the task list a GATH task stands right before the first task that
# uses it (plan_memory and the verifier see it there). The slot is free again (its view
# dead) after the gather's last use: the next gather into it starts there.
# Memory: S slots of the stage's largest view replace ZeRO-2's persistent view of every
# layer, in the `views` category of the plan.

USE_KINDS = {Kind.F: Kind.GATH_F, Kind.REC: Kind.GATH_R, Kind.B: Kind.GATH_B}


@dataclass(frozen=True)
class Gather:
    task: Task                          # the GATH task (named after its first use)
    slot: int                           # view slot k (buffer zview.k) it writes
    uses: tuple                         # (use task, layer) pairs it serves, in order
    after: tuple | None                 # (use task, layer) it is issued after; None = step start


def view_slot_count(program) -> int:
    """S: how many view slots a ZeRO-3 stage keeps (NOTE [ZeRO-3 lifecycle])."""
    return program.options.zero3_prefetch + 1


def view_uses(program, stage: int, tasks) -> tuple:
    """(task, layer) of every use of a layer view on the stage, in execution order."""
    layers, uses = program.stages[stage], []
    for task in tasks:
        if task.kind == Kind.F:
            uses += [(task, l) for l in layers]
        elif task.kind == Kind.B:
            uses += [(task, l) for l in reversed(layers)]
        elif task.kind == Kind.REC:
            uses.append((task, task.layer))
    return tuple(uses)


def gather_plan(program, stage: int, tasks=None) -> tuple[Gather, ...]:
    """The stage's gathers over `tasks` (default: its task list); empty unless ZeRO-3."""
    if program.options.zero != 3:
        return ()
    return _indexed(program, stage, tasks).plan


@dataclass(frozen=True)
class _Indexed:
    tasks: tuple                        # the task list planned (kept alive: ids stay unique)
    plan: tuple                         # its Gathers
    slots: dict                         # (use task, layer) -> view slot
    gathers: dict                       # GATH task -> its Gather
    issued_in: dict                     # task -> the Gathers issued inside it, in order


_RECENT: dict = {}                      # (id(tasks), stage, S) -> _Indexed, a few kept


def _indexed(program, stage: int, tasks) -> _Indexed:
    """The plan of a task list with its lookups, cached by the list's identity: the memory
    passes ask for a slot per (task, layer) and rehashing the uses each time is quadratic."""
    tasks = program.tasks[stage] if tasks is None else tuple(tasks)
    key = (id(tasks), stage, view_slot_count(program), tuple(program.stages[stage]))
    hit = _RECENT.get(key)
    if hit is None or hit.tasks is not tasks:
        plan = _plan(view_uses(program, stage, tasks), view_slot_count(program))
        issued_in: dict = {}
        for g in plan:
            if g.after is not None:
                issued_in.setdefault(g.after[0], []).append(g)
        hit = _Indexed(tasks, plan, {use: g.slot for g in plan for use in g.uses},
                       {g.task: g for g in plan}, issued_in)
        if len(_RECENT) >= 64:
            _RECENT.pop(next(iter(_RECENT)))
        _RECENT[key] = hit
    return hit


@lru_cache(maxsize=64)
def _plan(uses: tuple, slots: int) -> tuple[Gather, ...]:
    groups: list[list] = []
    for use in uses:
        if groups and groups[-1][-1][1] == use[1]:
            groups[-1].append(use)       # same layer again: share the gather
        else:
            groups.append([use])
    return tuple(Gather(Task(first.stage, USE_KINDS[first.kind], layer=layer,
                             micro_batch=first.micro_batch),
                        g % slots, tuple(group),
                        groups[g - slots][-1] if g >= slots else None)
                 for g, group in enumerate(groups) for first, layer in [group[0]])


def view_slot(program, stage: int, task: Task, layer: int) -> int:
    """The slot holding `layer`'s view when `task` uses it (ZeRO-3)."""
    return _indexed(program, stage, None).slots[(task, layer)]


def view_buffer(program, task: Task, layer: int) -> str:
    """Name of the buffer `task` reads `layer`'s parameters from: the persistent view.L
    under ZeRO 0-2, the layer's gathered view slot under ZeRO-3."""
    if program.options.zero != 3:
        return buffer_name(BufferKind.VIEW, layer=layer)
    return buffer_name(BufferKind.ZVIEW, slot=view_slot(program, task.stage, task, layer))


def gathers_issued_in(program, task: Task) -> list[Gather]:
    """The gathers issued inside `task` (after one of its layers' use), in order."""
    if program.options.zero != 3:
        return []
    return _indexed(program, task.stage, None).issued_in.get(task, [])


def gather_of(program, task: Task) -> Gather:
    """The plan entry of a GATH task."""
    gather = _indexed(program, task.stage, None).gathers.get(task)
    if gather is None:
        raise ValueError(f"{task} is not a gather of stage {task.stage}'s plan")
    return gather


def _with_gathers(program, stage: int, tasks) -> tuple[Task, ...]:
    before: dict[Task, list[Task]] = {}
    for g in gather_plan(program, stage, tasks):
        before.setdefault(g.uses[0][0], []).append(g.task)
    out: list[Task] = []
    for task in tasks:
        out += before.get(task, []) + [task]
    return tuple(out)


def insert_gathers(program):
    """Add a GATH task per ZeRO-3 gather (NOTE [ZeRO-3 lifecycle]).

    Requires: every task that uses a view (F, REC, B) in final order. Guarantees: a no-op
    unless ZeRO-3; under it every use of a view is served by exactly one gather, whose
    GATH stands right before the first task using it and after the last use of the
    previous gather into its slot (verify_gathers).
    """
    if program.options.zero != 3:
        return program
    tasks = {s: _with_gathers(program, s, tuple(t for t in ts if t.kind not in GATHERS))
             for s, ts in program.tasks.items()}
    return replace(program, tasks=tasks)


class GatherError(ValueError):
    """A ZeRO-3 view used without its gather, or a slot overwritten while in use."""


def verify_gathers(program) -> None:
    """Raise GatherError unless, on every stage: GATH tasks appear only under ZeRO-3 and
    then are exactly the plan's; each precedes the first task using its view, and follows
    the last task using the previous view of its slot (so no view is overwritten before
    its last use). No-op before insert_gathers (no GATH task and no use yet planned)."""
    for stage, tasks in program.tasks.items():
        present = [t for t in tasks if t.kind in GATHERS]
        if program.options.zero != 3:
            if present:
                raise GatherError(f"stage {stage}: {present[0]} but the program is not ZeRO-3")
            continue
        if present:
            _check_stage(program, stage, tasks, present)


def _check_stage(program, stage: int, tasks, present) -> None:
    plan = gather_plan(program, stage)
    expected = [g.task for g in plan]
    if sorted(map(str, present)) != sorted(map(str, expected)):
        missing = sorted(set(map(str, expected)) - set(map(str, present)))
        extra = sorted(set(map(str, present)) - set(map(str, expected)))
        raise GatherError(f"stage {stage}: gathers missing {missing or 'none'}, "
                          f"unplanned {extra or 'none'}")
    index = {t: i for i, t in enumerate(tasks)}
    for g, gather in enumerate(plan):
        first_use = gather.uses[0][0]
        if index[gather.task] > index[first_use]:
            raise GatherError(f"stage {stage}: {first_use} uses L{gather.uses[0][1]}'s "
                              f"view before its gather {gather.task}")
        tenant = plan[g - view_slot_count(program)] if gather.after is not None else None
        for use, layer in tenant.uses if tenant else ():
            # the hand-over inside the first-use task itself happens between its layers
            if use != first_use and index[use] > index[gather.task]:
                raise GatherError(f"stage {stage}: {gather.task} overwrites view slot "
                                  f"{gather.slot} before {use} has used L{layer} in it")
