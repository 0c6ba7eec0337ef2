"""What the timing benchmarks share: running the `ratrain` command the way a user does,
and waiting for idle cores before a measurement (this is a shared VM; the load average
each figure was measured at is printed with it)."""
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
