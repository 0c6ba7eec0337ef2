"""plan_memory: exact buffer lifetimes, FREE at last use, arena offsets, peak vs budget.

Runs after every pass that adds or moves tasks and before lower. It sees buffers only
through buffers.task_effects and persistent_buffers, so it is generic over task kinds.
One arena per stage: every DP replica of a stage runs the same tasks and the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ratrain.ir.tasks import Kind, Task
from ratrain.units import format_bytes  # noqa: F401  (re-exported)
from ratrain.passes import what_if
from ratrain.passes.buffers import CATEGORIES, Buffer, persistent_buffers, task_effects
from ratrain.ir.buffers import BufferKind, arena_name, parse_buffer
# the arena's alignment is layout.py's (set there, with the tensors' inside buffers)
from ratrain.passes.layout import ARENA_ALIGN as ALIGNMENT, arena_align as align


class MemoryBudgetError(ValueError):
    """The program needs more memory per rank than --budget allows; the message says why."""


@dataclass(frozen=True)
class Span:
    buffer: Buffer                      # what lives
    first: int                          # index of the creating task (0 if persistent)
    last: int                           # index of the last task that reads it
    persistent: bool                    # lives all step: never freed


@dataclass(frozen=True)
class StageMemory:
    arena_bytes: int                    # arena size: max offset + nbytes
    peak_bytes: int                     # most bytes live during any one task
    peak_task: int                      # index (in the final tasks) of the first peak task
    peak_task_name: str                 # its text form, e.g. "0B0"
    offsets: dict                       # buffer name -> (arena offset, nbytes)
    lifetimes: dict                     # buffer name -> (first, last) task index, inclusive
    categories: dict                    # buffer name -> category (one of CATEGORIES)
    persistent: frozenset               # names that live across steps (never freed)
    timeline: list                      # per task: {category: live bytes}, CATEGORIES order

    def breakdown(self) -> str:
        """The categories live at the peak task, largest first."""
        row = self.timeline[self.peak_task] if self.timeline else {}
        parts = sorted(((b, c) for c, b in row.items() if b), reverse=True)
        return ", ".join(f"{c} {format_bytes(b)}" for b, c in parts) or "nothing"


@dataclass(frozen=True)
class MemoryPlan:
    stages: dict                        # stage -> StageMemory
    budget: int | None                  # usable bytes per rank; None = unlimited

    @property
    def worst_stage(self) -> int:
        return max(self.stages, key=lambda s: (self.stages[s].arena_bytes, -s))

    @property
    def arena_bytes(self) -> int:
        return max((m.arena_bytes for m in self.stages.values()), default=0)

    @property
    def peak_bytes(self) -> int:
        return max((m.peak_bytes for m in self.stages.values()), default=0)

    def report(self) -> str:
        """Per stage: peak (at which task), arena, and the peak broken down by category."""
        budget = format_bytes(self.budget) if self.budget else "unlimited"
        lines = [f"memory plan (budget {budget})"]
        for stage, m in sorted(self.stages.items()):
            lines.append(f"stage {stage}: peak {format_bytes(m.peak_bytes)} at task "
                         f"{m.peak_task} ({m.peak_task_name}), arena {format_bytes(m.arena_bytes)}")
            lines.append("  " + m.breakdown())
        return "\n".join(lines)


def plan_memory(program):
    """Insert FREE tasks at last use, assign arena offsets, check the budget.

    Requires: every stage's final task order (all passes that add or move tasks have
    run); every buffer a task reads is persistent or created by an earlier task.
    Guarantees: each non-persistent buffer gets one FREE right after its last reader
    (right after its creator if never read); buffers whose lifetimes intersect never
    overlap in their stage's arena; offsets are ALIGNMENT-aligned; `program.memory` is
    a MemoryPlan over the returned tasks. Raises MemoryBudgetError if a stage's arena
    exceeds `options.budget`. Idempotent: FREE tasks already present are replanned.
    """
    tasks, stages = {}, {}
    for stage in sorted(program.tasks):
        tasks[stage], stages[stage] = plan_stage(program, stage)
    plan = MemoryPlan(stages, program.options.budget)
    if plan.budget is not None and plan.arena_bytes > plan.budget:
        raise MemoryBudgetError(budget_message(program, plan))
    return replace(program, tasks=tasks, memory=plan)


def unplanned_memory(program) -> MemoryPlan:
    """The MemoryPlan of `program` without the budget check (for pictures of failures)."""
    stages = {stage: plan_stage(program, stage)[1] for stage in sorted(program.tasks)}
    return MemoryPlan(stages, program.options.budget)


def plan_stage(program, stage: int) -> tuple[tuple[Task, ...], StageMemory]:
    """The stage's tasks with FREEs inserted, and its memory plan over them."""
    work = tuple(t for t in program.tasks[stage] if t.kind != Kind.FREE)
    spans = _spans(program, stage, work)
    final, position = _with_frees(stage, work, spans)
    spans = [replace(s, first=0, last=max(len(final) - 1, 0)) if s.persistent else
             replace(s, first=position[s.first], last=position[s.last]) for s in spans]
    timeline = _timeline(spans, len(final))
    totals = [sum(row.values()) for row in timeline]
    peak_task = totals.index(max(totals)) if totals else 0
    memory = StageMemory(
        arena_bytes=0, peak_bytes=max(totals, default=0), peak_task=peak_task,
        peak_task_name=str(final[peak_task]) if final else "",
        offsets=assign_offsets(spans),
        lifetimes={s.buffer.name: (s.first, s.last) for s in spans},
        categories={s.buffer.name: s.buffer.category for s in spans}, timeline=timeline,
        persistent=frozenset(s.buffer.name for s in spans if s.persistent))
    arena = max((o + n for o, n in memory.offsets.values()), default=0)
    return final, replace(memory, arena_bytes=arena)


