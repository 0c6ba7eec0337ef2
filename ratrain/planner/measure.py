"""`ratrain plan --measure K`: run the plan's K best rows on this machine, a few traced
steps each, and choose the fastest measured (NOTE [choosing by measuring]).

The runner that compiles and runs a row is passed in (`RowRunner`: cli/measure.py's
compiles in-process and runs under mpiexec; tests pass a fake), so sizing, the directory
of each row and the choice are tested in-process. Assumes the rows are the plan's, best
first, each with a simulated or estimated step.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ratrain.calibrate.from_trace import SKIP_STEPS
from ratrain.planner.search import Row

# NOTE [choosing by measuring]: the plan ranks rows by their simulated step (estimated
# where not simulated); on the machine the plan is for, the rows can be run instead.
# 1. The K best rows the table shows, in its order, are each compiled as `ratrain
#    compile` would compile them (programs.compile_program_dir) and run under mpiexec
#    with --trace and --metrics for WARMUP_STEPS + n steps; the measured step is the
#    median of the n steps' step_seconds after the warm-up. WARMUP_STEPS is the steps
#    `ratrain calibrate --from` leaves out of a trace by default (SKIP_STEPS), so the
#    traces calibrate from what was measured.
# 2. n spans about MEASURE_SECONDS at the row's predicted step, scaled by how the rows
#    measured so far ran against their prediction (a profile of another CPU, or a busy
#    machine, is off for every row alike), and lies in [MIN_MEASURED, MAX_MEASURED], so
#    a row's time is its compile and start-up plus a bounded run. The first row has no
#    rows before it: its run is bounded by MAX_MEASURED steps only (on 2 vCPUs under a
#    load of 13, tiny's row 1 ran 19 steps of 1.0 s where 0.165 s was simulated, 29 s
#    with start-up; rows 2 and 3, sized from it, 16-17 s). The runtime runs a fixed
#    --steps, so a clock cannot end a run early.
# 3. The fastest measured row is chosen; a row that failed (compile or run) is reported
#    with its reason and left out of the choice.
# 4. Each row's program, trace, metrics and run log go to DIR/row<I> (I its number in
#    the table), and DIR/row<I>/measured.json, written last and atomically, records the
#    measurement: a row directory without it is half-written. A row that fails or is
#    stopped is removed whole, so DIR holds only complete rows.
WARMUP_STEPS = SKIP_STEPS
MEASURE_SECONDS = 3.0
MIN_MEASURED, MAX_MEASURED = 3, 20
RECORD = "measured.json"


class RunFailed(Exception):
    """A row that could not be compiled or run; its message says why (one line)."""


class RowRunner(Protocol):
    def compile(self, row: Row, program: Path) -> None:
        """Write the row's program directory `program` (RunFailed if it cannot)."""

    def run(self, program: Path, steps: int, trace: Path, metrics: Path, log: Path
            ) -> list[float]:
        """Run `steps` steps of `program`, tracing into `trace`, metrics into `metrics`,
        its output into `log`; each step's seconds (RunFailed if the run fails)."""


@dataclass(frozen=True)
class Measurement:
    index: int                          # the row's number in the plan's table (1 = best)
    row: Row
    step_s: float | None                # median measured step after the warm-up; None:
                                        # failed (problem says why)
    steps: int = 0                      # steps the median is over
    seconds: float = 0.0                # wall time of compiling and running the row
    directory: Path | None = None       # DIR/row<I>: program/, trace/, metrics, run.log
    problem: str | None = None          # why there is no measured step

    @property
    def predicted_s(self) -> float | None:
        return predicted_step(self.row)

    @property
    def program(self) -> Path:
        return self.directory / "program"

    @property
    def trace(self) -> Path:
        return self.directory / "trace"


def predicted_step(row: Row) -> float | None:
    """The row's simulated step, else its estimate (what the plan's table shows)."""
    return row.step_time_s if row.simulated else row.estimated_step_s


