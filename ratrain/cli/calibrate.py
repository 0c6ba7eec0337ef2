"""`ratrain calibrate [-o FILE]`: measure this machine into a hardware profile (DESIGN 7).

Times the native kernels, DDR bandwidth and MPI messages at the thread counts the runtime
uses (ratrain/calibrate) and writes a profile that `ratrain compile --hw FILE` and
`ratrain simulate --hw FILE` read; by default this machine's cached profile, which every
command uses where no --hw is given (NOTE [this machine's profile]), never the shipped
cpu.json.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

from ratrain.cli.options import add_options
from ratrain.errors import UserError
from ratrain.hw.identity import cached_profile_path, this_cpu
from ratrain.hw.profiles import Profile

def cmd_calibrate(args) -> None:
    from ratrain.calibrate import calibrate
    from ratrain.calibrate.profile import BUSY_LOAD, write_profile
    from ratrain.hw import load_profile
    if args.traces and not args.output:
        raise UserError("--from writes a profile of the traced runs: give -o FILE (this "
                        "machine's cached profile is what `ratrain calibrate` measures)")
    out = Path(args.output) if args.output else cached_profile_path(this_cpu())
    if out.suffix != ".json":
        raise UserError(f"-o {out}: a profile is a .json file")
    if args.traces:
        _calibrate_from(args, out)
        return
    if args.program or args.hw:
        raise UserError("--program and --hw go with --from TRACE (calibrating from a traced "
                        "run); leave them out to measure this machine")
    load = os.getloadavg()[0]
    print(f"calibrating this machine (1-minute load average {load:.2f}"
          + (": other processes make the times slower and noisier)" if load > BUSY_LOAD
             else ")"), flush=True)
    started = time.perf_counter()
    try:
        profile = calibrate(lambda line: print(line, flush=True), evict=args.evict)
    except (RuntimeError, ValueError) as e:
        raise UserError(str(e)) from None
    write_profile(profile, out)
    print(summary(load_profile(out), out, time.perf_counter() - started))


def _calibrate_from(args, out: Path) -> None:
    """See NOTE [traced rows]: the base profile (--hw, else the one the first traced program
    was compiled for) with what the traced runs measured."""
    from ratrain.calibrate.from_trace import traced_profile, traced_runs
    from ratrain.calibrate.profile import write_profile
    from ratrain.inputs import load_hw
    from ratrain.programs import is_program_dir, read_manifest
    runs = traced_runs(args.traces, args.program)
    if args.hw:
        base = load_hw(args.hw)
    elif is_program_dir(runs[0].program):
        base = read_manifest(runs[0].program)["hw"]
    else:
        raise UserError(f"{runs[0].program} is not a program directory; pass --program DIR")
    profile = Profile.from_dict(traced_profile(base, runs, args.skip_steps,
                                               lambda line: print(line, flush=True)))
    write_profile(profile.to_dict(), out)
    print(f"wrote {out}: {Profile.of(base).name}'s profile with what "
          f"{len(runs)} traced run{'s' * (len(runs) != 1)} measured")
    entries = [(None, profile.traced)] if profile.traced else []
    entries += [(threads, entry["traced"]) for threads, entry in profile.threads.items()
                if "traced" in entry]
    for threads, traced in entries:
        print("  " + traced_summary(traced, threads))
        if traced.get("op_speed"):
            print("    " + op_speeds(traced["op_speed"]))


def traced_summary(traced: dict, threads: str | None) -> str:
    """One line of what a profile entry's traced rows hold (NOTE [traced rows]): rows,
    the per-call overhead, each data-moving op's host time, the ranks' speed spread, the
    replicas' arrival drift and the slowdown of kernels beside collectives."""
    from ratrain.sim.costs import traced_rank_spread
    kernels = sum(key.split()[2].isdigit() for key in traced["calls"])
    overhead, host = traced.get("call_overhead"), traced.get("call_host")
    spread = traced_rank_spread(traced)  # NOTE [rank spread]
    drift = traced.get("arrival_drift")
    beside = traced.get("kernel_slowdown_beside")  # NOTE [traced rows] 6
    parts = [f"{kernels} kernel shapes", f"{len(traced['calls']) - kernels} runtime calls"]
    if overhead:
        parts.append(f"{overhead[0] * 1e6:.1f} us per call outside them")
    if host:
        parts.append("host time of calls that move data: " + ", ".join(
            f"{op} {seconds * 1e6:.0f} us" for op, (seconds, _) in host.items()))
    if spread:
        parts.append(f"ranks' speed spread {spread[0]:.1%} ({spread[1]} steps)")
    parts.append(f"replicas' arrival drift {drift[0]:.1%} ({drift[1]} steps' first UPDs)"
                 if drift else "no arrival drift (one replica, or no UPD all replicas "
                 "waited at)")
    parts.append(f"kernels beside collectives {beside[0]:.2f}x ({beside[1]} samples)"
                 if beside else "no slowdown of kernels beside collectives (no traced rank "
                 "of DP replicas ran backwards both beside a posted collective and alone): "
                 "the given profile's stands; trace a DP program to measure it")
    per_rank = f"{threads} thread{'s' * (threads != '1')} per rank: " if threads else ""
    return per_rank + ", ".join(parts)


