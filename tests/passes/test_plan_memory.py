"""plan_memory: peaks against a brute-force recount, arena overlap, FREE placement, budgets."""
import random
from dataclasses import replace
from functools import lru_cache
from itertools import combinations

import pytest

from ratrain import models
from ratrain.ir.tasks import Kind, format_tasks, parse_task
from ratrain.models.trace import trace_model
from ratrain.passes.buffers import (CATEGORIES, Buffer, persistent_buffers, stage_peak,
                                    task_effects)
from ratrain.passes.pipeline import PIPELINE, run_pipeline
from ratrain.passes.plan_memory import (ALIGNMENT, MemoryBudgetError, MemoryPlanError, Span,
                                        align, assign_offsets, format_bytes, plan_memory,
                                        plan_stage, stage_arena_bytes, verify_memory_plan)
from ratrain.passes.program import CompileOptions, Program
from ratrain.program_format.lowered import arena_name

MiB = 1 << 20


@lru_cache(maxsize=None)
def tiny_graph():
    return trace_model(models.get_config("tiny"), micro_batch_size=2, seq_len=32)


@lru_cache(maxsize=None)
def scheduled(pp=2, micro_batches=4, recompute="none", dp=1, zero=0, budget=None):
    """The tiny model through every scheduling pass, before plan_memory. The budget is
    set after partition_stages: these tests are about what plan_memory does with it."""
    options = CompileOptions(pp=pp, dp=dp, zero=zero, micro_batches=micro_batches,
                             micro_batch_size=2, seq_len=32, recompute=recompute)
    partitioned = run_pipeline(Program(tiny_graph(), options), PIPELINE[:1], verify=False)[0]
    return run_pipeline(with_budget(partitioned, budget), PIPELINE[1:], verify=False)[0]


def with_budget(program, budget):
    return replace(program, options=replace(program.options, budget=budget))


def recount(program, stage):
    """Independent liveness: every buffer marked live at each task index from its
    creator through its last reader (persistent: every index), then summed per task."""
    tasks = program.tasks[stage]
    live = {b.name: (b, set(range(len(tasks)))) for b in persistent_buffers(program, stage)}
    for i, task in enumerate(tasks):
        effects = task_effects(program, task)
        for b in effects.creates:
            live[b.name] = (b, {i})
        for name in effects.reads:
            b, marked = live[name]
            marked |= set(range(min(marked), i + 1))
    rows = [dict.fromkeys(CATEGORIES, 0) for _ in tasks]
    for b, marked in live.values():
        for i in marked:
            rows[i][b.category] += b.nbytes
    return rows, {arena_name(n): (min(m), max(m)) for n, (_, m) in live.items()}


CONFIGS = [dict(pp=pp, micro_batches=m, recompute=r)
           for pp in (1, 2, 3, 4) for m in (1, 3, 8) for r in ("none", "full", "selective")]
