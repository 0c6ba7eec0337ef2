"""Predicted vs measured step time on this machine (issues 6, 24 and 40): the simulator on
the profile `ratrain calibrate` measured, against the runtime's step_seconds (--metrics),
for programs that cover what the planner chooses between: two model shapes (tiny,
tiny-gqa), pp 2 and dp 2 (2 ranks x 1 thread) and 1 rank x 2 threads, ZeRO 0 to 3, both
schedules, both pipeline schedules (1f1b, zb1), with and without recompute, fp32 and bf16.
Error = predicted / measured - 1 (target: mean absolute error at most 3%, none over 6%;
issue 40's, over each round's own errors: the median over rounds of the mean at most 4%,
of the largest at most 8%). Every line carries the CPU's SIMD flags.

Timings are only meaningful on idle cores: before each round's calibration and its first
pass over the configurations the bench waits (polling every 30 s, up to --wait seconds)
for the 1-minute load average to drop below --idle, and prints the load each figure was
measured at (the later passes follow at once: the load they see is the bench's own runs,
which the 1-minute average takes a minute or more to forget). The machine's speed drifts
by 10-30% over seconds to minutes (a shared VM), so each round calibrates right before it
runs the configurations, and runs each of them --repeats times, in passes over all of
them (NOTE [interleaved passes]): a configuration's measured step in a round is the
median of its runs' medians (each the median of the steps after
--warmup, at least --measure of them, and enough for --measure-seconds at the predicted
step time; NOTE [measured span]). Of a configuration's --rounds N measurements the fastest
is compared with the prediction of the calibration made in its own round (NOTE
[same-round pairs]); the fastest prediction against the fastest run and the median of the
rounds' own errors are printed beside it, and each round's own errors after them.
Usage: python bench/predict.py [--hw FILE (default: calibrate every round)] [--rounds 3]
[--repeats 5] [--seq-len 256] [--warmup 3] [--measure 5] [--measure-seconds 5]
[--only NAME,...] [--keep DIR] [--calibrate-from NAME,NAME]; about 17 minutes per round
on 2 idle cores. With --calibrate-from (a pipeline and a DP program, e.g. "tiny
pp2,tiny-gqa dp2 zero2 bf16"), those configurations are traced in every pass and the others
are also predicted on the profile calibrated from their traces (NOTE [traced rounds]),
printed after the microbenchmark profile's errors from the same runs. With --rescore DIR (a
--keep directory of an earlier run, and that run's --only and --calibrate-from), nothing
runs: its rounds are predicted again by this checkout's cost model and scored against the
runs it measured (NOTE [rescored runs])."""
import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_common import cpu_flags, load, run_ratrain, wait_for_idle

TARGET, TARGET_MEAN = 0.06, 0.03
ROUND_MEAN, ROUND_LARGEST = 0.04, 0.08  # issue 40: over each round's own errors
# name -> (model, ranks, compile flags): a global batch of 4 sequences each; fp32 and no
# recompute unless the flags say otherwise
PP2 = ("--pp", "2", "--micro-batches", "4", "--micro-batch-size", "1")
DP2 = ("--dp", "2", "--micro-batches", "2", "--micro-batch-size", "1")
CONFIGS = {
    "tiny 1 rank x 2 threads": ("tiny", 1, ("--micro-batches", "2", "--micro-batch-size", "2")),
    "tiny pp2": ("tiny", 2, PP2),
    "tiny pp2 baseline": ("tiny", 2, (*PP2, "--schedule", "baseline")),
    "tiny pp2 zb1": ("tiny", 2, (*PP2, "--pipeline-schedule", "zb1")),
    "tiny pp2 recompute full": ("tiny", 2, (*PP2, "--recompute", "full")),
    "tiny dp2 zero1": ("tiny", 2, (*DP2, "--zero", "1")),
    "tiny dp2 zero2": ("tiny", 2, (*DP2, "--zero", "2")),
    "tiny dp2 zero3": ("tiny", 2, (*DP2, "--zero", "3")),
    "tiny-gqa pp2 baseline": ("tiny-gqa", 2, (*PP2, "--schedule", "baseline")),
    "tiny-gqa pp2 bf16": ("tiny-gqa", 2, (*PP2, "--precision", "bf16")),
    "tiny-gqa dp2 zero2 bf16": ("tiny-gqa", 2, (*DP2, "--zero", "2", "--precision", "bf16")),
}
DEFAULTS = {"--precision": "fp32", "--recompute": "none"}


