"""`mpiexec -n R python -m ratrain.calibrate.probe OUT --threads T`: time every kernel case
(cases.py) on all R ranks at once, T threads each, then ping-pong between ranks 0 and 1.

All ranks run the same case at the same time (a barrier before each, the same number of
repetitions), so the rates are those of ranks sharing the node's caches and DDR as the
runtime's ranks do. Rank 0 writes the medians and ping-pong times as JSON to OUT and
prints a progress line per op. A calibration tool, not the runtime: it talks to
MPI directly (rt/comm.py stays the runtime's only MPI module).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

TARGET_SECONDS = 0.02                   # timed per case (after one warm-up call)
REPS = (3, 25)                          # fewest and most timed calls per case
PING_BYTES = (8, 1 << 16, 1 << 20)     # the fit takes the first and the last
PING_REPS = 30


def time_case(world, case, threads: int) -> float:
    """Median seconds of one call, every rank running it at the same time."""
    world.Barrier()
    start = time.perf_counter()
    case.run(threads)
    first = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
    reps = int(min(max(TARGET_SECONDS / max(first, 1e-9), REPS[0]), REPS[1]))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        case.run(threads)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_kernels(world, threads: int, ops: set | None) -> list[dict]:
    from ratrain.calibrate.cases import all_cases
    rows, shown, started = [], set(), time.perf_counter()
    for case in all_cases(ops):
        group = case.op.removesuffix("_bwd")
        if group not in shown and world.rank == 0:
            shown.add(group)
            print(f"  {time.perf_counter() - started:5.1f} s  {group}", flush=True)
        seconds = world.allreduce(time_case(world, case, threads)) / world.size
        rows.append({"op": case.op, "shape": case.shape, "flops": case.flops,
                     "bytes": case.nbytes, "seconds": seconds})
    return rows


def ping_pong(world) -> list[list[float]]:
    """[message bytes, one-way seconds (half the median round trip)] between ranks 0 and 1."""
    if world.size < 2:
        return []
    rows = []
    for nbytes in PING_BYTES:
        message = np.zeros(nbytes, np.uint8)
        trips = []
        for _ in range(PING_REPS + 1):
            world.Barrier()
            start = time.perf_counter()
            if world.rank == 0:
                world.Send(message, dest=1)
                world.Recv(message, source=1)
            elif world.rank == 1:
                world.Recv(message, source=0)
                world.Send(message, dest=0)
            trips.append(time.perf_counter() - start)
        rows.append([nbytes, statistics.median(trips[1:]) / 2])
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ratrain.calibrate.probe")
    p.add_argument("out", help="JSON file rank 0 writes")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ops", default=None, help="comma-separated ops to time (default: all)")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    ops = set(args.ops.split(",")) if args.ops else None
    result = {"ranks": world.size, "threads": args.threads,
              "kernels": measure_kernels(world, args.threads, ops)}
    if world.rank == 0 and world.size > 1:
        print("  ping-pong between ranks 0 and 1", flush=True)
    result["ping_pong"] = ping_pong(world)
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
