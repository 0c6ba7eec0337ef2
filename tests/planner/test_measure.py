"""plan --measure's choice with a fake runner (NOTE [choosing by measuring]): the fastest
measured row is chosen whatever the plan's order, failed rows are left out and leave no
directory, a stopped measurement leaves no half-written row, and runs are sized from the
prediction scaled by how the rows before ran."""
import json

import pytest

from ratrain.planner.measure import (MAX_MEASURED, MEASURE_SECONDS, MIN_MEASURED, RECORD,
                                     WARMUP_STEPS, RunFailed, fastest, measure_rows,
                                     measured_steps)
from ratrain.planner.search import Row


def row(zero: int, simulated: float | None, estimated: float) -> Row:
    return Row(pp=1, dp=2, zero=zero, micro_batch_size=4, micro_batches=1, recompute="auto",
               schedule="ratrain", zero3_prefetch=None, update_rule=None, grad_accum=None,
               feasible=True, reason=None, peak_bytes=1 << 20, step_time_s=simulated,
               tokens_per_s=None, estimated_step_s=estimated)


class FakeRunner:
    """Steps of `seconds[zero]` each; `fail` (zero -> message) fails that row's run, and
    `stop_at` raises KeyboardInterrupt in that row's run, as a stop signal would."""

    def __init__(self, seconds: dict, fail=None, stop_at=None):
        self.seconds, self.fail, self.stop_at, self.runs = seconds, fail or {}, stop_at, []

    def compile(self, row, program):
        program.mkdir()
        (program / "program.json").write_text(json.dumps({"zero": row.zero}))

    def run(self, program, steps, trace, metrics, log):
        zero = json.loads((program / "program.json").read_text())["zero"]
        self.runs.append((zero, steps))
        trace.mkdir()
        (trace / "trace-rank0.json").write_text("[]")
        if zero == self.stop_at:
            raise KeyboardInterrupt
        if zero in self.fail:
            raise RunFailed(self.fail[zero])
        return [10.0] * WARMUP_STEPS + [self.seconds[zero]] * steps


ROWS = [row(2, 0.10, 0.10), row(3, 0.11, 0.105), row(1, None, 0.12)]


def test_the_fastest_measured_row_is_chosen_not_the_best_simulated(tmp_path):
    lines = []
    done = measure_rows(ROWS, FakeRunner({2: 0.30, 3: 0.20, 1: 0.25}), tmp_path, lines.append)
    assert [m.step_s for m in done] == [0.30, 0.20, 0.25]
    assert fastest(done).index == 2 and fastest(done).row.zero == 3
    assert len(lines) == 6 and lines[0].startswith("row 1 of 3: pp 1 x dp 2, zero 2")
    assert "measured step 0.2 s (+81.8% on its simulated 0.11 s)" in lines[3]
    assert "on its estimated 0.12 s" in lines[5]
    record = json.loads((tmp_path / "row2" / RECORD).read_text())
    assert record["measured_step_s"] == 0.20 and record["warmup_steps"] == WARMUP_STEPS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["row1", "row2", "row3"]


def test_a_failed_row_is_reported_left_out_and_removed(tmp_path):
    lines = []
    runner = FakeRunner({2: 0.30, 3: 0.20, 1: 0.25}, fail={3: "rank 1 died"})
    done = measure_rows(ROWS, runner, tmp_path, lines.append)
    assert done[1].step_s is None and done[1].problem == "rank 1 died"
    assert "row 2 of 3: not measured" in lines[3] and "rank 1 died" in lines[3]
    assert fastest(done).index == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["row1", "row3"]
    assert fastest(measure_rows(ROWS[1:2], runner, tmp_path / "again", print)) is None


def test_a_stopped_measurement_leaves_no_half_written_row(tmp_path):
    runner = FakeRunner({2: 0.30, 3: 0.20, 1: 0.25}, stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        measure_rows(ROWS, runner, tmp_path, print)
    assert [p.name for p in tmp_path.iterdir()] == ["row1"]
    assert (tmp_path / "row1" / RECORD).is_file()


def test_runs_are_sized_by_the_prediction_and_the_speed_so_far(tmp_path):
    assert measured_steps(MEASURE_SECONDS / 10, 1.0) == 10
    assert measured_steps(MEASURE_SECONDS / 10, 2.0) == 5
    assert measured_steps(1e-6, 1.0) == MAX_MEASURED
    assert measured_steps(100.0, 1.0) == MIN_MEASURED == measured_steps(None, 1.0)
    runner = FakeRunner({2: 0.30, 3: 0.22, 1: 0.25})
    lines = []
    measure_rows(ROWS, runner, tmp_path, lines.append)
    # row 1 is predicted 0.1 s and runs at 3x that; row 2 is then sized at 3 x 0.11 s
    assert [steps for _, steps in runner.runs] == [
        WARMUP_STEPS + measured_steps(0.10, 1.0), WARMUP_STEPS + measured_steps(0.11, 3.0),
        WARMUP_STEPS + measured_steps(0.12, 2.5)]
    assert lines[2].endswith(f"+ {measured_steps(0.11, 3.0)} measured steps, about 3 s")
