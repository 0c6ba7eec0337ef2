"""`ratrain calibrate`: measure this machine and write the `cpu` hardware profile.

Runs the probe (probe.py) under the mpich wheel's mpiexec once per thread count the
runtime uses (NOTE [threads per rank]): all node cores in one rank, and one thread in each
of `node_cores` ranks (ranks run together, sharing caches and DDR, and ping-pong between
ranks 0 and 1). Each op's times are fitted (fit.py) into the profile's `op_costs` under
`threads`, which the simulator picks by the job's ranks (sim/kernels.rank_profile).
"""
from ratrain.calibrate.profile import build_profile, calibrate

__all__ = ["build_profile", "calibrate"]
