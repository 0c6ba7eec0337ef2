"""NOTE [progress while kernels run] (rt/comm.py): while the rank is busy outside MPI, the
progress agent alone carries a pending non-blocking all-reduce to completion, which no MPI
call between kernels would do; and the equivalence tests run with the agent on."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mpi

# Each rank starts an 8 MiB all-reduce, then stays out of MPI for 0.6 s (time.sleep, as a
# kernel releases the GIL) with or without the agent probing, then asks once (Test) whether
# the all-reduce is done; rank 0 prints "<poking> <done>" per case.
BUSY_RANK = """
import sys, time
import numpy as np
from mpi4py import MPI
from ratrain.rt.comm import Communicators, ProgressAgent
comms = Communicators()
agent = ProgressAgent(comms, 1e-3)
for poking in (False, True):
    data = np.ones(2 << 20, np.float32)
    comms.barrier()
    request = comms.world.Iallreduce(MPI.IN_PLACE, data, op=MPI.SUM)
    if poking:
        with agent.poking():
            time.sleep(0.6)
    else:
        time.sleep(0.6)
    done = request.Test()
    request.Wait()
    assert data[0] == comms.size
    if comms.rank == 0:
        print(poking, done, flush=True)
agent.stop()
"""


def test_agent_completes_an_allreduce_while_the_rank_is_out_of_mpi():
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", BUSY_RANK],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    outcome = dict(line.split() for line in run.stdout.splitlines())
    assert outcome == {"False": "False", "True": "True"}, run.stdout