def op_speeds(speeds: dict, most: int = 8) -> str:
    """The traced speeds of the kernel ops, farthest from the given profile's charge first
    (NOTE [traced rows] 5): where a run and the microbenchmark disagree, op by op. Runtime
    calls (CallOp) are left out: the microbenchmark charges the data and loss calls next to
    nothing, so their ratios run to thousands and say nothing about a kernel."""
    from ratrain.program_format.call_ops import CallOp
    runtime = {op.value for op in CallOp}
    kernels = sorted(((op, speed) for op, (speed, _) in speeds.items()
                      if op.split()[-1] not in runtime and speed > 0),
                     key=lambda item: -abs(math.log(item[1])))
    more = len(kernels) - most
    return ("kernel ops, the run's time over the given profile's charge (median per call): "
            + ", ".join(f"{op} {speed:.2f}x" for op, speed in kernels[:most])
            + (f", and {more} more in the profile's op_speed" if more > 0 else ""))


def summary(profile: Profile, path: Path, seconds: float) -> str:
    lines = [f"wrote {path} in {seconds:.0f} s: link {profile.link_latency * 1e6:.2f} us + "
             f"{profile.link_bandwidth / 1e9:.2f} GB/s"]
    for threads, fields in sorted(profile.threads.items(), key=lambda kv: int(kv[0])):
        sixteen = "".join(f" ({p} {fields[f'{p}_flops'] / 1e9:.1f})" for p in ("bf16", "fp16")
                          if f"{p}_flops" in fields)
        lines.append(f"  {threads} thread{'s' * (threads != '1')} per rank: GEMM up to "
                     f"{fields['fp32_flops'] / 1e9:.1f}{sixteen} GFLOP/s, DDR "
                     f"{fields['ddr_bandwidth'] / 1e9:.1f} GB/s")
    return "\n".join(lines)


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine into a hardware profile",
                       description="Time the native kernels (GEMM in its three layouts, "
                       "attention, norms, RoPE, SwiGLU, embedding, cross-entropy, AdamW) on "
                       "model-sized shapes, with warm and with swept caches, the cache share "
                       "of a rank, DDR bandwidth and MPI latency and bandwidth between two "
                       "ranks, at the threads per rank the runtime uses, and write a profile "
                       "for `--hw`. Takes about 1.5 minutes on 2 cores and 2.5 on 16; run it "
                       "on an idle machine.")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="profile to write (default: this machine's cached profile, "
                   "$RATRAIN_CACHE/profiles/<cpu model>-<N>-cores.json, which every command "
                   "uses where no --hw is given; the shipped `cpu` profile stays as it is)")
    p.add_argument("--evict", action="store_true", help="time every kernel call after a "
                   "sweep of the last-level cache only, so the simulator charges every call "
                   "as if its operands came from DDR (default: each kernel timed back to "
                   "back and swept, and the simulator charges a call between the two by how "
                   "much of its operands the rank's cache share still holds; the optimizer "
                   "and other calls over the whole model's state are always swept)")
    p.add_argument("--from", dest="traces", action="append", default=[], metavar="TRACE",
                   help="calibrate from a traced run instead of measuring: the directory "
                   "`ratrain run DIR --trace TRACE` wrote (repeatable); what each kernel "
                   "shape and runtime call took there is written into the profile as "
                   "traced rows, which the simulator charges before any microbenchmark "
                   "case (docs/DESIGN.md 7)")
    p.add_argument("--program", default=None, metavar="DIR", help="with --from: the "
                   "program directory that was traced (default: the one the trace names)")
    add_options(p, "--hw", hw={"default": None, "help": "with --from: the profile to add "
                               "the traced rows to (default: the one the program was "
                               "compiled for)"})
    add_options(p, "--skip-steps")
    p.set_defaults(func=cmd_calibrate)