def stage_arena_bytes(program, stage: int) -> int:
    """The arena plan_stage gives the stage, without its FREEs and timeline (recovery's
    budget search asks it many times): inserting the FREEs renumbers the tasks in order,
    which keeps every order and overlap of lifetimes, so assign_offsets places every
    buffer where it does after them."""
    work = tuple(t for t in program.tasks[stage] if t.kind != Kind.FREE)
    offsets = assign_offsets(_spans(program, stage, work))
    return max((o + n for o, n in offsets.values()), default=0)


def _spans(program, stage: int, tasks) -> list[Span]:
    """Lifetime of every buffer over `tasks` (no FREEs), from task_effects alone."""
    last = max(len(tasks) - 1, 0)
    spans = {b.name: Span(_renamed(b), 0, last, True) for b in persistent_buffers(program, stage)}
    for i, task in enumerate(tasks):
        effects = task_effects(program, task)
        for b in effects.creates:
            if b.name in spans:
                raise ValueError(f"{task} creates {b.name}, which already exists on stage {stage}")
            spans[b.name] = Span(_renamed(b), i, i, False)
        for name in effects.reads:
            if name not in spans:
                raise ValueError(f"{task} reads {name}, which no earlier task on stage "
                                 f"{stage} creates and which is not persistent")
            if not spans[name].persistent:
                spans[name] = replace(spans[name], last=i)
    return list(spans.values())


def _renamed(buffer: Buffer) -> Buffer:
    return replace(buffer, name=arena_name(buffer.name))


def _with_frees(stage: int, tasks, spans) -> tuple[tuple[Task, ...], list[int]]:
    """Tasks with a FREE after each buffer's last use; old index -> new index."""
    frees_after: dict[int, list[Task]] = {}
    for s in spans:
        if not s.persistent:
            frees_after.setdefault(s.last, []).append(Task(stage, Kind.FREE, buffer=s.buffer.name))
    final, position = [], []
    for i, task in enumerate(tasks):
        position.append(len(final))
        final += [task] + frees_after.get(i, [])
    return tuple(final), position


def _timeline(spans, num_tasks: int) -> list[dict[str, int]]:
    """Live bytes per task by category: +nbytes at first, -nbytes after last."""
    delta = [dict.fromkeys(CATEGORIES, 0) for _ in range(num_tasks + 2)]  # +1: no tasks
    for s in spans:
        delta[s.first][s.buffer.category] += s.buffer.nbytes
        delta[s.last + 1][s.buffer.category] -= s.buffer.nbytes
    timeline, live = [], dict.fromkeys(CATEGORIES, 0)
    for row in delta[:num_tasks]:
        live = {c: live[c] + row[c] for c in CATEGORIES}
        timeline.append(live)
    return timeline


