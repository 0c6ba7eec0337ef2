"""Programs whose size does not grow with the number of micro-batches: each stage is the
rows of an instance of the step (Program.built_micro_batches) with a period that repeats
(StagePeriod), found and checked by compiling a few small instances.

NOTE [periodic programs]: non-interleaved 1F1B is warm-up, a steady state and cool-down,
and every pass after the schedule keeps that shape: stage s holds P - s micro-batches in
flight, its lifecycle tasks sit at the step's ends, and plan_memory's first-fit packing of
a size class depends only on the buffers placed before it, so in the steady state the
arena offsets cycle every P - s micro-batches (stage 0 of a 4-stage pipeline alternates
among 4 places for a layer's activations; stage 3 uses one). So for a stage there are a
shift k and an instance of n = M mod k (+ a multiple of k) micro-batches whose rows R,
with a window W = R[a:a+L], satisfy

    rows of n + j k micro-batches = R[:a] + W + W>k + ... + W>(j-1)k + R[a:]>jk

where X>d is X with every micro-batch d later (lowered.shifted_task / shifted_call) and
the arena offsets unchanged. That is the StagePeriod (instance n, start a, length L,
shift k, count j + 1): R[:a] once, W count times, R[a+L:] shifted (count - 1) k.

It is checked for each stage, never assumed: the instances of n, n + k and n + 2k
micro-batches are compiled by the whole pipeline (verified after every pass, memory plan
included), and the rows of the last two must equal the instance of n pumped once and
twice, call by call, offsets included (row_keys). The first k that passes is the stage's
(tried in the order P - s, then 1, 2, ...; zb1: NOTE [zb1 periods]); stages may differ
in k and in their instance.
The step's last B comes after the period, so the SYNCs it starts run once. Without a
period, the caller compiles the whole step. The runtime expands the rows
(rt/executor.expand, over program_format/table.walk) and tells buffers apart by arena
bytes, since a later period names the buffers of the period it repeats. Tests compare the pumped rows with the
whole step's for M up to 64 and the losses of both under mpiexec.
"""
from __future__ import annotations

from dataclasses import replace

from ratrain.passes.plan_memory import MemoryPlan
from ratrain.program_format.lowered import Slot, StagePeriod, shifted_call, shifted_task
from ratrain.program_format.table import walk


# NOTE [zb1 periods]: a zb1 stage (NOTE [zb1 schedule]) runs the same tasks every
# micro-batch too, but holds P - s micro-batches between F and B and P - s + 1 between F
# and the last W: the buffers that live until B (act.L.mb, gradient messages, B's
# recoveries) cycle through P - s places in the arena, those that live until W
# (wact.L.mb, wop.L.mb) through P - s + 1, so its rows repeat only every
# lcm(P - s, P - s + 1) = (P - s)(P - s + 1) micro-batches (6 on stage 0 of 2, 20 on stage
# 0 of 4), and first-fit's places settle only after such a cycle: a zb1 stage tries that
# shift first, from an instance one shift longer than 1F1B's. 1F1B programs keep their
# shifts and instances.
def first_instance(pp: int, shift: int = 0, pipeline_schedule: str = "1f1b") -> int:
    """The smallest instance tried: past the warm-up and the offsets' first cycles (under
    zb1 one shift more: its offsets take a whole long cycle to settle, NOTE [zb1 periods])."""
    return 2 * pp + 4 + (shift if pipeline_schedule == "zb1" else 0)


def largest_period(pp: int, pipeline_schedule: str = "1f1b") -> int:
    return zb1_shift(pp, 0) if pipeline_schedule == "zb1" else max(4, pp)


def zb1_shift(pp: int, stage: int) -> int:
    """lcm(P - s, P - s + 1): the shift a zb1 stage repeats with (NOTE [zb1 periods])."""
    return (pp - stage) * (pp - stage + 1)


def stage_shifts(pp: int, stage: int, pipeline_schedule: str = "1f1b") -> list[int]:
    """The shifts tried for a stage, in order: its expected period, then 1, 2, ..."""
    expected = zb1_shift(pp, stage) if pipeline_schedule == "zb1" else pp - stage
    return list(dict.fromkeys([expected, *range(1, largest_period(pp) + 1)]))


def worth_it(micro_batches: int, pp: int, pipeline_schedule: str = "1f1b") -> bool:
    """Is the step long enough that three instances cost clearly less than the whole?"""
    largest = largest_period(pp, pipeline_schedule)
    return micro_batches >= 2 * (first_instance(pp, largest, pipeline_schedule) + 3 * largest)


