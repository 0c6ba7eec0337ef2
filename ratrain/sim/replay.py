"""replay: run per-rank task lists through the event engine and time every step.

Each rank walks its tasks in program order, as the runtime does: compute on its stream,
receives posted early and waited for at RECV, sends and DP collectives transferred on its
port (engine.Link) while the rank goes on, in-flight collectives completed when a later
step touches their buffers, and a step that ends when every rank has finished its tasks
and everything it started. The dry run (passes/dryrun.py) is the special case of unit
costs and free messages (steps.UnitCosts).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ratrain.ir.tasks import BACKWARDS, Kind, Schedule, Task
from ratrain.sim.engine import Engine, Link, Signal
from ratrain.sim.steps import Compute, Post, Recv, Send, Start, TieSum, Touch, WorldSum


@dataclass(frozen=True)
class TaskSpan:
    task: Task                          # what ran
    reached: float                      # the rank got to it (its previous task ended)
    start: float                        # its first compute began (after any wait)
    end: float                          # its last step ended


@dataclass(frozen=True)
class Interval:
    lane: str                           # "compute", "wait" or "port: <channel>"
    start: float                        # seconds from the step start
    end: float
    label: str                          # the task or transfer ("1B3", "allgather L5")
    nbytes: float = 0.0                 # bytes sent, for transfers


@dataclass(frozen=True)
class Replay:
    spans: dict[int, tuple[TaskSpan, ...]]      # rank -> its tasks, program order
    intervals: dict[int, tuple[Interval, ...]]  # rank -> busy/wait/transfer intervals
    ends: dict[int, float]                      # rank -> all its work and transfers done
    period: float | None = None                 # steady-state step time, if measured

    @property
    def step_time(self) -> float:
        """The steady-state period when measured (NOTE [steady state]), else the time
        until every rank has finished the step and everything it started."""
        return self.period if self.period is not None else max(self.ends.values(), default=0.0)

    def busy(self, rank: int) -> float:
        return sum(i.end - i.start for i in self.intervals[rank] if i.lane == "compute")

    def straggle(self, rank: int) -> float:
        """Seconds the rank's collectives waited for their latest replica (NOTE
        [stragglers])."""
        return sum(i.end - i.start for i in self.intervals[rank] if i.lane == STRAGGLE_LANE)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the compute streams over the step."""
        total = len(self.ends) * self.step_time
        return 1 - sum(self.busy(r) for r in self.ends) / total if total else 0.0

    def last_backward_end(self, rank: int) -> float | None:
        ends = [s.end for s in self.spans[rank] if s.task.kind in BACKWARDS]
        return max(ends) if ends else None

    @property
    def exposed_tail(self) -> float:
        """From the end of the pipeline's last backward to the end of the step."""
        ends = [e for e in map(self.last_backward_end, self.ends) if e is not None]
        return max(0.0, self.step_time - max(ends)) if ends else 0.0


STRAGGLE_LANE = "stragglers"            # intervals of a collective's wait for its latest replica


@dataclass
class _Op:
    """A collective in flight on a rank: its buffers stay busy until it is waited for."""
    step: Start
    task: Task
    done: Signal
    waited: bool = False


@dataclass
class _RankState:
    spans: list = field(default_factory=list)
    intervals: list = field(default_factory=list)
    in_flight: dict = field(default_factory=dict)   # buffer -> _Op
    ops: list = field(default_factory=list)         # _Ops in issue order
    sends: list = field(default_factory=list)       # arrival Signals of its messages
    world_sums: int = 0                              # WorldSums reached so far
    met_at: float = 0.0                              # when its last collective ended
    tie_sums: int = 0                                # TieSums reached so far


