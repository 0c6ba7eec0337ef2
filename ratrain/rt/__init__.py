"""ratrain.rt: the MPI runtime that runs a compiled program directory (DESIGN section 8).

`python -m ratrain.rt DIR` under mpiexec; calls.py holds the call semantics shared with the
reference executor, comm.py is the only module that imports mpi4py.
"""
