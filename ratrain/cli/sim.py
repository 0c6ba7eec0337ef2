"""`ratrain simulate DIR`: one simulated training step of a compiled program directory.

Rebuilds the Program from DIR's manifest (compiling is deterministic), replays one
pipeline on the machine DIR was compiled for (NOTE [recorded machine]; the machine flags
override it) with ratrain/sim and prints the simulated step time, tokens/s, bubble,
exposed tail, per-stage memory peaks and the machine; optionally a Chrome trace, the
schedule picture and a JSON record.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ratrain.cli.options import HW_HELP, MACHINE_FLAGS, add_options
from ratrain.errors import UserError
from ratrain.hw.profiles import ALGORITHMS


def _program_and_machine(args):
    """(manifest, the machine's record, the profile to simulate on): the machine DIR
    records with the machine flags over it (NOTE [recorded machine]); --cluster's links
    over that, and --link-* over those."""
    from ratrain.cli.machine import program_machine
    from ratrain.cluster.scaling import with_link
    from ratrain.programs import MANIFEST, is_program_dir, read_manifest
    directory = Path(args.program)
    if not is_program_dir(directory):
        raise UserError(f"{directory} is not a program directory (no {MANIFEST}); write "
                          "one with `ratrain compile MODEL -o DIR`")
    manifest = read_manifest(directory)
    machine, profile = program_machine(manifest, args)
    if args.cluster:
        profile = with_link({**profile, **_cluster_link(args.cluster)}, args.link_bandwidth,
                            args.link_latency)
    return manifest, machine, profile


def _machine_line(manifest: dict, machine: dict, profile: dict, args) -> str:
    """Which machine the step was simulated on, and whether it is the one DIR records."""
    from ratrain.cli.machine import describe_machine
    from ratrain.cli.options import MACHINE_FLAGS, dest
    changed = [f for f in ("--hw", *MACHINE_FLAGS, "--cluster") if getattr(args, dest(f))]
    how = f"{', '.join(changed)} over the machine DIR records" if changed else \
        "the machine DIR was compiled for"
    return f"machine: {describe_machine(machine, profile, manifest['world_size'])} ({how})"


def _cluster_link(name: str) -> dict:
    """The link fields of cluster `name` (as probed, else as shaped)."""
    from ratrain.cli.cluster import cluster_up
    from ratrain.cluster.harness import link_fields
    cluster = cluster_up(name, f"(and `ratrain cluster probe {name}`) first")
    return link_fields(cluster)


def cmd_simulate(args) -> None:
    from ratrain.sim import simulate
    from ratrain.sim.report import format_summary, summary, write_schedule_png, write_trace
    from ratrain.compiler import recompile
    manifest, machine, profile = _program_and_machine(args)
    how = dict(overlap=not args.serialize, algorithm=args.algorithm)
    line = _machine_line(manifest, machine, profile, args)
    if manifest.get("periods") and not (args.trace or args.schedule_png or args.against):
        _simulate_periodic(manifest, profile, how, args.json, (machine, line))
        return
    sim = simulate(recompile(manifest), profile, **how)
    record, compared = summary(sim) | {"machine": machine}, None
    if args.against:  # before the summary: a trace that does not fit is the only line
        from ratrain.sim.against import against
        compared = against(sim, Path(args.against), args.skip_steps)
        record["against"] = compared.record()
    print(json.dumps(record, indent=1) if args.json else f"{format_summary(sim)}\n{line}")
    notes = [compared.text()] if compared and not args.json else []
    if args.trace:
        notes.append(f"wrote {args.trace} ({write_trace(sim, args.trace)} trace events; open "
                     "in chrome://tracing or ui.perfetto.dev)")
    if args.schedule_png:
        notes.append(f"wrote {args.schedule_png} ({write_schedule_png(sim, args.schedule_png)} "
                     "task bars, simulated seconds)")
    for note in notes:  # on stderr under --json, so stdout stays one JSON document
        print(note, file=sys.stderr if args.json else sys.stdout)


def _simulate_periodic(manifest: dict, profile: dict, how: dict, as_json: bool,
                       machine: tuple[dict, str]) -> None:
    """A periodic program's step (NOTE [periodic programs]) extended from replays of
    instances (NOTE [periodic steps]), so the cost does not grow with M; --trace and
    --schedule-png replay the whole step instead. `machine`: (its record, its line)."""
    from ratrain.compiler import recompile
    from ratrain.sim.periodic import simulate_periodic
    from ratrain.sim.report import format_periodic_summary, periodic_summary
    options = manifest["options"]
    sim = simulate_periodic(lambda n: recompile(manifest, n), options["micro_batches"],
                            options["pp"], profile, **how)
    record, line = machine
    print(json.dumps(periodic_summary(sim) | {"machine": record}, indent=1) if as_json
          else f"{format_periodic_summary(sim)}\n{line}")


def add_simulate_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one training step of a compiled program "
                       "on a hardware profile",
                       description="Replay one pipeline of the program in DIR (the ranks of "
                       "DP replica 0) as discrete events: compute streams, ports shared by "
                       "pipeline messages and DP collectives (costed from the DP degree), "
                       "non-blocking overlap as the runtime does it, on the machine DIR "
                       "was compiled for (profile, nodes, links; the machine options "
                       "override it). Prints the simulated step time (with --plan, the plan "
                       "row's), tokens/s, bubble, exposed tail and per-stage memory peaks.")
    p.add_argument("program", metavar="DIR", help="program directory from `ratrain compile`")
    add_options(p, "--hw", hw={"default": None,
                               "help": f"{HW_HELP} (default: the one DIR was compiled for; "
                               "the machine DIR records is laid over it)"})
    add_options(p, *MACHINE_FLAGS)
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome trace (JSON) of the simulated step to FILE")
    add_options(p, "--schedule-png")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None, help="collective "
                   "algorithm (default: the profile's collective_algorithm, else ring)")
    p.add_argument("--cluster", default=None, metavar="NAME", help="take the links of the "
                   "test cluster NAME that is up: as `ratrain cluster probe` measured them "
                   "(bandwidth, latency, host CPU per byte), else as shaped; --link-bandwidth "
                   "and --link-latency still override")
    p.add_argument("--serialize", action="store_true", help="wait for every DP collective "
                   "right after starting it (what overlap saves, by difference)")
    p.add_argument("--against", default=None, metavar="TRACE", help="the directory "
                   "`ratrain run DIR --trace TRACE` wrote: print, for every stage and task "
                   "kind, the ms per step it measured (replica 0, and the range over "
                   "the stage's replicas) beside the simulated ones, then the measured "
                   "step against the simulated step")
    add_options(p, "--skip-steps")
    p.set_defaults(func=cmd_simulate)