class _Replayer:
    def __init__(self, schedule: Schedule, costs, bandwidth: float, overlap: bool,
                 steps: int = 1, progress_share: float = 1.0, kernel_slowdown: float = 1.0):
        self.schedule, self.costs, self.overlap, self.steps = schedule, costs, overlap, steps
        self.bandwidth, self.engine = bandwidth, Engine()
        self.ranks = {rank: _RankState() for rank in schedule}
        self.links = {rank: Link(self.engine, bandwidth, self._on_transfer(rank),
                                 progress_share, kernel_slowdown=kernel_slowdown)
                      for rank in schedule}
        self.posted: dict[Task, Signal] = {}
        self.arrived: dict[Task, Signal] = {}
        self.world_sums: dict[int, list] = {}       # k -> [arrivals, Signal]
        self.tie_sums: dict[int, list] = {}         # k -> [arrivals, Signal]
        self.tie_members = sum(any(t.kind == Kind.TIE for t in ts) for ts in schedule.values())
        self.ends: dict[int, float] = {}

    def _on_transfer(self, rank: int):
        def record(channel, start, end, what):
            label, nbytes = what
            self.ranks[rank].intervals.append(Interval(f"port: {channel}", start, end, label,
                                                       nbytes))
        return record

    def _signal(self, table: dict, key) -> Signal:
        if key not in table:
            table[key] = Signal(self.engine)
        return table[key]

    def run(self) -> Replay:
        for rank, tasks in self.schedule.items():
            self.engine.spawn(self._rank(rank, tasks))
        self.engine.run()
        stuck = sorted(set(self.schedule) - set(self.ends))
        if stuck:
            raise RuntimeError(f"replay stopped with ranks {stuck} waiting: the schedule "
                               "deadlocks (dry_run names the cycle)")
        return Replay({r: tuple(s.spans) for r, s in self.ranks.items()},
                      {r: tuple(s.intervals) for r, s in self.ranks.items()}, self.ends)

    # ---- one rank ---------------------------------------------------------------------

    def _rank(self, rank: int, tasks):
        state = self.ranks[rank]
        for epoch in range(self.steps):
            for task in tasks:
                reached, first = self.engine.now, None
                for step in self.costs.steps(task):
                    if isinstance(step, Compute) and first is None:
                        first = self.engine.now
                    yield from self._step(rank, task, step, epoch)
                if epoch == 0:
                    state.spans.append(TaskSpan(task, reached, self.engine.now if first is None
                                                else first, self.engine.now))
            if epoch + 1 < self.steps:  # as rt/executor.run_step: sends done, the rest not
                yield from self._wait_sends(rank)
        yield from self._drain(rank)
        self.ends[rank] = self.engine.now

    def _step(self, rank: int, task: Task, step, epoch: int = 0):
        if isinstance(step, Compute):
            yield from self._compute(rank, str(task), step.seconds)
        elif isinstance(step, Touch):
            for buffer in step.buffers:
                op = self.ranks[rank].in_flight.get(buffer)
                if op is not None:
                    yield from self._complete(rank, op, str(task))
        elif isinstance(step, Start):
            yield from self._start(rank, task, step)
        elif isinstance(step, Post):
            self._post((epoch, step.message))
        elif isinstance(step, Send):
            self._send(rank, step, (epoch, step.message))
        elif isinstance(step, Recv):
            self._post((epoch, step.message))  # a receive not posted earlier is posted now
            yield from self._wait(rank, self._signal(self.arrived, (epoch, step.message)),
                                  str(task))
        elif isinstance(step, WorldSum):
            yield from self._world_sum(rank, step, str(task))
        elif isinstance(step, TieSum):
            yield from self._tie_sum(rank, step, str(task))
        else:
            raise TypeError(f"unknown step {step!r} of {task}")

    def _compute(self, rank: int, label: str, seconds: float):
        if seconds > 0:
            start, link = self.engine.now, self.links[rank]
            if link.couples_compute:  # NOTE [manual progress]
                done = Signal(self.engine)
                link.compute(seconds, done)
                yield done
            else:
                yield seconds
            self.ranks[rank].intervals.append(Interval("compute", start, self.engine.now, label))

    def _wait(self, rank: int, signal: Signal, label: str):
        if not signal.fired:
            start = self.engine.now
            yield signal
            self.ranks[rank].intervals.append(Interval("wait", start, self.engine.now, label))

    # ---- messages ---------------------------------------------------------------------

    def _post(self, key: tuple) -> None:
        posted = self._signal(self.posted, key)
        if not posted.fired:
            posted.fire()

    def _send(self, rank: int, step: Send, key: tuple) -> None:
        """The transfer starts once the receive is posted (rendezvous), after the
        message latency, on the sender's port. `key`: (step number, the RECV task)."""
        arrived = self._signal(self.arrived, key)
        self.ranks[rank].sends.append(arrived)
        self._signal(self.posted, key).on_fire(
            lambda: self._transmit(rank, step.channel, step.latency, step.nbytes, arrived,
                                   str(step.message), step.rate))

    def _transmit(self, rank, channel, latency, nbytes, done: Signal, label,
                  rate: float = 0.0) -> None:
        """Put `nbytes` on the rank's port after `latency`; bytes that move at `rate`
        alone (not the port's bandwidth) occupy it for as long as they take."""
        if nbytes <= 0:
            done.fire_after(latency)
            return
        busy = nbytes * self.bandwidth / rate if rate else nbytes
        self.engine.at(self.engine.now + latency,
                       lambda: self.links[rank].send(channel, busy, done, (label, nbytes)))

    # ---- collectives ------------------------------------------------------------------

    def _start(self, rank: int, task: Task, step: Start):
        state = self.ranks[rank]
        for buffer in step.buffers:  # the hazard rule, should a cost model not Touch first
            if buffer in state.in_flight:
                yield from self._complete(rank, state.in_flight[buffer], str(task))
        op = _Op(step, task, Signal(self.engine))
        now, late = self.engine.now, 0.0
        if step.straggle > 0:  # see NOTE [stragglers]: the bytes move once the latest arrives
            late = step.straggle * (now - state.met_at)
            state.intervals.append(Interval(STRAGGLE_LANE, now, now + late,
                                            f"{step.what or task}: latest replica"))
        self._transmit(rank, "dp", step.latency + late, step.nbytes, op.done,
                       step.what or str(task), step.rate)
        state.ops.append(op)
        state.in_flight.update(dict.fromkeys(step.buffers, op))
        if not self.overlap:
            yield from self._complete(rank, op, str(task))

    def _complete(self, rank: int, op: _Op, label: str):
        """Wait for `op`, then run its finishing work on the compute stream."""
        if op.waited:
            return
        op.waited = True
        state = self.ranks[rank]
        for buffer in op.step.buffers:
            if state.in_flight.get(buffer) is op:
                del state.in_flight[buffer]
        yield from self._wait(rank, op.done, label)
        state.met_at = max(state.met_at, self.engine.now)  # NOTE [stragglers]
        yield from self._compute(rank, f"{op.task} (finish)", op.step.finish)

    def _world_sum(self, rank: int, step: WorldSum, label: str):
        """Blocking: ends `step.seconds` after the last rank has joined."""
        state = self.ranks[rank]
        entry = self.world_sums.setdefault(state.world_sums, [0, Signal(self.engine)])
        state.world_sums += 1
        entry[0] += 1
        if entry[0] == len(self.schedule):
            entry[1].fire_after(step.seconds)
        yield from self._wait(rank, entry[1], label)
        state.met_at = max(state.met_at, self.engine.now)  # NOTE [stragglers]

    def _tie_sum(self, rank: int, step: TieSum, label: str):
        """Blocking: ends `step.seconds` after the last tie stage has joined."""
        state = self.ranks[rank]
        entry = self.tie_sums.setdefault(state.tie_sums, [0, Signal(self.engine)])
        state.tie_sums += 1
        entry[0] += 1
        if entry[0] == self.tie_members:
            entry[1].fire_after(step.seconds)
        yield from self._wait(rank, entry[1], label)

    def _drain(self, rank: int):
        """The step ends when the rank's collectives and messages have completed."""
        state = self.ranks[rank]
        for op in state.ops:
            yield from self._complete(rank, op, f"{op.task} (step end)")
        yield from self._wait_sends(rank)

    def _wait_sends(self, rank: int):
        state = self.ranks[rank]
        for arrived in state.sends:
            yield from self._wait(rank, arrived, "sends (step end)")
        state.sends = []


