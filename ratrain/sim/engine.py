"""The discrete-event core of the simulator: a clock, signals, processes and shared links.

Processes are generators that yield a delay in seconds or a Signal to wait for (as in
SimPy). Ties are broken by scheduling order, so a replay is deterministic. A Link is one
rank's outgoing network port: transfers queue first-in first-out per channel (MPI
completes the collectives of one communicator, and the messages to one peer, in order)
and the busy channels share the port's bandwidth equally (NOTE [link sharing]).
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Callable, Generator

Process = Generator[object, None, None]  # yields float (delay) or Signal (wait)


class Engine:
    """The clock and the event queue."""

    def __init__(self):
        self.now = 0.0
        self._queue: list = []
        self._order = itertools.count()

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (time, next(self._order), action))

    def spawn(self, process: Process) -> None:
        """Run `process` from now on: resume it after each delay or signal it yields."""
        def resume() -> None:
            try:
                item = next(process)
            except StopIteration:
                return
            if isinstance(item, Signal):
                item.on_fire(resume)
            else:
                self.at(self.now + item, resume)
        self.at(self.now, resume)

    def run(self) -> float:
        """Process every event; the time of the last one."""
        while self._queue:
            self.now, _, action = heapq.heappop(self._queue)
            action()
        return self.now


class Signal:
    """Something that happens once (a message arrives, a collective ends); waiters resume
    at that time."""

    def __init__(self, engine: Engine):
        self.engine, self.time, self._waiters = engine, None, []

    @property
    def fired(self) -> bool:
        return self.time is not None

    def fire(self) -> None:
        self.time = self.engine.now
        for waiter in self._waiters:
            self.engine.at(self.time, waiter)
        self._waiters = []

    def fire_after(self, delay: float) -> None:
        self.engine.at(self.engine.now + delay, self.fire)

    def on_fire(self, action: Callable[[], None]) -> None:
        if self.fired:
            self.engine.at(self.engine.now, action)
        else:
            self._waiters.append(action)


# NOTE [link sharing]: a rank's port serves one transfer per channel at a time (the head
# of that channel's queue); the heads of all busy channels progress at bandwidth / (number
# of busy channels) each (processor sharing). Pipeline sends use one channel per peer and
# DP collectives one channel, so an activation is never stuck behind a whole gradient
# reduction, but two gradient reductions run one after the other, as MPI progresses the
# collectives of a communicator in order. A ring collective is modelled as its per-rank
# traffic through this rank's port: by symmetry every member's port carries the same.


# NOTE [manual progress]: an MPI library without a progress thread of its own (the mpich
# wheel over shared memory) moves a collective's bytes only inside MPI calls: while the
# rank runs a kernel, the runtime's helper thread probes every millisecond (NOTE [progress
# while kernels run], rt/comm.py), which keeps a socket busy but copies only a few cells of
# a large shared-memory transfer. Measured on a 16-core node (pp 1 x dp 16, ZeRO 2), the
# backward ran as fast as alone while the layers' reduce-scatters waited for the UPDs to
# move them. A Link therefore slows its DP channel to `progress_share` of its speed while
# its rank computes (0: it stops; 1: DMA engines, no effect).


# NOTE [kernels beside collectives]: the bytes a collective moves while its rank computes
# are copied by that rank's cores (the helper thread's probes, MPI tested between
# kernels), so the kernels slow down while it moves. `ratrain calibrate` measures both
# sides of it in one experiment (calibrate/node_probe.beside_kernel: a GEMM loop with
# all-reduces streaming beside it on every rank): the all-reduces keep progress_share of
# their speed and the GEMM loop takes kernel_slowdown_beside times as long (1.98 on the
# 2-core machine of bench/predict.py, where a dp 2 ZeRO 3 step's forward and backward
# ran 7-10% slower than their kernels' calibrated times). A Link therefore runs its
# rank's compute as work at 1 / kernel_slowdown while a held channel moves beside it and
# at full speed otherwise; a profile without the measurement slows nothing. A traced
# profile's own slowdown, what a run's backwards took beside its collectives (NOTE [traced
# rows] 6, calibrate/from_trace.py: 1.06 on the 16-core node, where the probe said 1.78),
# replaces the probe's.


class _Transfer:
    def __init__(self, nbytes: float, done: Signal, record):
        self.total, self.remaining, self.done, self.record = nbytes, nbytes, done, record
        self.started: float | None = None


class Link:
    """One rank's outgoing port: per-channel FIFO queues sharing `bandwidth` (bytes/s);
    `held` channels move at `progress_share` of their share while the rank computes, and
    the rank's compute (`compute`) runs at 1 / `kernel_slowdown` while a held channel
    moves (NOTE [kernels beside collectives])."""

    def __init__(self, engine: Engine, bandwidth: float, on_transfer=None,
                 progress_share: float = 1.0, held: tuple[str, ...] = ("dp",),
                 kernel_slowdown: float = 1.0):
        self.engine, self.bandwidth = engine, bandwidth
        self.on_transfer = on_transfer  # called (channel, start, end, record) per transfer
        self.progress_share, self.held, self.computing = progress_share, held, False
        self.kernel_slowdown = kernel_slowdown
        self._queues: dict[str, deque] = {}
        self._work: _Transfer | None = None  # the compute running: seconds of work left
        self._updated, self._version = 0.0, 0

    def send(self, channel: str, nbytes: float, done: Signal, record=None) -> None:
        """Queue `nbytes` on `channel`; fire `done` when its last byte has left."""
        self._advance()
        queue = self._queues.setdefault(channel, deque())
        queue.append(_Transfer(nbytes, done, record))
        self._reschedule()

    @property
    def couples_compute(self) -> bool:
        """Does the rank's compute change this port's speed or its own (NOTE [manual
        progress], NOTE [kernels beside collectives])? Else compute is a plain delay."""
        return self.progress_share < 1 or self.kernel_slowdown != 1

    def compute(self, seconds: float, done: Signal) -> None:
        """Run `seconds` of the rank's compute (alone, at full speed); fire `done` when it
        is finished. Requires: no compute of this rank running (NOTE [manual progress],
        NOTE [kernels beside collectives])."""
        self._advance()
        self.computing, self._work = True, _Transfer(seconds, done, None)
        self._reschedule()

    def _heads(self) -> list[tuple[str, _Transfer]]:
        return [(channel, queue[0]) for channel, queue in self._queues.items() if queue]

    def _rate(self, channel: str, heads: int) -> float:
        share = self.progress_share if self.computing and channel in self.held else 1.0
        return self.bandwidth / heads * share

    def _work_rate(self, heads) -> float:
        """Seconds of compute done per second: slowed while a held channel moves."""
        moving = any(channel in self.held and self._rate(channel, len(heads)) > 0
                     for channel, _ in heads)
        return 1.0 / self.kernel_slowdown if moving else 1.0

    def _advance(self) -> None:
        """Account the bytes each head has sent, and the compute done, since the last
        update."""
        now, heads = self.engine.now, self._heads()
        for channel, head in heads:
            head.remaining -= (now - self._updated) * self._rate(channel, len(heads))
        if self._work is not None:
            self._work.remaining -= (now - self._updated) * self._work_rate(heads)
        self._updated = now

    def _reschedule(self) -> None:
        self._version += 1
        heads = self._heads()
        for _, head in heads:
            if head.started is None:
                head.started = self.engine.now
        waits = [max(head.remaining, 0.0) / rate for channel, head in heads
                 if (rate := self._rate(channel, len(heads))) > 0]
        if self._work is not None:
            waits.append(max(self._work.remaining, 0.0) / self._work_rate(heads))
        if waits:
            version = self._version
            self.engine.at(self.engine.now + min(waits), lambda: self._tick(version))

    def _tick(self, version: int) -> None:
        if version != self._version:  # superseded by a later send or tick
            return
        self._advance()
        heads = self._heads()
        for channel, head in heads:
            rate = self._rate(channel, len(heads))
            if rate <= 0:
                continue
            if self._finished(head, rate):
                self._queues[channel].popleft()
                if self.on_transfer is not None:
                    self.on_transfer(channel, head.started, self.engine.now, head.record)
                head.done.fire()
        work = self._work
        if work is not None and self._finished(work, self._work_rate(heads)):
            self._work, self.computing = None, False
            work.done.fire()
        self._reschedule()

    def _finished(self, item: _Transfer, rate: float) -> bool:
        """Is what is left of `item` at `rate` nothing, or less than the clock resolves?"""
        return item.remaining <= 1e-9 * item.total or \
            self.engine.now + item.remaining / rate == self.engine.now
