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

TARGET_SECONDS = 0.03                   # per case and pass, evictions included
REPS = (3, 10)                          # fewest and most timed calls per case and pass
PASSES = 2
# NOTE [sustained speed]: this VM's cores run 10-20% faster for the first seconds after
# idling than under sustained load, which is what a training step sees: a first pass
# through the cases brings them to their sustained speed and is not counted.
WARMUP_PASSES = 1
PING_BYTES = (8, 1 << 16, 1 << 20)     # the fit takes the first and the last
PING_REPS = 30


class Evictor:
    """Streams `nbytes` through this rank's caches with `threads` threads (a native
    memory-bound kernel, so every core's private caches are swept) before each timed call
    of a cold case (of every case with `every_case`): operands then come from DDR, as for
    the calls that walk the whole model's state in a training step (NOTE [warm operands],
    calibrate/profile.py)."""

    def __init__(self, nbytes: int, threads: int, every_case: bool = False):
        from ratrain import kernels
        rows = max(1, nbytes // (2 * 4 * 1024))
        self.kernels, self.threads = kernels, threads
        self.x, self.w = np.ones((rows, 1024), np.float32), np.ones(1024, np.float32)
        self.enabled, self.every_case = nbytes > 0, every_case

    def before(self, case):
        """The sweep to run before each timed call of `case`: only cold cases' unless
        every_case (NOTE [warm operands], calibrate/profile.py)."""
        return self if case.cold or self.every_case else lambda: None

    def __call__(self) -> None:
        if self.enabled:
            self.kernels.rmsnorm_fwd(self.x, self.w, threads=self.threads)


def time_case(world, case, threads: int, evict) -> list[float]:
    """Seconds of repeated calls, every rank running them at the same time."""
    world.Barrier()
    start = time.perf_counter()
    evict()
    case.run(threads)
    first = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
    times = []
    for _ in range(int(min(max(TARGET_SECONDS / max(first, 1e-9), REPS[0]), REPS[1]))):
        evict()
        start = time.perf_counter()
        case.run(threads)
        times.append(time.perf_counter() - start)
    return times


def measure_kernels(world, threads: int, ops: set | None, evict: Evictor) -> list[dict]:
    """Median seconds of every case over PASSES passes through the list (a slow moment
    of the machine then spoils one pass of a case, not its median) after WARMUP_PASSES
    (NOTE [sustained speed]), mean over ranks."""
    from ratrain.calibrate.cases import all_cases
    cases, started = all_cases(ops), time.perf_counter()
    times = [[] for _ in cases]
    for k in range(WARMUP_PASSES + PASSES):
        shown = set()
        for case, case_times in zip(cases, times):
            group = case.op.removesuffix("_bwd")
            if group not in shown and world.rank == 0:
                shown.add(group)
                what = "warm-up" if k < WARMUP_PASSES else f"pass {k + 1 - WARMUP_PASSES}/{PASSES}"
                print(f"  {time.perf_counter() - started:5.1f} s  {what} {group}", flush=True)
            measured = time_case(world, case, threads, evict.before(case))
            if k >= WARMUP_PASSES:
                case_times += measured
    return [{"op": c.op, "shape": c.shape, "flops": c.flops, "bytes": c.nbytes,
             "seconds": world.allreduce(statistics.median(t)) / world.size}
            for c, t in zip(cases, times)]


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
    p.add_argument("--evict", type=int, default=0, metavar="BYTES",
                   help="bytes streamed through the caches before each timed call of the "
                   "cases that sweep whole-model state (AdamW, prefetch, adds)")
    p.add_argument("--evict-kernels", action="store_true",
                   help="also before each kernel call (default: kernels back to back)")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    ops = set(args.ops.split(",")) if args.ops else None
    result = {"ranks": world.size, "threads": args.threads,
              "kernels": measure_kernels(world, args.threads, ops,
                                         Evictor(args.evict, args.threads,
                                                 args.evict_kernels))}
    if world.rank == 0 and world.size > 1:
        print("  ping-pong between ranks 0 and 1", flush=True)
    result["ping_pong"] = ping_pong(world)
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