# NOTE [steady state]: the runtime ends a step once its sends are done; collectives still
# in flight (the view all-gathers of the step's tail, NOTE [update order after NORM])
# complete when the next step first touches their buffers, so they overlap that step's
# forwards. One replayed step that drains everything therefore overstates the step time
# of a run. Replaying two steps back to back and subtracting one drained step gives the
# steady-state period: both runs end with the same drained tail.
def replay(schedule: Schedule, costs, *, bandwidth: float = 1.0, overlap: bool = True,
           steady: bool = False, progress_share: float = 1.0,
           kernel_slowdown: float = 1.0) -> Replay:
    """Time `schedule` (rank -> tasks) with `costs` (an object with `steps(task)`).

    `bandwidth` is every rank's port rate in bytes/s; overlap=False waits for each DP
    collective right after starting it (the serialized reference); steady=True also
    measures the steady-state period (NOTE [steady state]) as the step time;
    `progress_share`: how fast DP collectives move while their rank computes (NOTE
    [manual progress], sim/engine.py); `kernel_slowdown`: how much longer a rank's compute
    takes while they move (NOTE [kernels beside collectives]).
    """
    one = _Replayer(schedule, costs, bandwidth, overlap, 1, progress_share,
                    kernel_slowdown).run()
    if not steady:
        return one
    two = _Replayer(schedule, costs, bandwidth, overlap, 2, progress_share,
                    kernel_slowdown).run()
    period = max(two.ends.values()) - max(one.ends.values())
    return replace(one, period=period)
