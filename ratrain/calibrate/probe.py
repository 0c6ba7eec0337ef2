"""`mpiexec -n R python -m ratrain.calibrate.probe OUT --threads T`: time every kernel case
(cases.py) on all R ranks at once, T threads each (warm, and again with the caches swept
under --evict), measure the ranks' cache share, then ping-pong between ranks 0 and 1
and, with --node, time DP collectives on every rank at once (node_probe.py).

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

    def also_cold(self, case) -> bool:
        """Whether `case` is timed a second time, swept (NOTE [cache residency],
        sim/residency.py): the kernels that `before` runs warm."""
        return self.enabled and not (case.cold or self.every_case)

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


def measure_kernels(world, threads: int, cases: list, evict: Evictor,
                    quiet: bool = False) -> list[dict]:
    """Median seconds of every case over PASSES passes through the list (a slow moment
    of the machine then spoils one pass of a case, not its median) after WARMUP_PASSES
    (NOTE [sustained speed]), mean over ranks; `seconds_cold` with the caches swept
    before each call, where the sweep is on (the same as `seconds` for swept cases).
    Rank 0 prints a line per op and pass unless `quiet`."""
    started = time.perf_counter()
    times = [[] for _ in cases]
    cold = [[] for _ in cases]
    for k in range(WARMUP_PASSES + PASSES):
        shown = set()
        for case, case_times, cold_times in zip(cases, times, cold):
            group = case.op.removesuffix("_bwd")
            if group not in shown and world.rank == 0 and not quiet:
                shown.add(group)
                what = "warm-up" if k < WARMUP_PASSES else f"pass {k + 1 - WARMUP_PASSES}/{PASSES}"
                print(f"  {time.perf_counter() - started:5.1f} s  {what} {group}", flush=True)
            measured = time_case(world, case, threads, evict.before(case))
            if k >= WARMUP_PASSES:
                case_times += measured
                if evict.also_cold(case):
                    cold_times += time_case(world, case, threads, evict)
    mean = lambda t: world.allreduce(statistics.median(t)) / world.size
    rows = []
    for case, case_times, cold_times in zip(cases, times, cold):
        rows.append({"op": case.op, "precision": case.precision, "shape": case.shape,
                     "flops": case.flops, "bytes": case.nbytes, "seconds": mean(case_times)})
        if evict.enabled:
            rows[-1]["seconds_cold"] = mean(cold_times) if cold_times else rows[-1]["seconds"]
    return rows


# NOTE [cache share]: the caches a rank may count on are not the sizes sysfs reports: on
# the first machine this ran on, the 32 MB last-level cache was shared with other guests,
# and a copy loop slowed from cache speed to DDR speed between 12 and 20 MB of working set
# alone, 12 and 16 MB per rank with two ranks copying at once. So the share is measured,
# all ranks at once: the largest working set (source and destination) whose copy rate is
# still CACHE_MARGIN times the rate at CACHE_SWEEP's largest set, which streams from DDR.
# The share answers "are the operands still in some cache, or back in DDR?", because a
# cold timing sweeps the last-level cache (probe.Evictor) and so reads them from DDR. The
# rule was the geometric mean of the fastest rate and the DDR rate until 2026-11-28: on a
# core with a 2 MiB L2 (a Sapphire Rapids VM: 64 GB/s in L2, 20 GB/s in the 105 MiB L3,
# 13 GB/s from DDR) that mean fell at the L2's edge, the share came out 2 MiB, and the
# simulator charged a call whose operands sat in L3 at its cold (DDR) time: the tiny
# model's F, B and BL on one rank x 2 threads 1.17-1.20x what the runs took, +4% with every
# call charged warm. With the margin the same curve gives 16 MiB, the L3's share.
CACHE_SWEEP = tuple(int(mb * (1 << 20)) for mb in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64))
CACHE_MARGIN = 1.25


def cache_share_of(rates: list[float]) -> int:
    """The share (NOTE [cache share]) of copy `rates` (B/s) at each of CACHE_SWEEP's
    working sets."""
    fast = [w for w, r in zip(CACHE_SWEEP, rates) if r >= CACHE_MARGIN * rates[-1]]
    return max(fast) if fast else CACHE_SWEEP[0]


def cache_share(world) -> int:
    """Bytes of working set this rank keeps in the caches (NOTE [cache share])."""
    rates = []
    for working_set in CACHE_SWEEP:
        source = np.ones(working_set // 8, np.float32)
        target = np.empty_like(source)
        np.copyto(target, source)
        times = []
        for _ in range(max(5, int(64 * (1 << 20) // working_set))):
            world.Barrier()
            start = time.perf_counter()
            np.copyto(target, source)
            times.append(time.perf_counter() - start)
        rates.append(world.allreduce(working_set / statistics.median(times)) / world.size)
    return cache_share_of(rates)


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
                   "cases that sweep whole-model state (AdamW, prefetch, adds), and of a "
                   "second, cold timing of the kernels; also measures the ranks' cache "
                   "share (0: neither)")
    p.add_argument("--node", action="store_true",
                   help="also time DP collectives on all ranks at once and a kernel beside "
                   "them (calibrate/node_probe.py)")
    p.add_argument("--evict-kernels", action="store_true",
                   help="also before each kernel call (default: kernels back to back)")
    p.add_argument("--quick", action="store_true", help="time only the quick "
                   "calibration's cases (cases.quick_cases), quietly, and no ping-pong")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    from ratrain.calibrate.cases import all_cases, quick_cases
    cases = quick_cases() if args.quick else \
        all_cases(set(args.ops.split(",")) if args.ops else None)
    result = {"ranks": world.size, "threads": args.threads,
              "kernels": measure_kernels(world, args.threads, cases,
                                         Evictor(args.evict, args.threads,
                                                 args.evict_kernels), quiet=args.quick)}
    if args.evict:
        result["cache_bytes"] = cache_share(world)
    if world.rank == 0 and world.size > 1 and not args.quick:
        print("  ping-pong between ranks 0 and 1", flush=True)
    result["ping_pong"] = [] if args.quick else ping_pong(world)
    if args.node and world.size > 1:
        from ratrain.calibrate.node_probe import beside_kernel, node_collectives
        if world.rank == 0:
            print("  collectives on every rank at once, and beside a kernel", flush=True)
        result["node"] = {"collectives": node_collectives(world),
                          "beside_kernel": beside_kernel(world, args.threads)}
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
