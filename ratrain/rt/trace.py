"""The measured timeline of a run: one Chrome trace event per task and rank (open
DIR/trace-rank<R>.json in Perfetto or chrome://tracing), to set beside the simulator's.
Each rank writes its own file; times are microseconds since the rank's first step.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


# NOTE [calls in the trace]: a task's wall time mixes the kernels it runs with its waits
# for messages and collectives, and one task runs several kernels of different shapes, so
# a per-task time cannot say what one kernel took in the run. Each task event therefore
# also carries its steps (args.calls): for each native function or runtime call the row
# ran, [index of the step in the row, how many lowered calls it runs, microseconds spent
# waiting for its operands (the hazard rule: in-flight receives and collectives), then
# microseconds running]. A native step runs consecutive lowered calls of the task, a
# runtime call one, so the steps partition the task's lowered calls in order: what
# `ratrain calibrate --from` (calibrate/from_trace.py) sets beside the simulator's charge
# for the same calls. Steps the commit rule skips are not listed. A native step also
# carries, fifth, the microseconds of each of its calls, as its generated function read
# the monotonic clock after each (codegen/module.py; a program's own older code has no
# clock, and its steps only the four): a decoder layer's forward is one step of 19 calls,
# and its time alone cannot say which of them ran faster or slower than charged.


PROGRAM_EVENT = "ratrain_program"       # metadata event naming the traced program's directory


class StepClock:
    """The step times of one traced row (NOTE [calls in the trace])."""

    def __init__(self):
        self.calls: list[list[float]] = []
        self._step = self._calls = 0
        self._start = self._ready = 0.0

    def at(self, step: int, calls: int) -> "StepClock":
        """Step `step` of the row, running `calls` lowered calls, begins now."""
        self._step, self._calls, self._start = step, calls, time.perf_counter()
        return self

    def waited(self) -> None:
        """Its operands are ready: the wait ends, the run begins."""
        self._ready = time.perf_counter()

    def ran(self, each=None) -> None:
        """The run ends; `each`: a native step's seconds per call, as its generated
        function clocked them."""
        end = time.perf_counter()
        self.calls.append([self._step, self._calls, round((self._ready - self._start) * 1e6, 1),
                           round((end - self._ready) * 1e6, 1)]
                          + ([[round(s * 1e6, 1) for s in each]] if each is not None else []))


class TaskTrace:
    """Complete ("X") events of one rank: name = task text, args = step and the steps'
    times (NOTE [calls in the trace])."""

    def __init__(self, rank: int, stage: int, program: str | None = None):
        """`program`: the directory of the program traced, recorded for `ratrain calibrate
        --from` (PROGRAM_EVENT)."""
        self.rank, self.stage, self.events = rank, stage, []
        self.program = str(Path(program).resolve()) if program else None
        self.origin = time.perf_counter()

    def record(self, task, step: int, start: float, end: float,
               clock: StepClock | None = None) -> None:
        args = {"step": step} if clock is None else {"step": step, "calls": clock.calls}
        self.events.append({"name": str(task), "ph": "X", "pid": self.rank, "tid": 0,
                            "ts": (start - self.origin) * 1e6, "dur": (end - start) * 1e6,
                            "args": args})

    def write(self, directory: str) -> Path:
        path = Path(directory) / f"trace-rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        label = {"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank} (stage {self.stage})"}}
        meta = [{"name": PROGRAM_EVENT, "ph": "M", "pid": self.rank,
                 "args": {"program": self.program}}] if self.program else []
        path.write_text(json.dumps({"traceEvents": [label] + meta + self.events}))
        return path
