"""`ratrain compile` and `ratrain inspect DIR`: a model to a program directory and back.

compile traces the model, runs the pass PIPELINE (passes/pipeline.py, driven by
ratrain/compiler.py) and writes DIR atomically (ratrain/programs.py): program.json
(manifest with sha256 of every file), passes/NN_<pass>.txt, rank<R>.txt, memory.txt, and
what the runtime runs (NOTE [program format], JSON and Cython, no pickle): runtime.json and
code/stage<N>.pyx (generated Cython; --build builds it into the user cache) with its rows
code/stage<N>.tasks.json and code/stage<N>.legend.txt (what each generated function's
offsets are). inspect reads those files; for pictures it recompiles from the manifest's
config and options (compiling is deterministic and fast).
"""
from __future__ import annotations

from pathlib import Path

from ratrain.cli.machine import describe_machine, planned_machine
from ratrain.cli.options import (DEFAULT_HW, HW_HELP, LAYOUT_FLAGS, POLICY_FLAGS, add_options,
                                 flag_of)
from ratrain.cli.plan import add_search_options, apply_plan
from ratrain.compiler import (FLAGS, compile_other_schedule, other_schedule, recompile,
                              resolve_options, simulate, simulated_step, trace_for)
from ratrain.errors import UserError
from ratrain.hw.identity import profile_label
from ratrain.hw.profiles import Profile
from ratrain.inputs import load_model, read_hf_config
from ratrain.passes.buffers import CATEGORIES
from ratrain.passes.plan_memory import format_bytes
from ratrain.program_format.options import default_micro_batches
from ratrain.programs import (MANIFEST, check_output, compile_program_dir, pass_file,
                              rank_line, rank_lowered, read_manifest)
from ratrain.units import SIZE_HELP, format_budget


# ---- --report ----------------------------------------------------------------------------------

def format_pass_times(records) -> list[str]:
    lines = ["pass times:"]
    lines += [f"  {i:02d} {r.name:<20} {r.seconds * 1e3:9.1f} ms" for i, r in enumerate(records, 1)]
    lines.append(f"  {'total':<23} {sum(r.seconds for r in records) * 1e3:9.1f} ms")
    return lines


def format_stage_memory(program) -> list[str]:
    """Per stage: peak, arena and the peak's bytes by category (as in memory.txt)."""
    header = f"  {'stage':>5} {'peak':>10} {'arena':>10} " + " ".join(f"{c:>11}" for c in CATEGORIES)
    lines = [f"peak memory per stage (budget {format_budget(program.options.budget)}):", header]
    for stage, m in sorted(program.memory.stages.items()):
        row = m.timeline[m.peak_task] if m.timeline else dict.fromkeys(CATEGORIES, 0)
        lines.append(f"  {stage:>5} {format_bytes(m.peak_bytes):>10} {format_bytes(m.arena_bytes):>10} "
                     + " ".join(f"{format_bytes(row[c]):>11}" for c in CATEGORIES))
    return lines


def format_simulated_step(sim, machine: str) -> list[str]:
    """The simulated step: the number `ratrain simulate DIR` and the plan's row print."""
    return [f"simulated step {sim.step_time:.4g} s on {machine}: {sim.tokens_per_s:,.0f} "
            f"tokens/s, bubble {sim.bubble_fraction:.1%} (as `ratrain simulate DIR` prints "
            "it; with --plan, the plan row's step)"]


def format_dry_run(program, profile: dict, result) -> list[str]:
    profile = Profile.of(profile)
    lines = [f"dry run (ordering check, not the step time) on {profile.name} "
             f"({'calibrated' if profile.calibrated else 'uncalibrated'} profile): "
             f"dry-run step {result.makespan:.4g} s, bubble {result.bubble_fraction:.1%}",
             f"  {'stage':>5} {'busy s':>10} {'exposed tail s':>15}"]
    lines += [f"  {s:>5} {result.busy[s]:>10.4g} {result.exposed_tail.get(s, 0.0):>15.4g}"
              for s in sorted(result.timeline)]
    lines.append("  (dry run: each rank runs its tasks one after another at the GEMM rate, "
                 "so a non-blocking SYNC does not overlap compute here; the simulator models "
                 "that, and the calls' own costs, for the simulated step above)")
    return lines


