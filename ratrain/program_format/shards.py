"""ZeRO shards: how a flat per-layer state of n elements (or bytes) is split over a
stage's dp replicas. The one statement of the shard size: the passes size buffers by it
(layer_buffers.py, partition_stages.py) and the runtime slices by it (rt/calls.py), so
what the plan holds and what a rank updates agree.
"""
from __future__ import annotations


def shard_size(n: int, dp: int) -> int:
    """One replica's shard of n: ceil(n / dp) (the last replica's may hold fewer of the
    n; every shard is allocated this size)."""
    return -(-n // dp)


def shard_bounds(n: int, dp: int, replica: int) -> tuple[int, int]:
    """[lo, hi) of replica's ZeRO shard of n elements: shard_size each, the last shorter."""
    size = shard_size(n, dp)
    return min(n, replica * size), min(n, (replica + 1) * size)