CONFIGS += [dict(pp=2, micro_batches=3, recompute="none", dp=2, zero=z) for z in (1, 2)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_plan_matches_brute_force_recount(config):
    before = scheduled(**config)
    after = plan_memory(before)
    for stage, memory in after.memory.stages.items():
        rows, lifetimes = recount(after, stage)
        totals = [sum(row.values()) for row in rows]
        assert memory.timeline == rows
        assert memory.lifetimes == lifetimes
        assert memory.peak_bytes == max(totals) == stage_peak(before, stage)
        assert memory.peak_task == totals.index(max(totals))
        assert after.tasks[stage][memory.peak_task].kind != Kind.FREE


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_arena_has_no_overlap_among_live_buffers(config):
    plan = plan_memory(scheduled(**config)).memory
    for memory in plan.stages.values():
        offsets, lifetimes = memory.offsets, memory.lifetimes
        assert set(offsets) == set(lifetimes)
        assert all(offset % ALIGNMENT == 0 for offset, _ in offsets.values())
        for a, b in combinations(offsets, 2):
            (oa, na), (ob, nb) = offsets[a], offsets[b]
            (fa, la), (fb, lb) = lifetimes[a], lifetimes[b]
            if fa <= lb and fb <= la and na and nb:
                assert oa + na <= ob or ob + nb <= oa, f"{a} and {b} overlap"
        assert memory.arena_bytes == max(o + n for o, n in offsets.values())
        assert memory.arena_bytes >= memory.peak_bytes


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_every_transient_buffer_freed_once_right_after_last_use(config):
    program = plan_memory(scheduled(**config))
    for stage, tasks in program.tasks.items():
        persistent = {b.name for b in persistent_buffers(program, stage)}
        lifetimes = program.memory.stages[stage].lifetimes
        frees = {}
        for i, task in enumerate(tasks):
            if task.kind == Kind.FREE:
                assert task.buffer not in frees, f"{task} twice"
                frees[task.buffer] = i
        assert set(frees) == set(lifetimes) - persistent
        last_read = {arena_name(n): i for i, t in enumerate(tasks)
                     for n in task_effects(program, t).reads}
        for name, i in frees.items():
            last = lifetimes[name][1]
            assert last < i and all(t.kind == Kind.FREE for t in tasks[last + 1:i])
            assert last_read.get(name, -1) < i, f"{name} read after its FREE"


def test_golden_frees_of_two_stages_two_micro_batches():
    program = plan_memory(scheduled(pp=2, micro_batches=2))
    assert format_tasks(program.tasks[1]) == (
        "1POST_F0 1RECV_F0 1F0 1FREE[in.mb0] 1FREE[ws.1F0] 1POST_F1 1B0 1FREE[act.L3.mb0] "
        "1FREE[act.L4.mb0] 1FREE[act.L5.mb0] 1FREE[ws.1B0] 1SEND_B0 1FREE[gout.mb0] "
        "1RECV_F1 1F1 1FREE[in.mb1] 1FREE[ws.1F1] 1B[L5]1 1SYNC[L5] 1B[L4]1 1SYNC[L4] "
        "1B[L3]1 1FREE[act.L3.mb1] 1FREE[act.L4.mb1] 1FREE[act.L5.mb1] 1FREE[ws.1B1] "
        "1SEND_B1 1FREE[gout.mb1] 1SYNC[L3] 1UPD[L5] 1FREE[grad.L5] 1PREF[L5] 1UPD[L4] "
        "1FREE[grad.L4] 1PREF[L4] 1UPD[L3] 1FREE[grad.L3] 1PREF[L3]")


def test_plan_memory_is_idempotent_and_keeps_other_tasks_in_order():
    before = scheduled(pp=3, micro_batches=3, recompute="full")
    once = plan_memory(before)
    assert plan_memory(once).tasks == once.tasks
    for stage, tasks in once.tasks.items():
        assert tuple(t for t in tasks if t.kind != Kind.FREE) == before.tasks[stage]


def test_auto_recompute_fits_a_budget_between_full_and_none_peaks():
    full = plan_memory(scheduled(pp=2, micro_batches=4, recompute="full")).memory
    keep = plan_memory(scheduled(pp=2, micro_batches=4, recompute="none")).memory
    assert full.peak_bytes < keep.peak_bytes
    budget = (full.peak_bytes + keep.peak_bytes) // 2
    auto = plan_memory(scheduled(pp=2, micro_batches=4, recompute="auto", budget=budget))
    assert auto.recompute, "auto must drop some activations to fit"
    assert full.peak_bytes <= auto.memory.peak_bytes <= auto.memory.arena_bytes <= budget


def test_budget_too_small_for_any_policy_names_breakdown_and_fixes():
    program = with_budget(scheduled(pp=2, micro_batches=4, recompute="none"), 16 * MiB)
    with pytest.raises(MemoryBudgetError) as caught:
        plan_memory(program)
    message = str(caught.value)
    worst = plan_memory(with_budget(program, None)).memory.stages[0]
    assert message.startswith(f"stage 0 needs an arena of {format_bytes(worst.arena_bytes)}")
    assert "budget of 16.00 MiB" in message
    assert f"task {worst.peak_task} ({worst.peak_task_name})" in message
    for category in ("params", "optimizer", "views", "grads", "activations", "workspace"):
        assert f"{category} " in message
    assert "--recompute full would save" in message and "--zero 1/2" in message
    assert isinstance(caught.value, ValueError)


def test_auto_recompute_under_an_impossible_budget_still_raises():
    program = scheduled(pp=2, micro_batches=4, recompute="auto", budget=16 * MiB)
    assert set(program.recompute.values()) == {"full"}
    with pytest.raises(MemoryBudgetError, match="budget of 16.00 MiB"):
        plan_memory(program)


def test_budget_error_names_zero_savings_with_dp_and_no_recompute_when_already_full():
    program = with_budget(scheduled(pp=2, micro_batches=3, recompute="full", dp=2), 4 * MiB)
    with pytest.raises(MemoryBudgetError) as caught:
        plan_memory(program)
    message = str(caught.value)
    assert "--recompute full" not in message
    assert "--zero 1 would save" in message and "--zero 2 would save" in message
    assert "--zero 3 would save" in message and "into 2 slots" in message


def test_reading_a_buffer_no_task_created_is_an_error():
    program = scheduled(pp=2, micro_batches=2)
    tasks = tuple(t for t in program.tasks[1] if str(t) != "1POST_F0")
    with pytest.raises(ValueError, match=r"1RECV_F0 reads in.mb0, which no earlier task"):
        plan_memory(replace(program, tasks={**program.tasks, 1: tasks}))


def test_workspace_of_bracketed_tasks_gets_a_parseable_free():
    program = plan_memory(scheduled(pp=2, micro_batches=2, recompute="full"))
    names = [t.buffer for t in program.tasks[0] if t.kind == Kind.FREE]
    assert "ws.0REC(L1)0" in names and arena_name("ws.0REC[L1]0") == "ws.0REC(L1)0"


def test_report_lists_every_stage_peak_and_arena():
    plan = plan_memory(scheduled(pp=2, micro_batches=2)).memory
    lines = plan.report().splitlines()
    assert lines[0] == "memory plan (budget unlimited)"
    for stage, memory in plan.stages.items():
        assert (f"stage {stage}: peak {format_bytes(memory.peak_bytes)} at task "
                f"{memory.peak_task} ({memory.peak_task_name}), "
                f"arena {format_bytes(memory.arena_bytes)}") in lines
    assert plan.peak_bytes == max(m.peak_bytes for m in plan.stages.values())


def test_verify_memory_plan_accepts_every_plan():
    for config in CONFIGS[::5]:
        verify_memory_plan(plan_memory(scheduled(**config)))


def test_verify_memory_plan_rejects_overlapping_live_buffers():
    program = plan_memory(scheduled(pp=2, micro_batches=2))
    memory = program.memory.stages[0]
    offsets = dict(memory.offsets, **{"act.L1.mb0": (0, memory.offsets["act.L1.mb0"][1])})
    broken = replace(memory, offsets=offsets)
    stages = {**program.memory.stages, 0: broken}
    program = replace(program, memory=replace(program.memory, stages=stages))
    with pytest.raises(MemoryPlanError, match=r"act.L1.mb0 .* live together and overlap"):
        verify_memory_plan(program)


def test_verify_memory_plan_rejects_a_read_after_free():
    program = plan_memory(scheduled(pp=2, micro_batches=2))
    tasks = list(program.tasks[1])
    free = next(i for i, t in enumerate(tasks) if str(t) == "1FREE[in.mb0]")
    tasks.insert(tasks.index(parse_task("1RECV_F0")), tasks.pop(free))
    with pytest.raises(MemoryPlanError, match=r"in.mb0 is used by task 3 after its FREE at task 1"):
        verify_memory_plan(replace(program, tasks={**program.tasks, 1: tuple(tasks)}))


def test_verify_memory_plan_rejects_a_missing_free():
    program = plan_memory(scheduled(pp=2, micro_batches=2))
    tasks = tuple(t for t in program.tasks[0] if str(t) != "0FREE[out.mb1]")
    with pytest.raises(MemoryPlanError, match=r"never freed: out.mb1"):
        verify_memory_plan(replace(program, tasks={**program.tasks, 0: tasks}))


def test_stage_without_tasks_keeps_persistent_buffers_apart():
    program = scheduled(pp=2, micro_batches=2)
    memory = plan_memory(replace(program, tasks={**program.tasks, 1: ()})).memory.stages[1]
    spans = sorted(memory.offsets.values())
    assert all(o + n <= next_o for (o, n), (next_o, _) in zip(spans, spans[1:]))
    assert memory.arena_bytes >= sum(n for _, n in spans) and memory.timeline == []


@pytest.mark.parametrize("layout", [dict(), dict(pp=3, micro_batches=6, recompute="selective"),
                                    dict(pp=2, dp=2, zero=2, recompute="full"),
                                    dict(pp=2, dp=2, zero=3), dict(pp=4, micro_batches=8)])
def test_the_arena_without_frees_is_plan_stages(layout):
    """insert_recovery's budget search asks stage_arena_bytes, which places the buffers
    before the FREEs go in: it must be the arena plan_stage gives after them."""
    program = scheduled(**layout)
    for stage in range(program.options.pp):
        assert stage_arena_bytes(program, stage) == plan_stage(program, stage)[1].arena_bytes


def _walked_fit(placed, span) -> int:
    """First fit walked clash by clash, as assign_offsets placed buffers before the walk
    was vectorised: below the first clash that leaves room, else above them all."""
    offset = 0
    for lo, hi in sorted((lo, hi) for lo, hi, first, last in placed
                         if first <= span.last and span.first <= last):
        if offset + span.buffer.nbytes <= lo:
            break
        offset = max(offset, align(hi))
    return offset


def test_assign_offsets_places_every_buffer_where_the_walked_first_fit_does():
    rng = random.Random(0)
    for trial in range(200):
        spans = []
        for i in range(rng.randint(1, 80)):
            first = rng.randint(0, 40)
            nbytes = rng.choice([0, 1, ALIGNMENT, 100, 4096, rng.randint(1, 10**6)])
            spans.append(Span(Buffer(f"b{i}", "activations", nbytes), first,
                              first + rng.randint(0, 12), rng.random() < 0.1))
        offsets, placed = assign_offsets(spans), []
        for s in sorted(spans, key=lambda s: (not s.persistent, -s.buffer.nbytes, s.first,
                                              s.buffer.name)):
            assert offsets[s.buffer.name][0] == _walked_fit(placed, s), (trial, s)
            if s.buffer.nbytes:
                o = offsets[s.buffer.name][0]
                placed.append((o, o + s.buffer.nbytes, s.first, s.last))