def row_keys(program, stage: int, d: int = 0, first: int = 0) -> list:
    """Each lowered task of `stage` from row `first` on, `d` micro-batches later, as a
    comparable value: the task (a FREE by its buffer's arena place) and each call with its
    slots as arena offsets. Two programs whose keys agree run the same kernels on the
    same bytes."""
    offsets = program.memory.stages[stage].offsets

    def place(x):
        if isinstance(x, Slot):
            return (offsets[x.buffer][0] + x.offset, x.dtype, x.shape)
        return ("literal", repr(x.value))

    keys = []
    for lowered in program.lowered[stage][first:]:
        task = shifted_task(lowered.task, d)
        calls = tuple(shifted_call(c, d) for c in lowered.calls)
        keys.append(((task.kind, task.layer, task.micro_batch,
                      offsets[task.buffer] if task.buffer else None),
                     tuple((c.op, tuple(map(place, c.outputs)), tuple(map(place, c.inputs)),
                            c.params, c.note) for c in calls)))
    return keys


def stage_period(base, once, twice, stage: int, shift: int,
                 micro_batches: int) -> StagePeriod | None:
    """The StagePeriod of `stage` if the instances of n, n + shift and n + 2 shift
    micro-batches (base, once, twice) are the first pumped once and twice."""
    rows, grown = row_keys(base, stage), row_keys(once, stage)
    n, length = len(rows), len(grown) - len(rows)
    if length <= 0:
        return None
    prefix = 0
    while prefix < n and rows[prefix] == grown[prefix]:
        prefix += 1
    later, suffix = row_keys(base, stage, shift), 0
    while suffix < n and later[n - 1 - suffix] == grown[len(grown) - 1 - suffix]:
        suffix += 1
    start = n - suffix
    if start > prefix - length:
        return None
    # pumped twice (NOTE [periodic programs]): R[:a+L] + W>k + R[a:]>2k
    pumped = rows[:start + length] + later[start:start + length] + \
        row_keys(base, stage, 2 * shift, start)
    if pumped != row_keys(twice, stage):
        return None
    instance = base.micro_batches
    return StagePeriod(instance, start, length, shift,
                       1 + (micro_batches - instance) // shift)


def find_periods(compile_instance, micro_batches: int, pp: int, progress=None,
                 pipeline_schedule: str = "1f1b") -> dict | None:
    """stage -> (instance Program, StagePeriod) for every stage, or None if some stage
    shows no period. `compile_instance(n)` compiles the step's instance of n micro-batches
    (cached here); `progress(text)` is told of each one."""
    built: dict = {}

    def instance(n: int):
        if n not in built:
            if progress:
                progress(f"compiling an instance of {n} micro-batches")
            built[n] = compile_instance(n)
        return built[n]

    periods = {}
    for stage in range(pp):
        for shift in stage_shifts(pp, stage, pipeline_schedule):
            first = first_instance(pp, shift, pipeline_schedule)
            n = first + (micro_batches - first) % shift
            if n + 2 * shift > micro_batches:
                continue
            period = stage_period(instance(n), instance(n + shift), instance(n + 2 * shift),
                                  stage, shift, micro_batches)
            if period is not None:
                periods[stage] = (instance(n), period)
                break
        else:
            return None
    return periods


def periodic_program(periods: dict):
    """One Program of a periodic step from find_periods' answer: each stage's tasks,
    lowered calls and memory plan from its instance, with its StagePeriod."""
    first = periods[0][0]
    stages = {s: p.memory.stages[s] for s, (p, _) in periods.items()}
    return replace(first, tasks={s: p.tasks[s] for s, (p, _) in periods.items()},
                   lowered={s: p.lowered[s] for s, (p, _) in periods.items()},
                   memory=MemoryPlan(stages, first.memory.budget),
                   periods={s: period for s, (_, period) in periods.items()})


def describe_periods(program) -> list[str]:
    """Comment lines telling what a periodic program's dumps show ([] for a whole step)."""
    if not program.periods:
        return []
    lines = [f"# periodic program of {program.options.micro_batches} micro-batches "
             f"(NOTE [periodic programs]); `ratrain compile --expand` writes the whole step"]
    for stage, p in sorted(program.periods.items()):
        lines.append(f"#   stage {stage}: instance of {p.instance} micro-batches, rows "
                     f"{p.start}..{p.start + p.length - 1} run {p.count} times, "
                     f"{p.shift} micro-batch(es) later each time")
    if len({p.instance for p in program.periods.values()}) > 1:
        lines.append(f"#   the pass outputs below are those of stage 0's instance "
                     f"({program.periods[0].instance} micro-batches)")
    return lines


def expanded_schedule(program):
    """(stage -> every task of the step, task -> the instance task it repeats) of a
    periodic program; a whole step's tasks map to themselves. Costs and pictures of the
    step read the instance's task for a repeated one (its recompute choices and layers
    are the instance's)."""
    schedule, base = {}, {}
    for stage, tasks in program.tasks.items():
        out = []
        for i, d in walk(len(tasks), (program.periods or {}).get(stage)):
            later = shifted_task(tasks[i], d)
            base[later] = tasks[i]
            out.append(later)
        schedule[stage] = tuple(out)
    return schedule, base