def format_schedule_comparison(program, other, profile: dict, result) -> list[str]:
    """This program's peak and step time next to the other schedule's (or why it failed)."""
    mine = program.options.schedule
    lines = ["ratrain vs baseline (same configuration, dry run):"]
    runs = {mine: (program, result)}
    if isinstance(other, str):
        lines.append(f"  {other_schedule(mine)}: does not fit: {other}")
    else:
        runs[other.options.schedule] = (other, simulate(other, profile))
    for schedule in ("ratrain", "baseline"):
        if schedule in runs:
            p, r = runs[schedule]
            lines.append(f"  {schedule:<9} peak {format_bytes(p.memory.peak_bytes)} (stage "
                         f"{p.memory.worst_stage}), arena {format_bytes(p.memory.arena_bytes)}, "
                         f"dry-run step {r.makespan:.4g} s, bubble {r.bubble_fraction:.1%}")
    return lines


def format_report(program, records, profile: dict, graph, machine: str) -> str:
    """--report: pass times, memory, the simulated step on the machine compiled for
    (`machine` describes it), the dry run and ratrain vs baseline."""
    result = simulate(program, profile)
    other = compile_other_schedule(graph, program.options, profile)
    return "\n".join(format_pass_times(records) + format_stage_memory(program)
                     + format_simulated_step(simulated_step(graph, program, profile), machine)
                     + format_dry_run(program, profile, result)
                     + format_schedule_comparison(program, other, profile, result))


# ---- the commands ------------------------------------------------------------------------------

def cmd_compile(args) -> None:
    config, name = load_model(args.model)
    out = Path(args.output)
    check_output(out, args.force)
    # with --plan, the machine planned for (--hw may come from the --machine file)
    machine, base, profile = apply_plan(args) or planned_machine(args)
    if args.micro_batches is None:  # NOTE [default micro-batches]
        args.micro_batches = default_micro_batches()
    options = resolve_options(config, profile, **{f: getattr(args, f) for f in FLAGS})
    graph = trace_for(config, name, options)
    record = machine.record(base)  # NOTE [recorded machine]
    program, records = compile_program_dir(out, graph, options, profile,
                                           read_hf_config(args.model), record,
                                           build=args.build, expand=args.expand)
    o = options
    print(f"compiled {name} for {o.world_size} ranks (pp {o.pp} x dp {o.dp}, "
          f"{o.rank_placement} placement), schedule "
          f"{o.schedule} ({o.pipeline_schedule}), recompute {o.recompute}, zero {o.zero}, {o.precision} on "
          f"{profile_label(base, machine.profile)}: peak "
          f"{format_bytes(program.memory.peak_bytes)} per rank -> {out}")
    if args.report:
        machine_text = describe_machine(record, profile, o.world_size)
        print(format_report(program, records, profile, graph, machine_text))


def cmd_inspect_program(args) -> None:
    directory = Path(args.model)
    manifest = read_manifest(directory)
    pictures = args.schedule_png or args.memory_png
    if not pictures or args.after is not None or args.rank is not None:
        # pictures alone print only what they wrote, not the whole last pass's text
        text = pass_file(directory, manifest, args.after).read_text()
        if args.rank is not None:
            text = (rank_line(text, manifest, args.rank) + "\n"
                    + rank_lowered(text, manifest, args.rank))
        print(text, end="")
    if pictures:
        instance = None
        if manifest.get("periods"):  # a step of M micro-batches would be a wall of bars
            instance = manifest["periods"]["0"]["instance"]
            print(f"(pictures of an instance of {instance} micro-batches: the step repeats "
                  "its period, NOTE [periodic programs])")
        write_pictures(recompile(manifest, instance), manifest["hw"], args)


