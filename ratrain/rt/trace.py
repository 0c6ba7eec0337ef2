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
# and its time alone cannot say which of them ran faster or slower than charged. The run
# keeps a step's raw clock readings and the trace's write turns them into microseconds:
# turning them as each step ran (numpy scalars, 77 us a step of 20 calls on 2 vCPUs) made
# a traced run of tiny-gqa pp 2 2-8% slower than the same run untraced, and the traced
# profile charged that to every run it predicted (NOTE [traced rows] 4).


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

    def ran(self, readings=None) -> None:
        """The run ends; `readings`: a native step's clock, as its generated function read
        it before its first call and after each (numpy; the trace's write turns them into
        each call's microseconds, so that a traced step costs the run little: NOTE
        [calls in the trace])."""
        end = time.perf_counter()
        self.calls.append([self._step, self._calls, round((self._ready - self._start) * 1e6, 1),
                           round((end - self._ready) * 1e6, 1)]
                          + ([readings.tolist()] if readings is not None else []))


def _per_call(steps: list) -> list:
    """A task's steps as the trace holds them: a native step's clock readings as each
    call's microseconds."""
    return [step[:4] + [[round((b - a) * 1e6, 1) for a, b in zip(step[4], step[4][1:])]]
            if len(step) > 4 else step for step in steps]


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
        events = [e | {"args": e["args"] | {"calls": _per_call(e["args"]["calls"])}}
                  if "calls" in e["args"] else e for e in self.events]
        path.write_text(json.dumps({"traceEvents": [label] + meta + events}))
        return path
