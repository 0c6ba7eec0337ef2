"""plots: the schedule Gantt chart and the memory timeline are written as real PNGs."""
import struct
from dataclasses import replace
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.ir.tasks import Kind, parse_schedule
from ratrain.models.trace import trace_model
from ratrain.passes.dryrun import dry_run
from ratrain.passes.pipeline import PIPELINE, run_pipeline
from ratrain.passes.plan_memory import MemoryBudgetError, plan_memory
from ratrain.passes.plots import memory_png, schedule_png, unit_cost
from ratrain.passes.program import CompileOptions, Program

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@lru_cache(maxsize=None)
def planned(pp=3, micro_batches=4, recompute="selective", budget=None):
    options = CompileOptions(pp=pp, micro_batches=micro_batches, micro_batch_size=2,
                             seq_len=32, recompute=recompute)
    graph = trace_model(models.get_config("tiny"), micro_batch_size=2, seq_len=32)
    program = run_pipeline(Program(graph, options), PIPELINE, verify=False)[0]
    return replace(program, options=replace(options, budget=budget))


def png_size(path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_schedule_png_draws_one_bar_per_non_free_task(tmp_path):
    program = plan_memory(planned())
    path = tmp_path / "schedule.png"
    drawn = schedule_png(program, path)
    tasks = [t for ts in program.tasks.values() for t in ts]
    assert any(t.kind == Kind.FREE for t in tasks)
    # 105: the last stage's backward recomputes its layers itself (no REC tasks there),
    # and each stage's last B is its two per-layer pieces (NOTE [sync issue point])
    assert drawn == sum(t.kind != Kind.FREE for t in tasks) == 105
    width, height = png_size(path)
    assert width >= 800 and height >= 200 and path.stat().st_size > 10_000


def test_schedule_png_takes_a_given_timeline_and_cost(tmp_path):
    schedule = parse_schedule("rank 0: 0F0 0SEND_F0 0B0 0FREE[ws.0B0]\n"
                              "rank 1: 1RECV_F0 1F0 1B0")
    program = replace(planned(), tasks=schedule)
    assert schedule_png(program, tmp_path / "a.png", cost=lambda t: 1.0) == 6
    timeline = dry_run(schedule, unit_cost)
    # rank 1: RECV_F0 waits for SEND_F0 (ends 1.1), takes 0.1, then F0 1.0 and B0 2.0
    assert timeline.makespan == pytest.approx(1.1 + 0.1 + 1.0 + 2.0)
    assert schedule_png(program, tmp_path / "b.png", timeline=timeline) == 6
    assert png_size(tmp_path / "b.png")[0] >= 800


def test_schedule_png_axis_names_the_unit(tmp_path, monkeypatch):
    import ratrain.passes.plots as plots
    labels = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: labels.append(
        (fig.axes[0].get_xlabel(), fig.axes[0].get_title().splitlines()[1])))
    program = plan_memory(planned())
    makespan = dry_run(program.tasks, unit_cost).makespan
    schedule_png(program, tmp_path / "units.png")
    schedule_png(program, tmp_path / "seconds.png", unit="s")
    assert [label for label, _ in labels] == ["time (cost units)", "time (s)"]
    assert labels[1][1].startswith(f"step {makespan:.4g} s, bubble ")


def test_unit_costs_by_kind_unless_the_task_has_an_estimate():
    schedule = parse_schedule("rank 0: 0F0 0B0 0REC[L1]0 0SYNC[L1] 0UPD[L1] 0PREF[L1] "
                              "0FREE[x] 0NORM")
    costs = [unit_cost(t) for t in schedule[0]]
    assert costs == [1.0, 2.0, 1.0, 0.5, 0.5, 0.5, 0.0, 0.1]
    assert unit_cost(replace(schedule[0][0], cost=3.5)) == 3.5


def test_memory_png_one_panel_per_stage_with_budget(tmp_path):
    program = plan_memory(planned(budget=40 << 20))
    path = tmp_path / "memory.png"
    assert memory_png(program, path) == 3
    width, height = png_size(path)
    assert (width, height) == (1000, 740) and path.stat().st_size > 20_000


def test_memory_png_of_an_over_budget_program_still_draws(tmp_path):
    program = planned(pp=2, micro_batches=2, recompute="none", budget=1 << 20)
    with pytest.raises(MemoryBudgetError):
        plan_memory(program)
    assert memory_png(program, tmp_path / "over.png") == 2
    assert png_size(tmp_path / "over.png")[1] > 200