def fail(message):
    sys.exit(f"bench/predict: {message}")


def ratrain(*argv, capture=True):
    return run_ratrain("predict", argv, capture)


def predicted_seconds(program, hw):
    return json.loads(ratrain("simulate", program, "--hw", hw, "--json"))["step_time_s"]


# NOTE [measured span]: a run's median step is taken over at least --measure-seconds of
# steps, not a fixed count (until 2026-11-28, one run per round of at least 6 s or 9 steps;
# now --repeats runs of at least 5 s or 5 steps, NOTE [interleaved passes]). On this VM a
# task of 18 ms took 35-46 ms now and then, on either rank, while a pinned GEMM loop
# varied 3%, and the slow stretches last seconds: 9 steps of an 80 ms program span 0.7 s,
# and the 9-step medians within one 80-step run of tiny-gqa dp 2 ZeRO 2 bf16 ranged over
# 58.9-76.9 ms, where 80-step medians of three runs back to back gave 63.1, 61.1 and 69.6
# ms (2026-11-27). The predicted step only sizes the run; the median is of what ran.
# Probing the machine's speed around each run (a pinned GEMM, and 4 and 16 MiB streams, on
# every core at once) did not tell the slow runs apart: eight 60-step runs of that program
# measured 64-102 ms between probes that agreed within 10%, so the bench does not gate
# runs by such a probe.
def measured_steps(args, predicted):
    """How many steps to take the median of: --measure, or more to span --measure-seconds."""
    return max(args.measure, math.ceil(args.measure_seconds / predicted))


def measured_seconds(program, ranks, args, metrics, steps, trace=None):
    """Median step_seconds of `steps` steps after --warmup (the runtime's --metrics);
    `trace`: a directory to trace the run into (NOTE [traced rows])."""
    metrics.unlink(missing_ok=True)
    ratrain("run", program, "-n", ranks, "--steps", args.warmup + steps, "--metrics", metrics,
            *(("--trace", trace) if trace else ()))
    return median_step(args, metrics)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default=None, metavar="FILE", help="profile to predict with "
                    "(default: run `ratrain calibrate` at the start of every round)")
    ap.add_argument("--only", default=None, metavar="NAMES", help="comma-separated "
                    "configuration names to run (default: all)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out (default: 3)")
    ap.add_argument("--measure", type=int, default=5, help="fewest steps of a run whose "
                    "median is the run's step time (default: 5)")
    ap.add_argument("--measure-seconds", type=float, default=5.0, help="measure at least "
                    "this many seconds of steps per run, at the predicted step time "
                    "(default: 5)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each configuration "
                    "per round, in passes over them all; its measured step is the median "
                    "of its runs' (default: 5; NOTE [interleaved passes])")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of calibrating then "
                    "running every configuration; each configuration's fastest run is compared "
                    "with its own round's prediction (default: 3)")
    ap.add_argument("--idle", type=float, default=0.5, help="1-minute load to wait for")
    ap.add_argument("--wait", type=int, default=600, help="longest wait for it, seconds")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep programs, profiles "
                    "and metrics here (default: a temporary directory)")
    ap.add_argument("--calibrate-from", default=None, metavar="NAMES", help="comma-"
                    "separated configurations to trace each round and calibrate from "
                    "(`ratrain calibrate --from`); the others are predicted on that profile "
                    "too (NOTE [traced rounds])")
    ap.add_argument("--rescore", default=None, metavar="DIR", help="run nothing: predict "
                    "the rounds an earlier run kept in DIR (its --keep; give its --only and "
                    "--calibrate-from too) with this checkout and score them against what "
                    "it measured (NOTE [rescored runs])")
    args = ap.parse_args()
    args.traced = args.calibrate_from.split(",") if args.calibrate_from else []
    chosen = args.only.split(",") if args.only else list(CONFIGS)
    chosen += [n for n in args.traced if n not in chosen]
    if unknown := [n for n in chosen if n not in CONFIGS]:
        fail(f"--only: no configuration {unknown[0]!r}; choose from {', '.join(CONFIGS)}")
    with tempfile.TemporaryDirectory() as scratch:
        if args.rescore:
            programs, rounds = rescored(args, chosen, Path(args.rescore), Path(scratch))
        else:
            work = Path(args.keep or scratch)
            work.mkdir(parents=True, exist_ok=True)
            programs = {name: compile_config(args, work / f"config{i}", *CONFIGS[name][::2])
                        for i, name in enumerate(chosen)}
            rounds = [run_round(args, programs, work, r) for r in range(args.rounds)]
        report(args, programs, [micro for micro, _ in rounds], "the microbenchmark profile")
        if args.traced:
            report(args, {n: p for n, p in programs.items() if n not in args.traced},
                   [traced for _, traced in rounds], "the profile calibrated from the "
                   f"traces of {', '.join(args.traced)} (NOTE [traced rounds])")


