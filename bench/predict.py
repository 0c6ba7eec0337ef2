"""Predicted vs measured step time on this machine (issue 6): the simulator on the profile
`ratrain calibrate` measured, against the runtime's step_seconds (--metrics), for three
layouts of the tiny model: 1 rank x 2 threads, PP=2 and DP=2 (2 ranks x 1 thread each).
Measured = median of --measure steps after --warmup steps; error = predicted / measured - 1
(target: within 3% for every configuration).

Timings are only meaningful on idle cores: before calibrating and before each run the
bench waits (polling every 30 s, up to --wait seconds) for the 1-minute load average to
drop below --idle, and prints the load each figure was measured at.
The machine's speed drifts by 10-20% over minutes (a shared VM), so each round calibrates
right before it runs the configurations, and --rounds N compares the fastest prediction with
the fastest measurement over the N rounds: other work only ever slows a calibration or a
run, so the fastest of each is the least disturbed (bench/cluster.py does the same).
Usage: python bench/predict.py [--hw FILE (default: calibrate every round)] [--rounds 1]
[--seq-len 256] [--warmup 3] [--measure 5] [--keep DIR]."""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_common import load, run_ratrain, wait_for_idle

TARGET = 0.03
# name -> (ranks, compile flags): the same model and global batch of 4 sequences
CONFIGS = {
    "1 rank x 2 threads": (1, ["--micro-batches", "2", "--micro-batch-size", "2"]),
    "PP=2 (2 ranks x 1 thread)": (2, ["--pp", "2", "--micro-batches", "4",
                                       "--micro-batch-size", "1"]),
    "DP=2 (2 ranks x 1 thread)": (2, ["--dp", "2", "--micro-batches", "2",
                                       "--micro-batch-size", "1"]),
}


def fail(message):
    sys.exit(f"bench/predict: {message}")


def ratrain(*argv, capture=True):
    return run_ratrain("predict", argv, capture)


def predicted_seconds(program, hw):
    return json.loads(ratrain("simulate", program, "--hw", hw, "--json"))["step_time_s"]


def measured_seconds(program, ranks, args, metrics):
    """Median step_seconds of --measure steps after --warmup (the runtime's --metrics)."""
    metrics.unlink(missing_ok=True)
    ratrain("run", program, "-n", ranks, "--steps", args.warmup + args.measure,
            "--metrics", metrics)
    steps = [json.loads(l)["step_seconds"] for l in metrics.read_text().splitlines() if l]
    return statistics.median(steps[args.warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default=None, metavar="FILE", help="profile to predict with "
                    "(default: run `ratrain calibrate` at the start of every round)")
    ap.add_argument("--model", default="tiny", help="model preset (default: tiny)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out (default: 3)")
    ap.add_argument("--measure", type=int, default=5, help="steps whose median is the "
                    "measured step time (default: 5)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of calibrating then "
                    "running every configuration; the fastest over rounds are compared "
                    "(default: 1)")
    ap.add_argument("--idle", type=float, default=0.5, help="1-minute load to wait for")
    ap.add_argument("--wait", type=int, default=600, help="longest wait for it, seconds")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep programs, profiles "
                    "and metrics here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.keep or scratch)
        work.mkdir(parents=True, exist_ok=True)
        programs = {name: compile_config(args, work / f"config{i}", flags)
                    for i, (name, (_, flags)) in enumerate(CONFIGS.items())}
        rounds = [run_round(args, programs, work, r) for r in range(args.rounds)]
        report(args, programs, rounds)


def calibrate(args, out):
    at = wait_for_idle(args.idle, args.wait)
    started = time.perf_counter()
    lines = ratrain("calibrate", "-o", out).splitlines()
    print(f"# calibrated in {time.perf_counter() - started:.0f} s (load {at:.2f} before, "
          f"{load():.2f} after): " + "; ".join(l.strip() for l in lines[-3:]), flush=True)
    return out


def compile_config(args, out, flags):
    ratrain("compile", args.model, "--seq-len", args.seq_len, *flags, "--precision", "fp32",
            "--recompute", "none", "-o", out, "--force", "--build")
    return out


def run_round(args, programs, work, r):
    """{name: (predicted, measured)} of one round: calibrate (unless --hw), then run."""
    hw = args.hw or calibrate(args, work / f"cpu-round{r + 1}.json")
    figures = {}
    for name, program in programs.items():
        at = wait_for_idle(args.idle, args.wait)
        measured = measured_seconds(program, CONFIGS[name][0], args,
                                    work / f"metrics-{program.name}-{r + 1}.jsonl")
        figures[name] = (predicted_seconds(program, hw), measured)
        print(f"# round {r + 1} {name}: predicted {figures[name][0]:.4f} s, measured "
              f"{measured:.4f} s (load {at:.2f} before, {load():.2f} after)", flush=True)
    return figures


def report(args, programs, rounds):
    print(f"# {args.model}, global batch 4 x {args.seq_len} tokens, fp32; the fastest "
          f"prediction and measurement over {len(rounds)} round(s)")
    errors = []
    for name in programs:
        predicted = min(r[name][0] for r in rounds)
        measured = min(r[name][1] for r in rounds)
        errors.append(predicted / measured - 1)
        mark = "ok" if abs(errors[-1]) <= TARGET else "MISS"
        print(f"{name:<28} predicted {predicted:.4f} s  measured {measured:.4f} s  error "
              f"{100 * errors[-1]:+5.1f}%  (target within {100 * TARGET:.0f}%: {mark})",
              flush=True)
    print(f"# mean absolute error {100 * statistics.mean(map(abs, errors)):.2f}%")


if __name__ == "__main__":
    main()
