"""How many threads a rank's kernels and BLAS run on: its share of the node's cores. One
rule for the runtime (rt/__main__.py sets the thread pools from it), the simulator
(sim/kernels.rank_profile picks the profile's entry for it) and `ratrain train`'s layout
line. Imports only os, so a rank applies it before numpy loads.
"""
from __future__ import annotations

import os

# the variables a rank's thread pools read: the kernels' (rt/executor.py) and BLAS's
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# NOTE [threads per rank]: the ranks on a node split its cores evenly, cores // ranks
# threads each (at least 1): a layout that cannot use more replicas (the global batch does
# not split further) gives each rank more threads instead of leaving cores idle, and
# ranks never oversubscribe the node (measured: 25x slower steps with 2 ranks x 2 threads
# on 2 cores). `cores % ranks` cores stay idle. A thread count the user exports
# (OMP_NUM_THREADS) is kept.


def threads_per_rank(cores: int, ranks: int) -> int:
    """Threads of each of `ranks` ranks sharing `cores` cores (NOTE [threads per rank])."""
    return max(1, cores // max(1, ranks))


def thread_environment(environ: dict, cores: int) -> dict[str, str]:
    """The THREAD_VARIABLES a rank sets: its share of `cores` among the node's ranks
    (MPI_LOCALNRANKS, which mpich's hydra sets), except those `environ` already holds."""
    threads = str(threads_per_rank(cores, int(environ.get("MPI_LOCALNRANKS", "1"))))
    return {v: environ.get(v, threads) for v in THREAD_VARIABLES}


def kernel_threads() -> int:
    """Threads this rank's native kernels run on: the OMP_NUM_THREADS its start set from
    thread_environment (at least 1)."""
    return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
