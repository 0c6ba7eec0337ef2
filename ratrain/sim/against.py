"""A measured run against the simulation of the same program: seconds per step that each
stage spends in each kind of task, from `ratrain run DIR --trace TRACE` (rt/trace.py: one
event per task and rank, its wall time, waits inside it included) and from the replay of
one pipeline (sim/replay.py: each task from the moment its rank reached it to its end).

The simulator replays DP replica 0, so a stage's simulated figure stands beside the
measured one of that replica's rank and, for the other replicas of the stage, the range
their ranks measured: replicas that drift apart show there (NOTE [replica spread]).
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ratrain.errors import UserError
from ratrain.ir.tasks import parse_task

# NOTE [replica spread]: a DP collective ends when its slowest member reaches it, so on a
# node where replicas run at different speeds every replica waits for the slowest, which a
# replay of replica 0 cannot see (tests/sim/test_node16.py met it at pp 4 x dp 4). The
# comparison therefore prints, beside replica 0's measured seconds, the fewest and most of
# any replica of the stage: a wide range in a stage's waiting tasks (RECV, UPD) is that.


STEP = "step"                           # measured_seconds' key of the whole step


@dataclass(frozen=True)
class Row:
    stage: int
    kind: str                           # a task kind, or "all" for the stage's tasks
    measured: float                     # replica 0's rank: median seconds per step
    simulated: float                    # seconds in the replayed step
    fewest: float                       # the stage's replicas: least median per step
    most: float                         # ... most


def measured_seconds(trace_dir: Path, skip: int) -> tuple[dict, dict]:
    """(rank -> kind -> seconds in each traced step after the first `skip`, rank -> the
    task texts it traced), one read of each file. "all" is the sum of the rank's tasks in
    a step; STEP runs from the step's first task to the next step's (to its last task's
    end for the last step)."""
    files = sorted(trace_dir.glob("trace-rank*.json"))
    if not files:
        raise UserError(f"{trace_dir} holds no trace-rank<R>.json; write them with "
                        f"`ratrain run DIR --trace {trace_dir}`")
    out, names = {}, {}
    for path in files:
        steps: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        bounds: dict[int, list[float]] = {}
        kinds: dict[str, str] = {}      # task text -> its kind, parsed once
        rank = None
        for event in _events(path):
            rank, step, name = event["pid"], event["args"]["step"], event["name"]
            if name not in kinds:
                kinds[name] = str(_task(name, path).kind)
            steps[step][kinds[name]] += event["dur"] * 1e-6
            steps[step]["all"] += event["dur"] * 1e-6
            start, end = event["ts"] * 1e-6, (event["ts"] + event["dur"]) * 1e-6
            first, last = bounds.get(step, (start, end))
            bounds[step] = [min(first, start), max(last, end)]
        order = sorted(steps)
        for step, after in zip(order, order[1:] + [None]):
            first, last = bounds[step]
            steps[step][STEP] = (bounds[after][0] if after is not None else last) - first
        kept = [steps[s] for s in order[skip:]]
        if rank is None or not kept:
            raise UserError(f"{path} has no task after its first {skip} steps; trace more "
                            "steps or pass a smaller --skip-steps")
        out[rank] = {kind: [step.get(kind, 0.0) for step in kept]
                     for kind in {k for step in kept for k in step}}
        names[rank] = (path, set(kinds))
    return out, names


def _events(path: Path) -> list[dict]:
    """The task events ("X") of one rank's trace file."""
    try:
        events = json.loads(path.read_text())["traceEvents"]
        return [e for e in events if e.get("ph") == "X" and "step" in e.get("args", {})]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a trace of `ratrain run --trace` ({e})") from None


def _task(name: str, path: Path):
    try:
        return parse_task(name)
    except ValueError:
        raise UserError(f"{path}: {name!r} is not a task; give the directory that "
                        "`ratrain run --trace` wrote") from None


def check_same_program(program, names: dict) -> None:
    """Every task replica 0's ranks traced (`names`: rank -> (file, task texts)) is one of
    their stage's tasks in `program`."""
    for stage, tasks in program.tasks.items():
        if (rank := program.rank(stage, 0)) not in names:
            continue  # compare() names the missing rank
        path, traced = names[rank]
        if stray := min(traced - {str(t) for t in tasks}, default=None):
            raise UserError(f"{path} holds task {stray}, which stage {stage} of this program "
                            "does not run: trace the program that DIR holds")


