"""Everything the runtime says to other ranks, and the only module that imports mpi4py.

Pipeline messages are point-to-point on COMM_WORLD (tag = program_format/lowered.message_tag); DP
collectives run on a communicator per stage split from COMM_WORLD. Non-blocking calls
return an `InFlight` that the executor completes before anything touches its memory.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
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
        self.tie = None
        self.pipe = None

    @classmethod
    def alone(cls) -> "Communicators":
        """This rank as the only member of its DP group: `ratrain calibrate` times the
        runtime's own work around a collective (its start and finish) this way."""
        comms = cls()
        comms.dp = MPI.COMM_SELF
        return comms

    def split_dp_group(self, stage: int, replica: int) -> None:
        self.dp = self.world.Split(color=stage, key=replica)

    def split_pipe_group(self, stage: int, replica: int) -> None:
        """The stages of this rank's replica, by stage: the vocabulary-parallel head's
        collectives (NOTE [vocabulary-parallel head])."""
        self.pipe = self.world.Split(color=replica, key=stage)

    def split_tie_group(self, stage: int, replica: int, stages: tuple[int, ...]) -> None:
        """The ranks of `stages` in this replica (NOTE [tied weights]); every rank calls
        it, those on no tie stage get no group."""
        color = replica if stage in stages else MPI.UNDEFINED
        self.tie = self.world.Split(color=color, key=stage)

    def agree_on_errors(self, message: str | None) -> list[str]:
        """Every rank's set-up error (or None), on every rank: all fail together."""
        return [m for m in self.world.allgather(message) if m]

    def agree_on_stop(self, received: int) -> int:
        """The largest stop signal any rank received (0: none), on every rank: all stop at
        the same step (NOTE [stopping at one step], rt/stop.py)."""
        return int(self.world.allreduce(received, op=MPI.MAX))

    def gather_to_root(self, value):
        return self.world.gather(value, root=0)

    def broadcast_from_root(self, value):
        return self.world.bcast(value, root=0)

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
    """Messages travel as bytes: any dtype (fp16, bf16) without an MPI type for it."""
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


def start_param_allgather(comms: Communicators, shard: np.ndarray, ranges, finish,
                          into: np.ndarray | None = None) -> InFlight:
    """Concatenate the DP group's master shards (equal, padded sizes) into `into` (an
    arena view of D shards) or a new array; finish(full)."""
    full = np.empty(shard.size * comms.dp.Get_size(), shard.dtype) if into is None else into
    # as bytes: bf16 views (ml_dtypes) have no MPI type and no DLPack export
    request = comms.dp.Iallgather(_as_bytes(np.ascontiguousarray(shard)), _as_bytes(full))
    return InFlight(request, ranges, lambda: finish(full), keep=(full,))


def gather_layer_state(comms: Communicators, shards, n: int):
    """Replica 0 of the DP group gets each of `shards` (master, m, v of one layer, this
    rank's equal-sized ZeRO shards) whole, cut to the layer's n elements; the other
    replicas get None (NOTE [checkpoints without gathering], rt/checkpoint.py)."""
    root = comms.dp.Get_rank() == 0
    out = []
    for shard in shards:
        whole = np.empty(shard.size * comms.dp.Get_size(), shard.dtype) if root else None
        comms.dp.Gather(np.ascontiguousarray(shard), whole, root=0)
        out.append(whole[:n] if root else None)
    return out if root else None


def start_hidden_broadcast(comms: Communicators, hidden: np.ndarray, root: int,
                           ranges) -> InFlight:
    """Ibcast of the final hidden state from the last stage into every stage's arena slot
    (NOTE [vocabulary-parallel head])."""
    return InFlight(comms.pipe.Ibcast(_as_bytes(hidden), root=root), ranges)


def start_stats_allgather(comms: Communicators, part: np.ndarray, out: np.ndarray,
                          ranges) -> InFlight:
    """Iallgather of every stage's softmax statistics (float32) into `out` [P, ...]."""
    part = np.ascontiguousarray(part, np.float32)
    return InFlight(comms.pipe.Iallgather(part, out), ranges, keep=(part,))