def measured_steps(predicted: float | None, speed: float) -> int:
    """Steps to measure after the warm-up: about MEASURE_SECONDS at `predicted` x
    `speed` (measured over predicted so far), within [MIN_MEASURED, MAX_MEASURED]."""
    if not predicted:
        return MIN_MEASURED
    wanted = math.ceil(MEASURE_SECONDS / (predicted * speed))
    return max(MIN_MEASURED, min(MAX_MEASURED, wanted))


def speed_so_far(done: list[Measurement]) -> float:
    """Median measured / predicted step of the rows measured so far (1 before any)."""
    ratios = [m.step_s / m.predicted_s for m in done if m.step_s and m.predicted_s]
    return statistics.median(ratios) if ratios else 1.0


def measure_rows(rows: list[Row], runner: RowRunner, directory: Path,
                 progress: Callable[[str], None]) -> list[Measurement]:
    """Measure `rows` (the table's first rows, best first) one after another into
    `directory`, with a progress line as each starts and ends."""
    done: list[Measurement] = []
    for index, row in enumerate(rows, 1):
        speed = speed_so_far(done)
        steps = measured_steps(predicted_step(row), speed)
        progress(start_line(index, len(rows), row, steps, speed))
        done.append(measure_row(index, row, runner, directory / f"row{index}", steps))
        progress(end_line(done[-1], len(rows)))
    return done


def measure_row(index: int, row: Row, runner: RowRunner, directory: Path,
                steps: int) -> Measurement:
    """Compile and run one row in `directory` (NOTE [choosing by measuring] 4)."""
    started = time.perf_counter()
    directory.mkdir(parents=True)
    try:
        runner.compile(row, directory / "program")
        times = runner.run(directory / "program", WARMUP_STEPS + steps, directory / "trace",
                           directory / "metrics.jsonl", directory / "run.log")
        measured = times[WARMUP_STEPS:]
        if not measured:
            raise RunFailed(f"the run recorded {len(times)} steps, none after the "
                            f"{WARMUP_STEPS} warm-up steps")
        result = Measurement(index, row, statistics.median(measured), len(measured),
                             time.perf_counter() - started, directory)
        write_record(result, times)
    except RunFailed as e:
        shutil.rmtree(directory, ignore_errors=True)
        return Measurement(index, row, None, seconds=time.perf_counter() - started,
                           problem=str(e))
    except BaseException:  # stopped, or a bug: leave no half-written row behind
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return result


def write_record(measurement: Measurement, times: list[float]) -> None:
    """DIR/row<I>/measured.json, atomically: the row is complete once it exists."""
    m = measurement
    record = {"row": m.index, "configuration": str(m.row.candidate), "plan_row": m.row.to_json(),
              "predicted_step_s": m.predicted_s, "measured_step_s": m.step_s,
              "warmup_steps": WARMUP_STEPS, "step_seconds": times}
    partial = m.directory / (RECORD + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, m.directory / RECORD)


def fastest(measurements: list[Measurement]) -> Measurement | None:
    """The measured row with the shortest step (the earlier row on a tie), if any ran."""
    ran = [m for m in measurements if m.step_s is not None]
    return min(ran, key=lambda m: (m.step_s, m.index)) if ran else None


# ---- progress lines -----------------------------------------------------------------------

def timed(row: Row) -> str:
    return "simulated" if row.simulated else "estimated"


def start_line(index: int, count: int, row: Row, steps: int, speed: float) -> str:
    """What the row's run will be: its steps, and their seconds at `speed` (NOTE
    [choosing by measuring] 2)."""
    predicted = predicted_step(row)
    span = f", about {steps * predicted * speed:.0f} s" if predicted else ""
    return (f"row {index} of {count}: {row.candidate}: compiling, then {WARMUP_STEPS} "
            f"warm-up + {steps} measured steps{span}")


def end_line(m: Measurement, count: int) -> str:
    head = f"row {m.index} of {count}:"
    if m.step_s is None:
        return f"{head} not measured ({m.seconds:.0f} s): {m.problem}"
    versus = f" ({m.step_s / m.predicted_s - 1:+.1%} on its {timed(m.row)} " \
             f"{m.predicted_s:.4g} s)" if m.predicted_s else ""
    return (f"{head} measured step {m.step_s:.4g} s{versus}, median of {m.steps} steps, "
            f"in {m.seconds:.0f} s")
