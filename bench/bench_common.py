"""What the timing benchmarks share: running the `ratrain` command the way a user does,
waiting for idle cores before a measurement (this is a shared VM; the load average each
figure was measured at is printed with it), and probing the GEMM rate the machine gives a
layout of ranks and threads right now (NOTE [machine state])."""
import json
import os
import subprocess
import sys
import time

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# the /proc/cpuinfo flags the kernels' paths depend on, printed beside every figure
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def run_ratrain(name, argv, capture=True):
    """`ratrain ARGV` with the runtime's own thread sizing (no inherited thread counts);
    its stdout. A failure ends the benchmark with one line naming `name` (bench/NAME)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    done = subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, argv)], env=env,
                          capture_output=capture, text=True)
    if done.returncode:
        lines = ((done.stderr or "") + (done.stdout or "")).strip().splitlines() or ["no output"]
        sys.exit(f"bench/{name}: `ratrain {' '.join(map(str, argv[:3]))} ...` exited "
                 f"{done.returncode}: {lines[-1]}")
    return done.stdout


def load():
    return os.getloadavg()[0]


def wait_for_idle(idle, longest, poll=30):
    """Poll the 1-minute load every `poll` s until it is below `idle` or `longest` s
    passed; the load reached."""
    waited = 0
    while load() >= idle and waited < longest:
        print(f"# load average {load():.2f} >= {idle}: waiting ({waited} s so far)", flush=True)
        time.sleep(poll)
        waited += poll
    return load()


def cpu_flags():
    """The SIMD flags of /proc/cpuinfo the kernels' paths depend on ('?' off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            have = next(ln for ln in f if ln.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return "?"
    return " ".join(flag for flag in CPU_FLAGS if flag in have) or "none"


# NOTE [machine state]: this VM's speed for one rank of 2 threads is bimodal. The fp32
# GEMM case M=512 N=688 K=256 of `ratrain calibrate`, called back to back for 1.5 s by one
# process of 2 threads, ran at 145-150 GFLOP/s for stretches of 10 s to minutes and at
# 172-176 between them (2026-11-27: of 16 probes back to back after a minute's idle, 12
# were slow; of the next 16, after another minute, none), while two processes of 1 thread
# each ran it at 93-97 throughout. A 2-thread kernel waits for the slower of its threads,
# so presumably the host placed the two vCPUs apart at times (the guest cannot see it).
# The tiny 1 rank x 2 threads program ran 0.233-0.238 s a step in the slow state and
# 0.191-0.197 s in the fast one, minutes apart, against 0.187-0.192 s predicted from
# calibrations whose case ran at 165-172. A calibration costs each case its least
# disturbed pass (NOTE [least disturbed pass], calibrate/probe.py), so it measures the
# fast state if either pass saw it. And a run is only compared with a calibration made in
# the same state: probe() times calibrate's own case in the run's layout, and the
# bench starts a run when that rate is within STATE_TOLERANCE of what the round's
# calibration measured for the case, as it waits for idle cores; the rates before and
# after each run are printed beside it.
PROBE_SHAPE = "M=512 N=688 K=256"
STATE_TOLERANCE = 0.05
_PROBE = """
import statistics, sys, time
from ratrain.calibrate.cases import all_cases
threads, seconds, start = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
case = next(c for c in all_cases(["matmul"]) if c.shape == sys.argv[4] and c.precision == "fp32")
case.run(threads)
time.sleep(max(0.0, start - time.time()))
times, end = [], time.perf_counter() + seconds
while time.perf_counter() < end:
    began = time.perf_counter()
    case.run(threads)
    times.append(time.perf_counter() - began)
print(case.flops / statistics.median(times) / 1e9)
"""


def probe(ranks: int, threads: int, seconds: float = 1.5) -> float:
    """GFLOP/s per process of calibrate's fp32 matmul case PROBE_SHAPE called back to back
    for `seconds` by `ranks` processes of `threads` threads each, all at once (median call,
    mean over the processes): NOTE [machine state]."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env["OMP_NUM_THREADS"] = str(threads)
    start = time.time() + 1.0                   # after every process has imported
    children = [subprocess.Popen([sys.executable, "-c", _PROBE, str(threads), str(seconds),
                                  str(start), PROBE_SHAPE], env=env, stdout=subprocess.PIPE,
                                 text=True) for _ in range(ranks)]
    rates = [float(child.communicate()[0]) for child in children]
    return sum(rates) / len(rates)


def calibrated_rate(profile_path, threads: int) -> float | None:
    """GFLOP/s the calibration in `profile_path` measured for the case probe() times, at
    `threads` threads per rank; None if it has no such case (a profile older than NOTE
    [cases by shape], or none at that thread count)."""
    profile = json.loads(open(profile_path).read())
    costs = profile.get("threads", {}).get(str(threads), {}).get("op_costs", {})
    rows = costs.get("fp32", {}).get("matmul", {}).get("measured", ())
    row = next((r for r in rows if r[3:] == [PROBE_SHAPE]), None)
    return row and row[0] / row[2] / 1e9


def wait_for_state(reference: float, ranks: int, threads: int, longest: int, poll: int = 5):
    """Probe until the rate is within STATE_TOLERANCE of `reference` or `longest` s passed
    (NOTE [machine state]); the last rate probed."""
    started = time.perf_counter()
    while abs((rate := probe(ranks, threads)) / reference - 1) > STATE_TOLERANCE and \
            time.perf_counter() - started < longest:
        print(f"# GEMM {rate:.1f} GFLOP/s per rank ({ranks} x {threads} threads), calibrated "
              f"{reference:.1f}: waiting ({time.perf_counter() - started:.0f} s so far)",
              flush=True)
        time.sleep(poll)
    return rate