def assign_offsets(spans) -> dict[str, tuple[int, int]]:
    """Offline first-fit by size: persistent buffers at the bottom, then largest first,
    each at the lowest aligned offset clear of every placed buffer it is live with."""
    order = sorted(spans, key=lambda s: (not s.persistent, -s.buffer.nbytes, s.first,
                                         s.buffer.name))
    placed = _Placed(len(order))
    offsets = {}
    for span in order:
        offset = placed.lowest_fit(span)
        offsets[span.buffer.name] = (offset, span.buffer.nbytes)
        if span.buffer.nbytes:
            placed.add(offset, span)
    return offsets


class _Placed:
    """Placed buffers as arrays, so the clash test against all of them is vectorised."""

    def __init__(self, capacity: int):
        self.lo, self.top, self.first, self.last = (np.zeros(capacity, np.int64)
                                                    for _ in range(4))
        self.n = 0

    def add(self, offset: int, span: Span) -> None:
        i = self.n
        self.lo[i], self.top[i] = offset, align(offset + span.buffer.nbytes)
        self.first[i], self.last[i] = span.first, span.last
        self.n += 1

    def lowest_fit(self, span: Span) -> int:
        """First fit among the clashes (placed buffers live with `span`) walked by where
        they start: the offset before clash i is the highest aligned end of the clashes
        before it (0 before the first); the answer is that offset at the first clash it
        leaves room below, else the highest aligned end of all. Clashes sharing a start
        give the same answer in either order."""
        n = self.n
        live = (self.first[:n] <= span.last) & (span.first <= self.last[:n])
        if not live.any():
            return 0
        lo, top = self.lo[:n][live], self.top[:n][live]
        order = np.argsort(lo, kind="stable")
        lo, reach = lo[order], np.maximum.accumulate(top[order])
        before = np.concatenate(((0,), reach[:-1]))
        fits = before + span.buffer.nbytes <= lo
        i = int(fits.argmax())
        return int(before[i]) if fits[i] else int(reach[-1])


# ---- the verifier's memory checks ---------------------------------------------------

class MemoryPlanError(ValueError):
    """A memory plan that does not match its tasks; the message names stage and buffers."""


def verify_memory_plan(program) -> None:
    """Raise MemoryPlanError unless, on every stage: offsets are aligned, no two buffers
    live at once share arena bytes, and each transient buffer is freed once, after its
    last use (so no task reads it after its FREE). No-op before plan_memory runs."""
    if program.memory is None:
        return
    for stage, memory in program.memory.stages.items():
        _check_arena(stage, memory)
        _check_frees(program, stage, memory)


def _check_arena(stage: int, memory: StageMemory) -> None:
    """Sweep buffers by offset; compare each with those starting inside it."""
    placed = sorted((o, o + n, name) for name, (o, n) in memory.offsets.items() if n)
    for i, (lo, hi, name) in enumerate(placed):
        if lo % ALIGNMENT:
            raise MemoryPlanError(f"stage {stage}: {name} at offset {lo} is not "
                                  f"{ALIGNMENT}-aligned")
        for other_lo, _, other in placed[i + 1:]:
            if other_lo >= hi:
                break
            (a, b), (c, d) = memory.lifetimes[name], memory.lifetimes[other]
            if a <= d and c <= b:
                raise MemoryPlanError(f"stage {stage}: {name} (tasks {a}-{b}) and {other} (tasks "
                                      f"{c}-{d}) are live together and overlap in the arena")


