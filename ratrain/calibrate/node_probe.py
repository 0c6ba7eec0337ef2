"""The node part of `ratrain calibrate`: DP collectives on every rank of the node at once,
and a kernel's speed while collectives stream beside it (probe.py calls these in the run
with one rank per core). A calibration tool, not the runtime: it talks to MPI directly.

What the simulator takes from them (NOTE [node memory], sim/collectives.py): the bytes
per second one rank's share of an intra-node collective moves when all the node's ranks
run it, and the compute a rank loses per byte while its collectives stream.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np
from mpi4py import MPI

# Bytes of one rank's gradient buffer: a small layer's and a larger layer's fp32 gradient
# (the 58M LLaMA's decoder layer holds 12.6 MB), past the last-level cache share, and a
# vocabulary-sized one (its embedding's 65.5 MB): the simulator scales the largest's time
# per byte (NOTE [measured node collectives], sim/collectives.py), which grows with size.
COLLECTIVE_BYTES = (4 << 20, 32 << 20, 64 << 20)
BESIDE_BYTES = 32 << 20                 # each all-reduce streaming beside the GEMM loop
COLLECTIVE_REPS = 3
BESIDE_SECONDS = 0.25                   # kernel time per pass of the beside-kernel probe
PROGRESS_INTERVAL = 1e-3                # as the runtime's --progress-us default


def _buffers(op: str, nbytes: int, members: int):
    """(send, receive) float32 arrays of `op` for a `nbytes` gradient (reduce-scatter and
    all-reduce input; all-gather output)."""
    n = nbytes // 4 // members * members
    whole = np.ones(n, np.float32)
    if op == "allreduce":
        return whole, np.empty_like(whole)
    if op == "reduce_scatter":
        return whole, np.empty(n // members, np.float32)
    return np.ones(n // members, np.float32), whole


def start_collective(comm, op: str, send, receive):
    """The non-blocking collective the runtime starts for `op` (rt/comm.py)."""
    if op == "allreduce":
        return comm.Iallreduce(send, receive, op=MPI.SUM)
    if op == "reduce_scatter":
        return comm.Ireduce_scatter(send, receive, recvcounts=[receive.size] * comm.size,
                                    op=MPI.SUM)
    return comm.Iallgather(send, receive)


def time_collectives(world, members: int) -> list[dict]:
    """Median seconds of each op and size, every rank of the world in a group of `members`
    (world.size // members groups) running it at the same time."""
    comm = world.Split(world.rank // members, world.rank)
    rows = []
    for op in ("allreduce", "reduce_scatter", "allgather"):
        for nbytes in COLLECTIVE_BYTES:
            send, receive = _buffers(op, nbytes, members)
            times = []
            for _ in range(COLLECTIVE_REPS + 1):
                world.Barrier()
                start = time.perf_counter()
                start_collective(comm, op, send, receive).Wait()
                times.append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
            rows.append({"op": op, "members": members, "groups": world.size // members,
                         "bytes": 4 * send.size if op != "allgather" else 4 * receive.size,
                         "seconds": statistics.median(times[1:])})
    comm.Free()
    return rows


def node_collectives(world) -> list[dict]:
    """time_collectives over the whole node, in two halves and in four quarters side by
    side (the DP groups of pipelines of 1, 2 and 4 stages filling the node)."""
    rows = time_collectives(world, world.size)
    for parts in (2, 4):
        if world.size >= 2 * parts and world.size % parts == 0:
            rows += time_collectives(world, world.size // parts)
    return rows


def _gemm(threads: int):
    """A decoder layer's up-projection of the 58M LLaMA (256 x 512 by 1376 x 512)."""
    from ratrain import kernels
    rng = np.random.default_rng(0)
    x, w = rng.random((256, 512), np.float32), rng.random((1376, 512), np.float32)
    y = np.empty((256, 1376), np.float32)
    return lambda: kernels.gemm(x, w, trans_b=True, out=y, threads=threads), 2 * 256 * 512 * 1376


def beside_kernel(world, threads: int) -> dict:
    """A GEMM loop timed alone, then with all-reduces of BESIDE_BYTES streaming beside
    it as the runtime runs them (a progress thread poking every PROGRESS_INTERVAL, MPI
    tested between kernel calls); the seconds each took and the all-reduce bytes
    finished meanwhile."""
    from types import SimpleNamespace

    from ratrain.rt.comm import ProgressAgent
    run, _ = _gemm(threads)
    for _ in range(3):
        run()
    world.Barrier()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < BESIDE_SECONDS:
        run()
        calls += 1
    calls = world.allreduce(calls, op=MPI.MIN)
    alone = _timed(world, run, calls, lambda: None)
    send, receive = _buffers("allreduce", BESIDE_BYTES, world.size)
    agent = ProgressAgent(SimpleNamespace(world=world), PROGRESS_INTERVAL) \
        if ProgressAgent.usable(PROGRESS_INTERVAL) else None
    state, stream = {"request": None, "started": 0}, world.Dup()  # apart from the timing's

    def drive():
        if state["request"] is None or state["request"].Test():
            state["request"] = start_collective(stream, "allreduce", send, receive)
            state["started"] += 1
    try:
        with agent.poking() if agent is not None else contextlib.nullcontext():
            beside = _timed(world, run, calls, drive)
        done = state["started"] - 1  # the last one may end after the kernels
        behind = world.allreduce(state["started"], op=MPI.MAX) - state["started"]
        state["request"].Wait()
        for _ in range(behind):  # match the ranks that started more
            start_collective(stream, "allreduce", send, receive).Wait()
    finally:
        if agent is not None:
            agent.stop()
        stream.Free()
    return {"kernel_seconds": alone, "kernel_seconds_beside": beside,
            "allreduce_bytes": 4 * send.size, "allreduces_done": world.allreduce(done, op=MPI.MIN),
            "members": world.size}


def _timed(world, run, calls: int, between) -> float:
    """Mean over ranks of the seconds `calls` kernel calls take, `between` after each."""
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        run()
        between()
    return world.allreduce(time.perf_counter() - start) / world.size
