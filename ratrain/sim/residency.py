"""Cache residency of a rank's kernel operands, for profiles measured warm and cold.

A `ratrain calibrate` profile times every kernel twice: back to back (operands warm in the
caches) and after a sweep of the last-level cache (operands from DDR). Which of the two a
call of a step pays depends on how much else the rank touched since it last touched the
call's operands (NOTE [cache residency]); `cold_fractions` replays a stage's calls in
the runtime's order over the arena's addresses and answers, per call, the fraction of its
operand bytes that have left the rank's share of the caches.
"""
from __future__ import annotations

import numpy as np

from ratrain.program_format.lowered import Slot

BLOCK = 4096                            # bytes per tracked block of the arena, at least
MAX_BLOCKS = 1 << 16                    # blocks per arena, at most (larger blocks beyond)

# NOTE [cache residency]: on the CPU a kernel whose operands sit in the caches runs 10-20%
# faster than one that streams them from DDR. Timing every kernel warm predicted steps of
# the tiny model (4 layers) on 2 ranks within 3%, but steps of the same layers 8 deep
# 5-10% short, and timing them all cold predicted the 4-layer steps 15-18% long. So the
# profile carries both (`op_costs`, `op_costs_cold`) and the simulator decides per call:
# a block of the arena is still cached when the distinct bytes the rank touched since its
# last touch (its LRU stack distance, counted in blocks of at least 4 KiB) are less than
# the rank's measured share of the caches (`cache_bytes`, NOTE [cache share] in
# calibrate/probe.py). A call costs warm + f x (cold - warm), f the fraction of its input
# and output bytes not cached. The stage's calls are walked twice in task order and the
# second walk counts: a step starts with what the previous one left in the caches.


class _Caches:
    """Last-touch times of the arena's blocks; stack distances by counting newer blocks."""

    def __init__(self, arena_bytes: int, capacity: int):
        self.block = BLOCK
        while arena_bytes // self.block > MAX_BLOCKS:
            self.block *= 2
        self.last = np.full(arena_bytes // self.block + 2, -1, np.int64)
        self.capacity_blocks = max(1, capacity // self.block)
        self.clock = 0

    def blocks(self, offsets: dict, slot: Slot) -> tuple[int, int] | None:
        """[first, last + 1) blocks of a slot, None if its buffer has no offset."""
        placed = offsets.get(slot.buffer)
        if placed is None:
            return None
        start = placed[0] + slot.offset
        return start // self.block, -(-(start + max(slot.nbytes, 1)) // self.block)

    def cold_blocks(self, lo: int, hi: int) -> int:
        """Blocks of [lo, hi) touched never, or longer ago than the caches hold."""
        times = self.last[lo:hi]
        cold = int(np.count_nonzero(times < 0))
        for t in np.unique(times[times >= 0]):
            newer = np.count_nonzero(self.last > t)
            if newer >= self.capacity_blocks:
                cold += int(np.count_nonzero(times == t))
        return cold

    def touch(self, lo: int, hi: int) -> None:
        self.clock += 1
        self.last[lo:hi] = self.clock


def cold_fractions(tasks, calls_of: dict, offsets: dict, capacity: int) -> dict:
    """(task, index of the call in it) -> fraction of the call's operand bytes not
    cached (NOTE [cache residency]), over a stage's `tasks` in order; `calls_of`: task
    -> its lowered calls; `offsets`: the stage's buffer -> (arena offset, bytes)."""
    arena = max((o + n for o, n in offsets.values()), default=0)
    caches, out = _Caches(arena, capacity), {}
    for walk in range(2):
        for task in tasks:
            for i, call in enumerate(calls_of.get(task, ())):
                ranges = [r for s in (*call.inputs, *call.outputs) if isinstance(s, Slot)
                          for r in [caches.blocks(offsets, s)] if r is not None]
                total = sum(hi - lo for lo, hi in ranges)
                if walk == 1 and total:
                    out[task, i] = sum(caches.cold_blocks(lo, hi) for lo, hi in ranges) / total
                for lo, hi in ranges:
                    caches.touch(lo, hi)
    return out
