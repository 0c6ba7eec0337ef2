"""What a task does to a rank's resources, as a short list of steps the replay runs.

A cost model turns each task into steps: compute on the rank's stream, pipeline messages
(posted, sent, waited), non-blocking DP collectives started on the rank's port and waited
for by the hazard rule (a later step touching their buffers), and the world-wide scalar
sum of NORM and the tied-gradient sum of TIE. `UnitCosts` reproduces the dry run (passes/dryrun.py); calls.ProfileCosts
costs a lowered program on a hardware profile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ratrain.ir.tasks import RECVS, SENDS, Kind, Task, counterpart
from ratrain.passes.dryrun import default_cost


@dataclass(frozen=True)
class Compute:
    seconds: float                      # the rank's compute stream is busy this long


@dataclass(frozen=True)
class Touch:
    buffers: tuple[str, ...]            # wait for in-flight collectives on these buffers


@dataclass(frozen=True)
class Start:
    buffers: tuple[str, ...]            # arena buffers the collective reads or writes
    latency: float                      # seconds of latency terms (port not busy)
    nbytes: float                       # bytes through this rank's port
    finish: float = 0.0                 # compute seconds when it is waited for
    what: str = ""                      # label in the trace ("reduce_scatter L3")
    rate: float = 0.0                   # B/s its bytes move at alone (NOTE [node
                                        # memory]); 0: the port's bandwidth
    straggle: float = 0.0               # expected wait for the group's latest member
                                        # per second since the rank's last collective
                                        # ended (NOTE [stragglers])


@dataclass(frozen=True)
class Post:
    message: Task                       # the RECV whose receive is posted


@dataclass(frozen=True)
class Send:
    message: Task                       # the RECV on the peer rank this message completes
    channel: str                        # port channel: one per peer direction
    latency: float                      # seconds before the first byte arrives
    nbytes: float                       # message size
    rate: float = 0.0                   # B/s alone (across nodes: the node's port);
                                        # 0: the port's bandwidth


@dataclass(frozen=True)
class Recv:
    message: Task                       # this RECV task: wait for its message


@dataclass(frozen=True)
class WorldSum:
    seconds: float                      # a blocking scalar all-reduce over every rank


@dataclass(frozen=True)
class TieSum:
    seconds: float                      # blocking: ends this long after every rank with a
                                        # TIE has reached its own (NOTE [tied weights])


Step = Compute | Touch | Start | Post | Send | Recv | WorldSum | TieSum

POSTED = {Kind.POST_F: Kind.RECV_F, Kind.POST_B: Kind.RECV_B}


def posted_receive(task: Task) -> Task:
    """The RECV whose receive a POST task posts (`1POST_F3` -> `1RECV_F3`)."""
    return Task(task.stage, POSTED[task.kind], micro_batch=task.micro_batch)


def send_channel(task: Task) -> str:
    return "to next stage" if task.kind == Kind.SEND_F else "to previous stage"


class UnitCosts:
    """Every task costs `cost(task)` on its rank's stream and messages take no time:
    the dry run's model, so replays agree with dry_run step for step."""

    def __init__(self, cost: Callable[[Task], float] = default_cost):
        self.cost = cost

    def steps(self, task: Task) -> tuple[Step, ...]:
        compute = Compute(self.cost(task))
        if task.kind in SENDS:
            return (compute, Send(counterpart(task), send_channel(task), 0.0, 0.0))
        if task.kind in POSTED:
            return (compute, Post(posted_receive(task)))
        if task.kind in RECVS:
            return (Recv(task), compute)
        if task.kind == Kind.TIE:   # the dry run starts the TIEs together
            return (TieSum(0.0), compute)
        return (compute,)
