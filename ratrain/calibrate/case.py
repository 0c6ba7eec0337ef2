"""One calibration case: a kernel or runtime call timed on one shape, with the work the
simulator charges for it (cases.py and rt_cases.py make them, profile.py times them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Case:
    op: str                             # IR op the simulator costs (matmul_bwd, rope, ...)
    shape: str                          # for progress lines and the profile's sources
    flops: int                          # what the simulator charges the node
    nbytes: int
    run: Callable[[int], object]        # run(threads): one call, as the generated code
    cold: bool = False                  # sweeps whole-model state: time it with cold
                                        # caches (NOTE [warm operands], profile.py)
    precision: str = "fp32"             # the operands' format: the profile's op_costs key
                                        # (NOTE [16-bit GEMM cases], cases.py)