def start_hidden_grad_reduce(comms: Communicators, part: np.ndarray, root: int,
                             into: np.ndarray | None, ranges) -> InFlight:
    """Ireduce (float32 sum) of the stages' parts of the final hidden state's gradient
    into the last stage's `into` (rounded to its dtype when the sum is done)."""
    part = np.ascontiguousarray(part, np.float32)
    total = into if into is None or into.dtype == np.float32 else \
        np.empty(into.shape, np.float32)
    request = comms.pipe.Ireduce(part, total, op=MPI.SUM, root=root)
    finish = None if total is into else (lambda: into.__setitem__(..., total))
    return InFlight(request, ranges, finish, keep=(part, total))


def gather_row_shards(comms: Communicators, arrays):
    """Stage 0 of the pipeline group gets each of `arrays` (master, m, v of a shard of a
    vocabulary-parallel head, whole or None on a DP replica that is not the group's
    writer) concatenated over the stages in stage order; the other stages get None.
    Every stage's shard has the same size (NOTE [vocabulary-parallel head])."""
    root, out = comms.pipe.Get_rank() == 0, []
    for array in arrays:
        part = np.ascontiguousarray(array if array is not None else np.empty(0, np.float32))
        whole = np.empty(part.size * comms.pipe.Get_size(), part.dtype) if root else None
        comms.pipe.Gather(part, whole, root=0)
        out.append(whole)
    return out if root else None


def sum_tied_gradient(comms: Communicators, grad: np.ndarray) -> None:
    """Blocking in-place sum of a tied weight's gradient over the tie stages."""
    comms.tie.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)


def sum_over_world(comms: Communicators, value: float) -> float:
    """Blocking scalar all-reduce (global gradient norm)."""
    return float(comms.world.allreduce(float(value), op=MPI.SUM))


def drive_progress(in_flight: list[InFlight]) -> bool:
    """Let MPI move pending transfers forward between kernels (no waiting); whether any
    is still pending."""
    return bool(in_flight) and not MPI.Request.Testall([op.request for op in in_flight])


# NOTE [progress while kernels run]: MPI moves a message only inside MPI calls when its
# transport has manual progress, as libfabric's tcp provider (the test cluster's links,
# ratrain/cluster) does, and as MPICH's own pipelines for large messages and its
# non-blocking collective schedules (each round starts inside a call) do. The executor calls
# MPI only between kernels, so a gradient all-reduce issued before a 30 ms layer backward
# had moved a socket buffer's worth by the end of it: measured on the 61.67 MB/s cluster, four
# 3.2 MB all-reduces behind 28 ms kernels took 400-530 ms against 206 ms when waited on, and
# ratrain's DP=2 tail left the link idle for a third of it. While a kernel runs with a
# transfer pending, a helper thread therefore probes a private communicator every
# `interval` (a probe runs MPI's progress engine; MPI_THREAD_MULTIPLE) and sleeps between
# probes: ranks share the cores, so it must never spin (MPICH's own progress thread,
# MPIR_CVAR_ASYNC_PROGRESS, spins and made both schedules slower). With a 1 ms interval
# the same all-reduces took 212-230 ms. The thread sleeps on an event when nothing is
# pending, so a step without transfers in flight pays nothing.

class ProgressAgent:
    """A daemon thread that runs MPI's progress engine every `interval` s while `poking`."""

    def __init__(self, comms: Communicators, interval: float):
        self.comm, self.interval = comms.world.Dup(), interval
        self._poking, self._stopped = threading.Event(), False
        self._thread = threading.Thread(target=self._run, name="mpi-progress", daemon=True)
        self._thread.start()

    @staticmethod
    def usable(interval: float) -> bool:
        """A positive interval, and an MPI that lets a second thread call it."""
        return interval > 0 and MPI.Query_thread() == MPI.THREAD_MULTIPLE

    @contextlib.contextmanager
    def poking(self):
        """Probe every interval until the block ends."""
        self._poking.set()
        try:
            yield
        finally:
            self._poking.clear()

    def stop(self) -> None:
        self._stopped = True
        self._poking.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._poking.wait()
            if self._stopped:
                return
            self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)  # nothing is sent on it
            time.sleep(self.interval)


def abort_job(message: str) -> None:
    """One line to stderr, then end every rank of the job (never hang)."""
    print(message, file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Abort(1)
    os._exit(1)  # Abort does not return; if an MPI ever lets it, still never continue