def _check_frees(program, stage: int, memory: StageMemory) -> None:
    """FREE positions against the uses task_effects reports for the tasks as they are now."""
    tasks, last_use, freed = program.tasks[stage], _last_uses(program, stage), {}
    for i, task in enumerate(tasks):
        if task.kind != Kind.FREE:
            continue
        if task.buffer in freed or task.buffer in memory.persistent or \
                task.buffer not in memory.offsets:
            raise MemoryPlanError(f"stage {stage}: {task} (task {i}) frees a buffer that is "
                                  "persistent, unplanned or already freed")
        if last_use.get(task.buffer, -1) > i:
            raise MemoryPlanError(f"stage {stage}: {task.buffer} is used by task "
                                  f"{last_use[task.buffer]} after its FREE at task {i}")
        freed[task.buffer] = i
    missing = set(memory.offsets) - memory.persistent - set(freed)
    if missing:
        raise MemoryPlanError(f"stage {stage}: never freed: {', '.join(sorted(missing))}")


def _last_uses(program, stage: int) -> dict[str, int]:
    """Plan name -> index of the last task that creates or reads it."""
    last_use = {}
    for i, task in enumerate(program.tasks[stage]):
        effects = task_effects(program, task)
        for name in [b.name for b in effects.creates] + list(effects.reads):
            last_use[arena_name(name)] = i
    return last_use


# ---- what would make an over-budget program fit ----------------------------------------

def budget_message(program, plan: MemoryPlan) -> str:
    """Worst stage, its peak breakdown, the budget, and the changes that would help."""
    stage = plan.worst_stage
    m = plan.stages[stage]
    lines = [f"stage {stage} needs an arena of {format_bytes(m.arena_bytes)} (peak "
             f"{format_bytes(m.peak_bytes)}), over the budget of {format_bytes(plan.budget)} "
             f"by {format_bytes(m.arena_bytes - plan.budget)}",
             f"at its peak, task {m.peak_task} ({m.peak_task_name}): {m.breakdown()}",
             "what would help:"]
    lines += [f"  - {fix}" for fix in _fixes(program, stage, m)]
    return "\n".join(lines)


def _fixes(program, stage: int, m: StageMemory) -> list[str]:
    options, fixes = program.options, []
    if options.recompute != "full":
        saving = m.arena_bytes - stage_arena_bytes(what_if.under_recompute_full(program), stage)
        if saving > 0:
            fixes.append(f"--recompute full would save {format_bytes(saving)}")
    undo = sum(n for name, (_, n) in m.offsets.items()
               if parse_buffer(name).kind == BufferKind.UNDO)
    if undo:  # NOTE [commit rule] (insert_update.py)
        fixes.append(f"--update-rule after-norm would drop the commit rule's undo copies "
                     f"({format_bytes(undo)} on this stage, live at the step's end)")
    fixes += _zero_fixes(program, stage, m)
    layers = len(program.stages[stage]) if program.stages else 0
    if layers > 1:
        fixes.append(f"more pipeline stages (--pp > {options.pp}) would split stage "
                     f"{stage}'s {layers} layers")
    in_flight = min(options.pp - stage, options.micro_batches)
    activations = m.timeline[m.peak_task]["activations"] if m.timeline else 0
    fixes.append(f"activations at the peak are {format_bytes(activations)} for {in_flight} "
                 f"micro-batch(es) in flight: a smaller --micro-batch-size shrinks each, and "
                 f"fewer micro-batches help while M < {options.pp - stage} (P - s)")
    return fixes


def _zero_fixes(program, stage: int, m: StageMemory) -> list[str]:
    options = program.options
    row = m.timeline[m.peak_task] if m.timeline else dict.fromkeys(CATEGORIES, 0)
    if options.dp == 1:
        states = row["params"] + row["optimizer"]
        return [f"--zero 1/2 with --dp D > 1 would shard params + optimizer "
                f"({format_bytes(states)} here) to 1/D"] if options.zero == 0 else []
    fixes = []
    for zero in (1, 2):
        if zero > options.zero:
            saving = m.arena_bytes - stage_arena_bytes(what_if.under_zero(program, zero), stage)
            fixes.append(f"--zero {zero} would save {format_bytes(saving)}")
    if options.zero < 3 and not options.splits_head:  # vocab-parallel: no ZeRO-3 yet
        saving = m.arena_bytes - stage_arena_bytes(what_if.under_zero(program, 3), stage)
        if saving > 0:  # S view slots can outweigh a few small views
            fixes.append(f"--zero 3 would save {format_bytes(saving)} (views gathered at "
                         f"each use into {options.zero3_prefetch + 1} slots)")
    return fixes
