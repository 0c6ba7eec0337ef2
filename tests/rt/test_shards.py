"""The ZeRO shard size is one rule (program_format/shards.py): the passes size a rank's
state by it and the runtime slices the same shards."""
import numpy as np

from ratrain.passes.layer_buffers import shard_elements
from ratrain.program_format.options import CompileOptions
from ratrain.program_format.shards import shard_bounds, shard_size
from ratrain.rt.calls import shard_bounds as runtime_shard_bounds


class _Program:
    def __init__(self, dp: int):
        self.options = CompileOptions(dp=dp)


def test_shards_round_up_and_cover_the_state():
    assert [shard_size(10, dp) for dp in (1, 2, 3, 4, 11)] == [10, 5, 4, 3, 1]
    for n, dp in ((10, 3), (7, 7), (5, 8)):
        bounds = [shard_bounds(n, dp, r) for r in range(dp)]
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        assert list(covered) == list(range(n))
        assert max(hi - lo for lo, hi in bounds) == shard_size(n, dp)


def test_the_plan_sizes_what_the_runtime_slices():
    assert runtime_shard_bounds is shard_bounds
    for n, dp in ((10, 3), (4096, 5)):
        assert shard_elements(n, _Program(dp), True) == shard_size(n, dp)
        assert shard_elements(n, _Program(dp), False) == n
