"""Periodic programs (NOTE [periodic programs], passes/periodic_program.py): the rows the
runtime expands from a stage's instance and period must be the whole step's rows, call by
call and byte by byte, and the memory plan the same."""
from dataclasses import replace
from functools import lru_cache
from itertools import count

import pytest

from ratrain import models
from ratrain.compiler import trace_for
from ratrain.codegen.table import build_stage_table
from ratrain.program_format.table import NativeStep, expanded_rows
from ratrain.program_format.lowered import Slot, StagePeriod
from ratrain.passes.periodic_program import (find_periods, periodic_program, row_keys,
                                             stage_period, worth_it)
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program

CASES = {
    "tiny-pp2-dp2-cpu": dict(model="tiny", hw="cpu", pp=2, dp=2),
    "tiny-pp4-dp2-zero2-fp16-commit": dict(model="tiny", hw="mt3000", pp=4, dp=2, zero=2,
                                           precision="fp16", recompute="selective"),
    "tiny-pp3-baseline-full": dict(model="tiny", hw="mt3000", pp=3, schedule="baseline",
                                   recompute="full"),
    "tied-pp2-dp2-clip": dict(model="tiny-tied", hw="mt3000", pp=2, dp=2, zero=1, clip=1.0),
    "tiny-pp2-dp2-zero3": dict(model="tiny", hw="mt3000", pp=2, dp=2, zero=3,
                               precision="fp16"),
    "tiny-pp3-dp2-zero2-scatter": dict(model="tiny", hw="mt3000", pp=3, dp=2, zero=2,
                                       grad_accum="scatter", recompute="selective"),
    "tiny-pp3-dp2-zero1-zb1": dict(model="tiny", hw="mt3000", pp=3, dp=2, zero=1,
                                   pipeline_schedule="zb1"),
    "tiny-pp2-baseline-zb1-full": dict(model="tiny", hw="cpu", pp=2, schedule="baseline",
                                       recompute="full", pipeline_schedule="zb1"),
    "tiny-pp4-dp2-zero1-zb1-selective": dict(model="tiny", hw="mt3000", pp=4, dp=2, zero=1,
                                             recompute="selective", pipeline_schedule="zb1"),
}


@lru_cache(maxsize=None)
def _graph(model: str, options: CompileOptions):
    return trace_for(models.get_config(model), model, options)


@lru_cache(maxsize=None)
def _compile(case: str, micro_batches: int, built: int | None):
    flags = dict(CASES[case])
    model, hw = flags.pop("model"), flags.pop("hw")
    options = CompileOptions(micro_batches=micro_batches, hw=hw, seq_len=128, **flags)
    graph = _graph(model, replace(options, micro_batches=1, budget=None))
    return run_pipeline(Program(graph, options, built_micro_batches=built), record=False)[0]


def _row(table, offsets: dict, row) -> tuple:
    """A table row with functions by their text and slots by their arena bytes."""
    task, steps, touched = row

    def slot(x):
        return (offsets[x.buffer][0] + x.offset, x.dtype, x.shape) if isinstance(x, Slot) \
            else repr(x)
    out = []
    for step in steps:
        if isinstance(step, NativeStep):
            out.append((table.functions[step.function], step.offsets, step.nbytes))
        else:
            c = step.call
            out.append((c.op, tuple(map(slot, c.outputs)), tuple(map(slot, c.inputs)),
                        c.params, c.note))
    place = offsets[task.buffer] if task.buffer else None  # a FREE names the period's buffer
    return ((task.kind, task.layer, task.micro_batch, place), tuple(out),
            frozenset(offsets[b] for b in touched))


def _rows(program, stage: int) -> list:
    table, offsets = build_stage_table(program, stage), program.memory.stages[stage].offsets
    return [_row(table, offsets, row) for row in expanded_rows(table)]


def _steps(case: str) -> list[int]:
    """Micro-batches tried. zb1's periods are longer (NOTE [zb1 periods]): the shortest
    step worth_it takes as periodic, and an odd one after it."""
    pp, schedule = CASES[case]["pp"], CASES[case].get("pipeline_schedule", "1f1b")
    if schedule == "1f1b":
        return [24, 33, 64]
    shortest = next(m for m in count(1) if worth_it(m, pp, schedule))
    return [shortest, shortest + 33]


