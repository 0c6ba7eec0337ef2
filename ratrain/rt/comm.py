"""Everything the runtime says to other ranks, and the only module that imports mpi4py.

Pipeline messages are point-to-point on COMM_WORLD (tag = message_tag of the task); DP
collectives run on a communicator per stage split from COMM_WORLD. Non-blocking calls
return an `InFlight` that the executor completes before anything touches its memory.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from mpi4py import MPI


@dataclass
class InFlight:
    request: MPI.Request                # the non-blocking MPI operation
    ranges: tuple                       # arena byte ranges [lo, hi) it reads or writes
    finish: Callable | None = None      # run once, after the request completes
    keep: tuple = ()                    # temporaries that must outlive the request
    done: bool = field(default=False)

    def complete(self) -> None:
        if not self.done:
            self.request.Wait()
            self.done = True
            if self.finish is not None:
                self.finish()

    def overlaps(self, lo: int, hi: int) -> bool:
        return any(a < hi and lo < b for a, b in self.ranges)


class Communicators:
    """COMM_WORLD and this rank's DP group (the replicas of its stage, by replica)."""

    def __init__(self):
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.dp = None

    def split_dp_group(self, stage: int, replica: int) -> None:
        self.dp = self.world.Split(color=stage, key=replica)

    def agree_on_errors(self, message: str | None) -> list[str]:
        """Every rank's set-up error (or None), on every rank: all fail together."""
        return [m for m in self.world.allgather(message) if m]

    def gather_to_root(self, value):
        return self.world.gather(value, root=0)

    def barrier(self) -> None:
        self.world.Barrier()


def send_activation(comms: Communicators, dest: int, tag: int, message: np.ndarray) -> InFlight:
    """Isend of a copy: the arena slot may be reused as soon as this returns."""
    copy = np.ascontiguousarray(message).copy()
    return InFlight(comms.world.Isend(_as_bytes(copy), dest=dest, tag=tag), (), keep=(copy,))


def post_activation_receive(comms: Communicators, source: int, tag: int, target: np.ndarray,
                            ranges) -> InFlight:
    """Irecv straight into the arena slot (live from its POST, plan_memory)."""
    return InFlight(comms.world.Irecv(_as_bytes(target), source=source, tag=tag), ranges)


def _as_bytes(array: np.ndarray):
    """Messages travel as bytes: any dtype (fp16 included) without an MPI type for it."""
    return [array.reshape(-1).view(np.uint8), MPI.BYTE]


def start_grad_allreduce(comms: Communicators, grad: np.ndarray, ranges, finish) -> InFlight:
    """In-place sum of a gradient over the DP group; finish(sum) when done."""
    request = comms.dp.Iallreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
    return InFlight(request, ranges, lambda: finish(grad))


def start_grad_reduce_scatter(comms: Communicators, grad: np.ndarray, counts, ranges,
                              finish) -> InFlight:
    """Sum over the DP group, this rank keeping its shard; finish(shard) when done."""
    part = np.empty(counts[comms.dp.Get_rank()], np.float32)
    request = comms.dp.Ireduce_scatter(grad, part, recvcounts=list(counts), op=MPI.SUM)
    return InFlight(request, ranges, lambda: finish(part), keep=(grad, part))


def start_param_allgather(comms: Communicators, shard: np.ndarray, ranges, finish) -> InFlight:
    """Concatenate the DP group's master shards (equal, padded sizes); finish(full)."""
    full = np.empty(shard.size * comms.dp.Get_size(), shard.dtype)
    request = comms.dp.Iallgather(shard, full)
    return InFlight(request, ranges, lambda: finish(full), keep=(full,))


def sum_over_world(comms: Communicators, value: float) -> float:
    """Blocking scalar all-reduce (global gradient norm)."""
    return float(comms.world.allreduce(float(value), op=MPI.SUM))


def drive_progress(in_flight: list[InFlight]) -> None:
    """Let MPI move pending transfers forward between kernels (no waiting)."""
    if in_flight:
        MPI.Request.Testall([op.request for op in in_flight])


def abort_job(message: str) -> None:
    """One line to stderr, then end every rank of the job (never hang)."""
    print(message, file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Abort(1)
    os._exit(1)  # Abort does not return; if an MPI ever lets it, still never continue
