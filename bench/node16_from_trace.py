"""A 16-core node's runs predicted from one of them (issue 40): `ratrain calibrate --from`
the traces of one layout alone (default pp 4 x dp 4 1f1b), over the node's microbenchmark
profile, then every layout simulated on both profiles against its measured median step.

Reads a directory that `../shared/device/node16.sh` filled (profile.json, steps.jsonl,
traces.tar.gz and programs.tar.gz, as bench/node16-h200/ holds), so it runs anywhere.
The calibrated-from layout is printed last and marked: it is never scored against its own
trace. Usage: python bench/node16_from_trace.py [DIR] [--from LAYOUT]."""
import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def program_digest(program: Path) -> str:
    """What a program directory runs: its runtime.json and generated code, hashed."""
    files = [program / "runtime.json", *sorted((program / "code").iterdir())]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def repeat_spread(steps: dict, programs: Path) -> list[str]:
    """A line for each program measured more than once under different names (the
    node's own run-to-run spread, the floor under any prediction's error)."""
    groups = {}
    for name in steps:
        groups.setdefault(program_digest(programs / name), []).append(name)
    lines = []
    for names in (g for g in groups.values() if len(g) > 1):
        times = [steps[n] for n in names]
        lines.append(f"# the same program measured {' and '.join(f'{t:.3f} s' for t in times)} "
                     f"({', '.join(names)}): {max(times) / min(times) - 1:.1%} apart")
    return lines


def ratrain(*argv) -> str:
    done = subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, argv)],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench/node16_from_trace: ratrain {' '.join(map(str, argv))}: {done.stderr}")
    return done.stdout


def simulated(program: Path, hw: Path) -> float:
    return json.loads(ratrain("simulate", program, "--hw", hw, "--json"))["step_time_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(HERE / "node16-h200"))
    ap.add_argument("--from", dest="source", default="pp4-dp4-m8-b1-zero0-1f1b")
    args = ap.parse_args()
    measured_dir = Path(args.dir)
    steps = {r["name"]: r["measured_median_from_step_3"]
             for r in map(json.loads, (measured_dir / "steps.jsonl").read_text().splitlines())}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for name in ("traces", "programs"):
            with tarfile.open(measured_dir / f"{name}.tar.gz") as tar:
                tar.extractall(work / name, filter="data")
        micro, traced = measured_dir / "profile.json", work / "traced.json"
        ratrain("calibrate", "--from", work / "traces" / args.source, "--program",
                work / "programs" / args.source, "--hw", micro, "-o", traced)
        rows = next(e["traced"] for e in json.loads(traced.read_text())["threads"].values()
                    if "traced" in e)
        print(f"# {measured_dir.name}: calibrated from {args.source}'s traces alone over the "
              f"microbenchmark profile; arrival drift {rows.get('arrival_drift')}, rank "
              f"spread {rows.get('rank_spread')}, kernels beside collectives "
              f"{rows.get('kernel_slowdown_beside')} [value, samples]; "
              "error = simulated / measured - 1")
        errors = []
        for name in sorted(steps, key=lambda n: n == args.source):
            program = work / "programs" / name
            a, b, m = simulated(program, micro), simulated(program, traced), steps[name]
            own = name == args.source
            if not own:
                errors.append(abs(b / m - 1))
            print(f"{name:<28} measured {m:.3f} s  microbenchmark {a:.3f} s ({a / m - 1:+.1%})  "
                  f"traced {b:.3f} s ({b / m - 1:+.1%})"
                  + ("  [calibrated from: its own trace, not scored]" if own else ""))
        print(f"# traced profile, the other layouts: mean |error| {sum(errors) / len(errors):.1%}, "
              f"largest {max(errors):.1%} (target: each within 5%)")
        print("\n".join(repeat_spread(steps, work / "programs")))


if __name__ == "__main__":
    main()