@pytest.mark.parametrize("case,micro_batches", [(c, m) for c in sorted(CASES) for m in _steps(c)])
def test_the_expanded_periodic_program_is_the_whole_step(case, micro_batches):
    periods = find_periods(lambda n: _compile(case, micro_batches, n), micro_batches,
                           CASES[case]["pp"],
                           pipeline_schedule=CASES[case].get("pipeline_schedule", "1f1b"))
    assert periods is not None
    program, whole = periodic_program(periods), _compile(case, micro_batches, None)
    for stage in range(program.options.pp):
        period = program.periods[stage]
        assert period.micro_batches == micro_batches
        assert period.instance < micro_batches and period.count > 1
        assert _rows(program, stage) == _rows(whole, stage), f"stage {stage}"
        mine, theirs = program.memory.stages[stage], whole.memory.stages[stage]
        assert (mine.peak_bytes, mine.arena_bytes) == (theirs.peak_bytes, theirs.arena_bytes)


@pytest.mark.slow
def test_auto_recompute_under_a_budget(monkeypatch):
    """LLaMA-2-7B, pp 4, mt3000 at 20 GB: auto recovery fits the arena exactly, choosing
    per instance; the pumped rows are still the whole step's."""
    monkeypatch.setitem(CASES, "llama2-7b-pp4-auto", dict(
        model="llama2-7b", hw="mt3000", pp=4, dp=8, zero=2, precision="fp16",
        budget=20 * 10**9))
    test_the_expanded_periodic_program_is_the_whole_step("llama2-7b-pp4-auto", 48)


def test_stages_repeat_every_p_minus_s_micro_batches():
    """Stage s holds P - s micro-batches in flight and its activations cycle through
    that many places in the arena: its period is P - s micro-batches."""
    periods = find_periods(lambda n: _compile("tiny-pp4-dp2-zero2-fp16-commit", 64, n), 64, 4)
    assert [periods[s][1].shift for s in range(4)] == [4, 3, 2, 1]
    assert [periods[s][1].instance for s in range(4)] == [12, 13, 12, 12]
    assert [periods[s][1].count for s in range(4)] == [14, 18, 27, 53]


def test_a_shift_that_is_not_the_period_is_refused():
    """Stage 0 of a 2-stage pipeline alternates its activations between two places: one
    micro-batch later is not the same program, and the check says so."""
    base, once, twice = (_compile("tiny-pp2-dp2-cpu", 64, n) for n in (9, 10, 11))
    assert stage_period(base, once, twice, 0, 1, 64) is None
    assert stage_period(base, once, twice, 1, 1, 64) is not None


def test_row_keys_follow_the_shift():
    """A row one micro-batch later has the next micro-batch's task, data row, tag and
    note, and the same arena bytes."""
    program = _compile("tiny-pp2-dp2-cpu", 64, 10)
    plain, later = row_keys(program, 1), row_keys(program, 1, 1)
    first_f = next(i for i, lt in enumerate(program.lowered[1]) if lt.task.kind == "F")
    (kind, layer, mb, _), calls = plain[first_f]
    assert later[first_f][0][:3] == (kind, layer, mb + 1)
    params = [dict(c[3]) for c in later[first_f][1] if c[0] == "load_targets"]
    assert params == [{"micro_batch": mb + 1}]
    assert [c[1:3] for c in calls] == [c[1:3] for c in later[first_f][1]]


def test_segments_cover_the_step():
    period = StagePeriod(instance=10, start=4, length=3, shift=2, count=3)
    assert list(period.segments()) == [(0, 4, 0), (4, 7, 0), (4, 7, 2), (4, 7, 4), (7, None, 4)]
    assert period.micro_batches == 14


def test_zb1_stages_repeat_every_lcm_of_their_two_bounds():
    """A zb1 stage holds P - s micro-batches from F to B and P - s + 1 from F to the last
    W: its rows repeat every (P - s)(P - s + 1) micro-batches (NOTE [zb1 periods])."""
    periods = find_periods(lambda n: _compile("tiny-pp3-dp2-zero1-zb1", 64, n), 64, 3,
                           pipeline_schedule="zb1")
    assert [periods[s][1].shift for s in range(3)] == [12, 6, 2]
    assert [periods[s][1].instance for s in range(3)] == [28, 16, 12]