def calibrate(args, out):
    at = wait_for_idle(args.idle, args.wait)
    started = time.perf_counter()
    lines = ratrain("calibrate", "-o", out).splitlines()
    print(f"# calibrated in {time.perf_counter() - started:.0f} s (load {at:.2f} before, "
          f"{load():.2f} after): " + "; ".join(l.strip() for l in lines[-3:]), flush=True)
    return out


def compile_config(args, out, model, flags):
    defaults = [f for flag, value in DEFAULTS.items() if flag not in flags for f in (flag, value)]
    ratrain("compile", model, "--seq-len", args.seq_len, *flags, *defaults, "-o", out,
            "--force", "--build")
    return out


def run_round(args, programs, work, r):
    """{name: (predicted, measured)} of one round: calibrate (unless --hw), then --repeats
    passes over the configurations (NOTE [interleaved passes]); with --calibrate-from,
    (traced prediction, measured) of the others too (NOTE [traced rounds])."""
    hw = args.hw or calibrate(args, work / f"cpu-round{r + 1}.json")
    predicted = {name: predicted_seconds(program, hw) for name, program in programs.items()}
    order = sorted(programs, key=lambda name: name not in args.traced)
    runs, traces = {name: [] for name in programs}, []
    for k in range(args.repeats):
        at = load() if k else wait_for_idle(args.idle, args.wait)
        print(f"# round {r + 1} pass {k + 1} (load {at:.2f} before)", flush=True)
        for name in order if k % 2 == 0 else order[::-1]:
            program, steps = programs[name], measured_steps(args, predicted[name])
            tag = f"{program.name}-{r + 1}-{k + 1}"
            trace = work / f"trace-{tag}" if name in args.traced else None
            runs[name].append(measured_seconds(program, CONFIGS[name][1], args,
                                               work / f"metrics-{tag}.jsonl", steps, trace))
            traces += [trace] if trace else []
            print(f"# round {r + 1} pass {k + 1} {name}: measured {runs[name][-1]:.4f} s, "
                  f"median of {steps} steps (load {load():.2f} after)"
                  + (f", traced into {trace}" if trace else ""), flush=True)
    return scored_round(args, programs, r, predicted, runs, traces, hw,
                        work / f"traced-round{r + 1}.json")


def scored_round(args, programs, r, predicted, runs, traces, hw, traced):
    """Round r's ({name: (predicted, measured)}, the same on the profile calibrated from
    `traces` over `hw` into `traced`, for the configurations not traced): `runs` {name:
    each run's median step}."""
    figures = {name: (predicted[name], statistics.median(runs[name])) for name in programs}
    for name, (p, m) in figures.items():
        print(f"# round {r + 1} {name}: predicted {p:.4f} s, measured {m:.4f} s (the median "
              f"of {', '.join(f'{t:.4f}' for t in runs[name])})", flush=True)
    if not traces:
        return figures, {}
    ratrain("calibrate", *(f for t in traces for f in ("--from", t)), "--hw", hw, "-o", traced)
    return figures, {name: (predicted_seconds(program, traced), figures[name][1])
                     for name, program in programs.items() if name not in args.traced}


