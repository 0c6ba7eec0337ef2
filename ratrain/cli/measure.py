"""`ratrain plan --measure K`: the plan's K best rows compiled as `ratrain compile` would
(programs.compile_program_dir), run a few traced steps each under mpiexec as `ratrain run`
runs them (cli/train.cmd_run), measured beside their simulated step, and the fastest
measured picked (NOTE [choosing by measuring], planner/measure.py, which sizes the runs
and chooses). Only where the plan is for this machine (`measure_refusal`).
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path

from ratrain.cli.options import (DEFAULT_HW, MACHINE_FLAGS, OPTIONS, OneLineErrors, dest,
                                 flag_of, planned_values)
from ratrain.cli.train import add_run_parser, cmd_run
from ratrain.errors import UserError
from ratrain.hw.profiles import Profile
from ratrain.planner.measure import (WARMUP_STEPS, Measurement, RunFailed, fastest,
                                     measure_rows, predicted_step, timed)
from ratrain.rt.stop import Stopped


# ---- is the plan for this machine? --------------------------------------------------------

def this_machine_cores() -> int:
    """The cores this process may run on (the ranks share them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1


def measure_refusal(args, profile: dict, ranks: int | None) -> str | None:
    """Why plan --measure cannot run the rows here (one line), or None: the machine flags
    or a profile other than a CPU's describe another machine, or the ranks exceed the
    cores (a rank per core, as `ratrain train` runs)."""
    given = [flag for flag in MACHINE_FLAGS if getattr(args, dest(flag))]
    if given:
        return (f"--measure runs the rows on this machine, and {', '.join(given)} "
                f"describe{'s' * (len(given) == 1)} another machine: plan without "
                f"{'it' if len(given) == 1 else 'them'} to measure here")
    if Profile.of(profile).name != "cpu":
        return (f"--measure runs the rows on this machine's CPU, and the plan is for "
                f"{Profile.of(profile).name} ranks (--hw {args.hw}): plan with a cpu profile to "
                "measure here")
    cores = this_machine_cores()
    if ranks is not None and ranks > cores:
        return (f"--measure runs a rank per core, and this machine has {cores} "
                f"core{'s' * (cores != 1)} for the plan's {ranks} ranks: plan for at most "
                f"{cores} to measure here")
    return None


def check_measure_dir(directory: str | None) -> None:
    """--measure-dir must be new or empty (rows are written as row<I>)."""
    path = Path(directory) if directory else None
    if path is not None and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"--measure-dir {directory} exists and is not an empty directory: "
                        "give a new one")


# ---- a row as `ratrain compile` flags -------------------------------------------------------

def compile_flags(row, args) -> dict:
    """flag -> value that `ratrain compile MODEL` takes to compile `row` as compile --plan
    would: the row's planned options, its schedule and the plan's sequence length,
    profile, budget and precision (each left out at its default)."""
    flags = planned_values(row) | {"--schedule": row.schedule, "--seq-len": args.seq_len,
                                   "--hw": args.hw, "--budget": args.budget,
                                   "--precision": args.precision}
    defaults = {flag: OPTIONS[flag].default for flag in flags} | {"--hw": DEFAULT_HW}
    return {flag: value for flag, value in flags.items() if value != defaults[flag]}


def compile_command(model: str, flags: dict, out: str) -> str:
    words = ["ratrain", "compile", model,  # a switch is its flag alone
             *[w for f, v in flags.items() for w in ((f,) if v is True else (f, str(v)))],
             "-o", out]
    return " ".join(shlex.quote(w) for w in words)


# ---- the runner ---------------------------------------------------------------------------

class MpiRunner:
    """planner/measure.RowRunner: compiles a row in-process for the planned machine and
    runs it as `ratrain run DIR --steps N --trace T --metrics M` does, its output to a log."""

    def __init__(self, args, planned):
        self.args, (self.machine, self.base, self.profile) = args, planned

    def compile(self, row, program: Path) -> None:
        from ratrain.compiler import FLAGS, resolve_options, trace_for
        from ratrain.inputs import load_model, read_hf_config
        from ratrain.programs import compile_program_dir
        given = {dest(flag): value for flag, value in compile_flags(row, self.args).items()}
        values = {f: given.get(f, OPTIONS[flag_of(f)].default) for f in FLAGS}
        try:
            config, name = load_model(self.args.model)
            options = resolve_options(config, self.profile, **values)
            compile_program_dir(program, trace_for(config, name, options), options,
                                self.profile, read_hf_config(self.args.model),
                                self.machine.record(self.base))
        except UserError as e:
            raise RunFailed(f"does not compile: {e}") from None

    def run(self, program: Path, steps: int, trace: Path, metrics: Path, log: Path
            ) -> list[float]:
        args = run_arguments([str(program), "--steps", str(steps), "--trace", str(trace),
                              "--metrics", str(metrics)])
        with open(log, "w") as out, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(out):
            try:
                code = cmd_run(args)
            except UserError as e:
                raise RunFailed(str(e)) from None
        check_exit(code, log)
        return [json.loads(line)["step_seconds"] for line in metrics.read_text().splitlines()
                if line.strip()]


