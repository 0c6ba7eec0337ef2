"""A rank started as `python -m ratrain.rt` sizes its thread pools to its share of the
node's cores before numpy loads (NOTE [threads per rank]), and the kernels run on that
many threads: checked on a faked 16- and 64-core node with 8 ranks on it."""
import os
import subprocess
import sys

import pytest

# the rank entry point with os.cpu_count faked; at exit it prints what the kernels and
# BLAS were given (the program directory does not exist, so the rank stops at set-up)
RANK = """
import atexit, os, runpy, sys
os.cpu_count = lambda: {cores}
def said():
    from ratrain.rt.threads import kernel_threads
    print(kernel_threads(), os.environ["OPENBLAS_NUM_THREADS"], os.environ["MKL_NUM_THREADS"])
atexit.register(said)
sys.argv = ["ratrain.rt", "no-such-program"]
runpy.run_module("ratrain.rt", run_name="__main__")
"""


def rank_threads(cores: int, **environ) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", RANK.format(cores=cores)],
                            env=env | {"MPI_LOCALNRANKS": "8"} | environ, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "no-such-program" in result.stderr, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("cores, threads", [(16, "2"), (64, "8")])
def test_a_rank_runs_on_its_share_of_the_cores(cores, threads):
    assert rank_threads(cores) == [threads] * 3


def test_an_exported_thread_count_is_kept():
    assert rank_threads(64, OMP_NUM_THREADS="3") == ["3", "8", "8"]