# NOTE [rescored runs]: runs of one program minutes apart differ here by up to 14% and
# more (NOTE [interleaved passes]), so two versions of the cost model can only be compared
# on the same runs. A --keep directory holds each round's programs (config<i>, in the
# order the run chose them: --only's, then --calibrate-from's not among them), its
# microbenchmark profile (cpu-round<r>.json), every run's metrics (metrics-config<i>-
# <r>-<k>.jsonl) and the traced configurations' traces (trace-config<i>-<r>-<k>). With
# --rescore DIR this checkout predicts every round again: the kept programs (what ran) on
# the round's profile, and the others on a profile it calibrates again from the round's
# kept traces (`ratrain calibrate --from`, into a temporary directory); each run's median
# step is read back from its metrics as it was measured (after --warmup). The scores are
# then the same-round pairs of the live bench, for this checkout's cost model.
def rescored(args, chosen, kept, scratch):
    """({name: program}, the rounds) of the run kept in `kept`, predicted again (NOTE
    [rescored runs])."""
    programs = {name: kept / f"config{i}" for i, name in enumerate(chosen)}
    if missing := [p for p in programs.values() if not (p / "program.json").exists()]:
        fail(f"--rescore {kept}: no program {missing[0].name} there; give the --only and "
             f"--calibrate-from of the run that kept it")
    profiles = sorted(kept.glob("cpu-round*.json"), key=lambda p: int(p.stem[9:]))
    if args.hw:
        profiles = [Path(args.hw)] * len({m.name.split("-")[2] for m in
                                          kept.glob("metrics-config0-*.jsonl")})
    if not profiles:
        fail(f"--rescore {kept}: no cpu-round<r>.json there (or give the run's --hw)")
    rounds = []
    for r, hw in enumerate(profiles):
        runs, traces = {}, []
        for name, program in programs.items():
            tags = sorted(kept.glob(f"metrics-{program.name}-{r + 1}-*.jsonl"))
            if not tags:
                fail(f"--rescore {kept}: no metrics of {name} in round {r + 1}")
            runs[name] = [median_step(args, m) for m in tags]
            if name in args.traced:
                traces += [kept / f"trace-{m.stem[8:]}" for m in tags]
        predicted = {name: predicted_seconds(p, hw) for name, p in programs.items()}
        rounds.append(scored_round(args, programs, r, predicted, runs, traces, hw,
                                   scratch / f"traced-round{r + 1}.json"))
    return programs, rounds


def median_step(args, metrics):
    """The median step_seconds after --warmup of a run's metrics file."""
    times = [json.loads(l)["step_seconds"] for l in metrics.read_text().splitlines() if l]
    return statistics.median(times[args.warmup:])


# NOTE [traced rounds]: `--calibrate-from A,B` runs A and B traced in every pass of each
# round, and calibrates from all those traces over that round's microbenchmark profile (`ratrain
# calibrate --from`, NOTE [traced rows]); every other configuration is then predicted on
# both profiles and scored against the same measured run. A and B are never scored on
# the traced profile: a program is never scored against its own trace. Trace a pipeline
# and a DP program: only a run whose replicas all-reduce measures how much its kernels
# slow beside their collectives (NOTE [traced rows] 6); with none the traced profile keeps
# calibrate's probe, whose all-reduces stream back to back (1.46-2.23x on the AMD EPYC's 2
# vCPUs, where the dp 2 runs' backwards ran 1.08x). With tiny pp 2 and tiny-gqa pp 2 bf16
# traced, tiny dp 2 ZeRO 1-3 came out +0.6 to +6.6% in every round (bench/predict-runs/
# 2026-11-29-m); with tiny pp 2 and tiny-gqa dp 2 ZeRO 2 bf16 (-n), -1.3 to +3.9% in
# rounds 1 and 2 and +1.6 to +9.4% in round 3, against +1.6 to +5.5% and +5.9 to +13.5%
# on the same runs rescored from tiny pp 2's traces alone.


# NOTE [interleaved passes]: runs of one program minutes apart differ here by up to 40%
# (the bench of 2026-11-28 at 4594070: the slowest of three rounds' runs 22% above the
# fastest, median over configurations), and not only between runs: within one 14-step
# run every kind of task, AdamW's UPD too, ran 0.73x of what another run of the same
# shapes took minutes before, and tiny-gqa pp 2 ran 137 ms steps in one run against
# 195-205 ms in the runs before and after it. A single run per round measures the state
# the machine was in for its few seconds; so each round runs every configuration
# --repeats times, in passes over all of them (every other pass in reverse order, so
# that no configuration always runs early or late), and takes the median of its runs'
# medians. The traced configurations are traced in every pass, so the traced profile is
# calibrated from the round's mix of states, the one the other configurations run in.
# Three passes of at least 3 s of steps each until 2026-11-29; five of at least 5 s
# since: on the AMD EPYC's 2 vCPUs the same day, the slowest round of a configuration
# measured 7.5% and 6.1% above its fastest with three (median over the configurations,
# bench/predict-runs/2026-11-29-k and -l), 2.6% with five (-m), for 17 minutes a round
# where three took 13.