def run_arguments(argv: list[str]):
    """The parsed arguments of `ratrain run ARGV` (the run command's own parser)."""
    parser = OneLineErrors(prog="ratrain")
    add_run_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


def check_exit(code: int, log: Path) -> None:
    """A run stopped by a signal stops the measuring (as the signal would have stopped
    `ratrain plan`); one that failed fails its row, with the log's last line."""
    if code > 128 and code - 128 in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        raise KeyboardInterrupt if code - 128 == signal.SIGINT else Stopped(code - 128)
    if code:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise RunFailed(f"the run exited with {code}: {lines[-1] if lines else 'no output'}")


# ---- the command --------------------------------------------------------------------------

@contextlib.contextmanager
def measure_directory(given: str | None):
    """--measure-dir (made if missing, kept) or a temporary directory (removed after);
    a --measure-dir this command made and left empty is removed too."""
    if given is None:
        path = Path(tempfile.mkdtemp(prefix="ratrain-measure-"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    path, made = Path(given), not Path(given).exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        if made and not any(path.iterdir()):
            path.rmdir()


def measure_plan(plan, rows: list, args, planned, runner=None) -> int:
    """Measure `rows` (the table's first --measure rows), print them beside their
    simulated or estimated step and the pick; 0 if some row ran, else 1."""
    kept = args.measure_dir is not None
    with measure_directory(args.measure_dir) as directory:
        where = directory if kept else "a temporary directory (--measure-dir DIR keeps them)"
        print(f"measuring the {len(rows)} best rows on this machine, {plan.clusters} ranks "
              f"under mpiexec, programs and traces in {where}:", flush=True)
        done = measure_rows(rows, runner or MpiRunner(args, planned), directory,
                            lambda line: print(f"  {line}", flush=True))
        print("\n".join(measured_lines(done) + pick_lines(done, args, kept)))
    return 0 if fastest(done) else 1


def measured_lines(done: list[Measurement]) -> list[str]:
    width = max(len(str(m.row.candidate)) for m in done)
    lines = [f"measured (median step after {WARMUP_STEPS} warm-up steps) beside the plan's "
             "step:", f"  {'#':>3} {'configuration':<{width}} {'step s':>9} {'timed':<9} "
             f"{'measured s':>10} {'measured/timed':>14}"]
    for m in done:
        predicted = predicted_step(m.row)
        step = f"{m.step_s:.4g}" if m.step_s else "-"
        ratio = f"{m.step_s / predicted:.3f}x" if m.step_s and predicted else \
            m.problem if m.problem else "-"
        lines.append(f"  {m.index:>3} {str(m.row.candidate):<{width}} {predicted:>9.4g} "
                     f"{timed(m.row):<9} {step:>10} {ratio:>14}")
    return lines


def pick_lines(done: list[Measurement], args, kept: bool) -> list[str]:
    """Which row was picked and how to compile it; the calibrate command over the traces."""
    best = fastest(done)
    if best is None:
        return ["no row ran, so none is picked (the reasons are above); `ratrain plan` "
                "without --measure ranks them by simulated step"]
    first = done[0]
    versus = "the plan's best too" if best is first else \
        f"row 1, the plan's best, measured {first.step_s:.4g} s" if first.step_s else \
        "row 1, the plan's best, did not run"
    lines = [f"picked row {best.index}, the fastest measured ({best.step_s:.4g} s a step; "
             f"{versus}): {best.row.candidate}",
             f"  compile it: {compile_command(args.model, compile_flags(best.row, args), 'DIR')}"]
    if kept:
        lines.append(f"  (compiled already: `ratrain run {shlex.quote(str(best.program))}` "
                     "trains it)")
    return lines + calibrate_lines(done, args, kept)


def calibrate_lines(done: list[Measurement], args, kept: bool) -> list[str]:
    """The `ratrain calibrate --from` command over the rows' traces (NOTE [traced rows])."""
    ran = [m for m in done if m.step_s is not None]
    if kept:
        traces = [str(m.trace) for m in ran]
        out = str(Path(args.measure_dir) / "traced.json")
    else:
        traces = [f"DIR/row{m.index}/trace" for m in ran]
        out = "PROFILE.json"
    command = " ".join(["ratrain", "calibrate", *[w for t in traces
                                                 for w in ("--from", shlex.quote(t))],
                        "-o", shlex.quote(out)])
    if kept:
        return [f"calibrate a profile from these runs: {command}"]
    return ["the traces were in a temporary directory, now removed; with --measure-dir DIR "
            f"they are kept for: {command}"]
