"""`mpiexec -n <ranks> python -m ratrain.rt DIR [options]`: run a compiled program."""
import os
import sys

from ratrain.rt.stop import listen

listen()  # first: a stop signal during the imports below is kept for the first step


def share_cores() -> None:
    """One BLAS/OpenMP thread pool per rank sized to its share of the node's cores, set
    before numpy loads: ranks that each start one thread per core oversubscribe the node
    (measured: 25x slower steps with 2 ranks x 2 threads on 2 cores)."""
    local_ranks = int(os.environ.get("MPI_LOCALNRANKS", "1"))  # set by hydra (mpich)
    threads = str(max(1, (os.cpu_count() or 1) // max(1, local_ranks)))
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, threads)


share_cores()
from ratrain.rt.run import main  # noqa: E402  (after the thread settings)

sys.exit(main())