# NOTE [same-round pairs]: the headline error pairs each configuration's fastest run with
# the prediction of the calibration made in that run's round, minutes before it. Until
# 2026-11 it compared the fastest prediction over the rounds with the fastest run, which
# pairs a calibration and a run from different rounds: in the bench run of 2026-11-26 at
# 1238cc9 every fastest prediction came from round 1's calibration, whose forward GEMMs ran
# 7% faster than round 2's, while 8 of the 11 fastest runs were in rounds 2 and 3. Fresh
# calibrations made back to back here predicted one program up to 7% apart (tiny pp 2
# baseline: 0.210-0.225 s) while six runs between them measured 0.216-0.223 s. A round's
# calibration and its runs share the machine's state, as the acceptance asks ("calibrate
# and measure under the same conditions"); the old pairing and the median of the rounds'
# own errors are still printed.
def report(args, programs, rounds, profile):
    flags = cpu_flags()
    print(f"# predicted on {profile}: global batch 4 x {args.seq_len} tokens, median step "
          f"of at least {args.measure} and {args.measure_seconds:g} s of steps after "
          f"{args.warmup}; each "
          f"configuration's fastest run over {len(rounds)} round(s) "
          f"against its own round's prediction (NOTE [same-round pairs]), beside the "
          f"fastest prediction against the fastest run and the median of the rounds' own "
          f"errors; CPU flags: {flags}")
    paired, fastest, medians, spreads = [], [], [], []
    for name in programs:
        runs = [r[name][1] for r in rounds]
        spreads.append(max(runs) / min(runs) - 1)
        predicted, measured = min((r[name] for r in rounds), key=lambda pm: pm[1])
        paired.append(predicted / measured - 1)
        fastest.append(min(r[name][0] for r in rounds) / measured - 1)
        medians.append(statistics.median(r[name][0] / r[name][1] - 1 for r in rounds))
        mark = "ok" if abs(paired[-1]) <= TARGET else "MISS"
        print(f"{name:<26} predicted {predicted:.4f} s  measured {measured:.4f} s  error "
              f"{100 * paired[-1]:+5.1f}%  (within {100 * TARGET:.0f}%: {mark})  fastest "
              f"against fastest {100 * fastest[-1]:+5.1f}%  median of rounds "
              f"{100 * medians[-1]:+5.1f}%  rounds measured {1e3 * min(runs):.1f}-"
              f"{1e3 * max(runs):.1f} ms  [{flags}]", flush=True)
    for what, values in (("fastest run against its round's prediction", paired),
                         ("fastest against fastest", fastest), ("median of rounds", medians)):
        mean = statistics.mean(map(abs, values))
        print(f"# {what}: mean absolute error {100 * mean:.2f}% (target at most "
              f"{100 * TARGET_MEAN:.0f}%: {'ok' if mean <= TARGET_MEAN else 'MISS'}); "
              f"largest {100 * max(map(abs, values)):.2f}%")
    means, largest = [], []
    for r, figures in enumerate(rounds):
        errors = {name: figures[name][0] / figures[name][1] - 1 for name in programs}
        means.append(statistics.mean(map(abs, errors.values())))
        largest.append(max(map(abs, errors.values())))
        print(f"# round {r + 1}'s own errors: mean absolute {100 * means[-1]:.2f}%, largest "
              f"{100 * largest[-1]:.2f}%: " + ", ".join(f"{name} {100 * e:+.1f}%"
                                                        for name, e in errors.items()))
    mean, most = statistics.median(means), statistics.median(largest)
    print(f"# the median over rounds of each round's own errors: mean absolute "
          f"{100 * mean:.2f}% (target at most {100 * ROUND_MEAN:.0f}%: "
          f"{'ok' if mean <= ROUND_MEAN else 'MISS'}), largest {100 * most:.2f}% (target at "
          f"most {100 * ROUND_LARGEST:.0f}%: {'ok' if most <= ROUND_LARGEST else 'MISS'})")
    if len(rounds) > 1:
        print(f"# repeatability: the slowest round of a configuration measured "
              f"{100 * statistics.median(spreads):.1f}% above its fastest (median over the "
              f"configurations; largest {100 * max(spreads):.1f}%): runs of one program "
              f"minutes apart differ by that much with no change to the program")

if __name__ == "__main__":
    main()
