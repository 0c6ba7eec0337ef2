"""What a rank's link really gives and costs, measured on the test cluster by the ranks
themselves (`ratrain cluster probe NAME`): payload bandwidth and one-way latency of MPI over
the shaped link, and the host CPU time the rank spends per byte it sends or receives while
it computes (NOTE [link host cost]). Run as `python -m ratrain.cluster.probe` under mpiexec
on two or more ranks of the cluster, one BLAS thread each (harness.probe sets them); rank 0
prints one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from ratrain.calibrate.probe import ping_pong
from ratrain.rt.comm import Communicators, ProgressAgent
from ratrain.sim.collectives import collective_cost

MESSAGE = 4 << 20                       # bytes of one all-reduce (a layer's gradient)


def one_way_latency(world) -> float:
    """Half the median round trip of the smallest ping-pong message between ranks 0 and 1
    (the ping-pong `ratrain calibrate` runs)."""
    return ping_pong(world)[0][1]


def allreduce_bandwidth(world, rounds: int = 3) -> float:
    """Bytes/s through a rank's port during a waited ring all-reduce: it sends (and
    receives) 2 (n-1)/n of the message (sim/collectives.py)."""
    data, n, best = np.ones(MESSAGE // 4, np.float32), world.size, float("inf")
    for _ in range(rounds):
        world.Barrier()
        start = time.perf_counter()
        world.Allreduce(MPI.IN_PLACE, data, op=MPI.SUM)
        best = min(best, time.perf_counter() - start)
    return collective_cost("allreduce", n, MESSAGE, 0.0, 1.0, "ring").nbytes / best


class Kernel:
    """A fixed amount of single-threaded GEMM work, run in slices."""

    def __init__(self, slices: int):
        self.a = np.random.default_rng(0).random((384, 384), np.float32)
        self.slices = slices

    def run(self, between=lambda: None) -> float:
        start = time.perf_counter()
        for _ in range(self.slices):
            self.a @ self.a
            between()
        return time.perf_counter() - start


def host_cost(comms, agent, bandwidth: float, rounds: int = 3) -> float:
    """Seconds of compute lost per byte sent or received: the kernel's time while
    all-reduces stream through the link (one always in flight, the agent moving them),
    less its time alone, over the bytes the rank moved meanwhile (median of rounds).
    Every rank starts the same number of all-reduces: enough to outlast the kernel."""
    world, kernel = comms.world, Kernel(slices=400)
    data = np.ones(MESSAGE // 4, np.float32)
    per_message = 2 * (world.size - 1) / world.size * MESSAGE  # sent, and as many received
    costs = []
    for _ in range(rounds):
        world.Barrier()
        alone = kernel.run()
        messages = world.allreduce(int(2 * alone * bandwidth / per_message) + 2, op=MPI.MAX)
        world.Barrier()
        started = [world.Iallreduce(MPI.IN_PLACE, data, op=MPI.SUM)]

        def keep_streaming():
            if len(started) < messages and started[-1].Test():
                started.append(world.Iallreduce(MPI.IN_PLACE, data, op=MPI.SUM))
        with agent.poking():
            busy = kernel.run(keep_streaming)
        moved = (len(started) - 1 + started[-1].Test()) * 2 * per_message
        for _ in range(messages - len(started)):
            started[-1].Wait()
            started.append(world.Iallreduce(MPI.IN_PLACE, data, op=MPI.SUM))
        started[-1].Wait()
        costs.append(max(0.0, busy - alone) / max(moved, per_message))
    return statistics.median(costs)


def main() -> int:
    comms = Communicators()
    if comms.size < 2:
        print("ratrain.cluster.probe needs at least 2 ranks", file=sys.stderr)
        return 2
    agent = ProgressAgent(comms, 1e-3)
    latency = one_way_latency(comms.world)
    bandwidth = allreduce_bandwidth(comms.world)
    cost = host_cost(comms, agent, bandwidth)
    costs = comms.world.gather(cost, root=0)
    agent.stop()
    if comms.rank == 0:
        print(json.dumps({"link_bandwidth": bandwidth, "link_latency": latency,
                          "link_host_cost": statistics.mean(costs)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