def reject_program_options(args) -> None:
    """inspect MODEL: the program-only options would be silently ignored; refuse them."""
    given = [flag for flag, value in (("--after", args.after), ("--rank", args.rank),
             ("--schedule-png", args.schedule_png), ("--memory-png", args.memory_png))
             if value is not None]
    if given:
        raise UserError(f"{', '.join(given)} need a program DIR written by `ratrain "
                          f"compile`; {args.model!r} has no {MANIFEST}")


def write_pictures(program, profile: dict, args) -> None:
    from ratrain.sim.costs import task_cost_model
    from ratrain.passes.plots import memory_png, schedule_png
    if args.schedule_png:
        bars = schedule_png(program, args.schedule_png, cost=task_cost_model(program, profile),
                            unit="s")
        print(f"wrote {args.schedule_png} ({bars} task bars, a dry run's times from the "
              f"{Profile.of(profile).name} profile in seconds; `ratrain simulate DIR "
              "--schedule-png` draws the simulated step)")
    if args.memory_png:
        stages = memory_png(program, args.memory_png)
        print(f"wrote {args.memory_png} ({stages} stages)")


# ---- argument parsers --------------------------------------------------------------------------

def add_compile_parser(sub, model_help: str) -> None:
    p = sub.add_parser("compile", help="compile a model into a static per-rank training "
                       "program directory",
                       description="Trace MODEL, run the pass pipeline (partition, 1F1B, "
                       "recovery, gradient sync, update, prefetch, memory plan) and write a "
                       "program directory: program.json, passes/NN_<pass>.txt, rank<R>.txt, "
                       "memory.txt, and what the runtime runs: runtime.json and the generated "
                       "code/stage<N>.pyx with its rows, code/stage<N>.tasks.json (JSON, no "
                       f"pickle). Sizes: {SIZE_HELP}.")
    p.add_argument("model", help=f"the model: {model_help}")
    # the flag of every CompileOptions field (compiler.FLAGS), so a new option needs no line here
    first = (*LAYOUT_FLAGS, *POLICY_FLAGS, "--hw")  # as --help lists them
    add_options(p, *first, *[flag_of(f) for f in FLAGS if flag_of(f) not in first],
                hw={"default": None, "help": f"{HW_HELP} (default: the --machine file's with "
                    f"--plan, else {DEFAULT_HW})"})
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="program directory to write (atomically; see --force)")
    p.add_argument("--force", action="store_true",
                   help="replace DIR if it already holds a compiled program")
    p.add_argument("--build", action="store_true", help="also build the generated Cython "
                   "modules now, into the user cache (RATRAIN_CACHE; default: the first run "
                   "builds what is missing; builds are cached by content hash, so identical "
                   "stages build once)")
    p.add_argument("--expand", action="store_true", help="compile every micro-batch of the "
                   "step into the program and its pass outputs; by default a long step (40 "
                   "micro-batches or more for 2 stages, 10 P + 8 from 4 stages) is written "
                   "as an instance of a few micro-batches with a period that repeats, "
                   "which runs the same calls")
    p.add_argument("--report", action="store_true", help="print pass times, per-stage peak "
                   "memory, a dry run on the --hw profile (bubble, exposed tail) and the "
                   "peaks of ratrain vs baseline scheduling")
    p.add_argument("--plan", action="store_true", help="let the planner choose --pp, --dp, "
                   "--micro-batches, --micro-batch-size, --zero, --grad-accum and --recompute: "
                   "the best row of `ratrain plan` for --clusters and --global-batch "
                   "(--seq-len defaults as in `ratrain plan`)")
    add_search_options(p, required=False)
    p.set_defaults(func=cmd_compile)


def add_program_inspect_options(p) -> None:
    """Options of `ratrain inspect DIR` (a compiled program rather than a model)."""
    p.add_argument("--after", default=None, metavar="PASS", help="with a program DIR: show "
                   "the program after this pass, by name or number (default: the last)")
    p.add_argument("--rank", type=int, default=None, metavar="R",
                   help="with a program DIR: print only rank R's task list (and, after the "
                   "lower pass, its stage's lowered calls)")
    add_options(p, "--schedule-png")
    p.add_argument("--memory-png", default=None, metavar="FILE",
                   help="with a program DIR: draw each stage's memory timeline to FILE")