def simulated_seconds(sim) -> dict[int, dict[str, float]]:
    """rank -> kind -> seconds of the replayed step (and "all")."""
    out = {}
    for rank, spans in sim.replay.spans.items():
        kinds: dict[str, float] = defaultdict(float)
        for span in spans:
            kinds[str(span.task.kind)] += span.end - span.reached
            kinds["all"] += span.end - span.reached
        out[rank] = dict(kinds)
    return out


def compare(program, measured: dict, simulated: dict) -> list[Row]:
    """One row per stage and task kind the simulation or replica 0's trace has."""
    dp, rows = program.options.dp, []
    for stage in range(program.options.pp):
        ranks = [program.rank(stage, replica) for replica in range(dp)]
        if missing := [r for r in ranks if r not in measured]:
            raise UserError(f"the trace has no file of rank {missing[0]} (stage {stage}); "
                            "trace the program that DIR holds, every rank")
        sim, first = simulated[ranks[0]], measured[ranks[0]]
        for kind in sorted((set(sim) | set(first)) - {STEP}, key=lambda k: (k == "all", k)):
            per_replica = [statistics.median(measured[r].get(kind, [0.0])) for r in ranks]
            rows.append(Row(stage, kind, per_replica[0], sim.get(kind, 0.0),
                            min(per_replica), max(per_replica)))
    return rows


@dataclass(frozen=True)
class Comparison:
    trace_dir: Path
    skip: int                           # traced steps left out
    steps: int                          # steps compared (the fewest any rank traced)
    rows: list[Row]
    step: float                         # rank 0's median step, first task to the next's
    step_fewest: float                  # ... the least of any rank
    step_most: float                    # ... the most
    simulated_step: float

    def record(self) -> dict:
        """The JSON form (`ratrain simulate --json --against`), in seconds."""
        return {"trace": str(self.trace_dir), "steps": [self.skip + 1, self.skip + self.steps],
                "step_s": {"measured": self.step, "fewest": self.step_fewest,
                           "most": self.step_most, "simulated": self.simulated_step},
                "rows": [{"stage": r.stage, "kind": r.kind, "measured_s": r.measured,
                          "simulated_s": r.simulated, "fewest_s": r.fewest,
                          "most_s": r.most} for r in self.rows]}

    def text(self) -> str:
        lines = [f"measured ({self.trace_dir}, median of steps {self.skip + 1}-"
                 f"{self.skip + self.steps}; waits inside tasks included) against simulated, "
                 "ms per step; replicas: the fewest and most ms any replica of the stage "
                 "measured",
                 f"{'stage':>5}  {'kind':<7} {'measured':>10} {'simulated':>10} {'ratio':>7}"
                 f"   {'replicas':>19}"]
        for row in self.rows:
            ratio = f"{row.measured / row.simulated:6.2f}x" if row.simulated > 0 else "      -"
            lines.append(f"{row.stage:>5}  {row.kind:<7} {1e3 * row.measured:>10.2f} "
                         f"{1e3 * row.simulated:>10.2f} {ratio}   "
                         f"{1e3 * row.fewest:>9.2f}-{1e3 * row.most:.2f}")
        lines.append(f"step: measured {1e3 * self.step:.2f} ms (rank 0, from a step's first "
                     f"task to the next's; every rank {1e3 * self.step_fewest:.2f}-"
                     f"{1e3 * self.step_most:.2f}), simulated {1e3 * self.simulated_step:.2f} "
                     f"ms, error {self.simulated_step / self.step - 1:+.1%}")
        return "\n".join(lines)


def against(sim, trace_dir: Path, skip: int) -> Comparison:
    """`sim` against the traces in `trace_dir`, after their first `skip` steps."""
    measured, names = measured_seconds(trace_dir, skip)
    check_same_program(sim.program, names)
    rows = compare(sim.program, measured, simulated_seconds(sim))
    steps = {rank: statistics.median(kinds[STEP]) for rank, kinds in measured.items()}
    return Comparison(trace_dir, skip, min(len(k["all"]) for k in measured.values()), rows,
                      steps[min(steps)], min(steps.values()), max(steps.values()),
                      sim.step_time)
