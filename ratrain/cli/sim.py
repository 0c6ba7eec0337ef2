"""`ratrain simulate DIR`: one simulated training step of a compiled program directory.

Rebuilds the Program from DIR's manifest (compiling is deterministic), replays one
pipeline on a hardware profile (ratrain/sim) and prints step time, tokens/s, bubble,
exposed tail and per-stage memory peaks; optionally a Chrome trace, the schedule picture
and a JSON record.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ratrain.cli.options import HW_HELP, add_options, non_negative_int
from ratrain.errors import UserError
from ratrain.hw.profiles import ALGORITHMS
from ratrain.inputs import load_hw


def _program_and_profile(args):
    from ratrain.programs import MANIFEST, is_program_dir, read_manifest
    directory = Path(args.program)
    if not is_program_dir(directory):
        raise UserError(f"{directory} is not a program directory (no {MANIFEST}); write "
                          "one with `ratrain compile MODEL -o DIR`")
    manifest = read_manifest(directory)
    profile = load_hw(args.hw) if args.hw else manifest["hw"]
    from ratrain.cluster.scaling import with_link
    if args.cluster:
        profile = {**profile, **_cluster_link(args.cluster)}
    return manifest, with_link(profile, args.link_bandwidth, args.link_latency)


def add_link_options(p) -> None:
    """--link-bandwidth and --link-latency (simulate and plan): with_link's overrides."""
    add_bandwidth_latency(p, "link", "bytes/s of every link, replacing the profile's "
                          "link_bandwidth, e.g. 61.7MB/s (as `ratrain cluster up` takes it)",
                          "seconds per message, replacing the profile's link_latency, e.g. 5us")


def add_bandwidth_latency(p, name: str, bandwidth_help: str, latency_help: str) -> None:
    """--NAME-bandwidth and --NAME-latency, parsed as `ratrain cluster up` parses a link."""
    from ratrain.cli.cluster import link_type
    from ratrain.cluster.scaling import parse_bandwidth, parse_latency
    p.add_argument(f"--{name}-bandwidth", type=link_type(parse_bandwidth), default=None,
                   metavar="B", help=bandwidth_help)
    p.add_argument(f"--{name}-latency", type=link_type(parse_latency), default=None,
                   metavar="S", help=latency_help)


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
    manifest, profile = _program_and_profile(args)
    how = dict(overlap=not args.serialize, algorithm=args.algorithm)
    if manifest.get("periods") and not (args.trace or args.schedule_png or args.against):
        _simulate_periodic(manifest, profile, how, args.json)
        return
    sim = simulate(recompile(manifest), profile, **how)
    record, compared = summary(sim), None
    if args.against:  # before the summary: a trace that does not fit is the only line
        from ratrain.sim.against import against
        compared = against(sim, Path(args.against), args.skip_steps)
        record["against"] = compared.record()
    print(json.dumps(record, indent=1) if args.json else format_summary(sim))
    notes = [compared.text()] if compared and not args.json else []
    if args.trace:
        notes.append(f"wrote {args.trace} ({write_trace(sim, args.trace)} trace events; open "
                     "in chrome://tracing or ui.perfetto.dev)")
    if args.schedule_png:
        notes.append(f"wrote {args.schedule_png} ({write_schedule_png(sim, args.schedule_png)} "
                     "task bars, simulated seconds)")
    for note in notes:  # on stderr under --json, so stdout stays one JSON document
        print(note, file=sys.stderr if args.json else sys.stdout)


def _simulate_periodic(manifest: dict, profile: dict, how: dict, as_json: bool) -> None:
    """A periodic program's step (NOTE [periodic programs]) extended from replays of
    instances (NOTE [periodic steps]), so the cost does not grow with M; --trace and
    --schedule-png replay the whole step instead."""
    from ratrain.compiler import recompile
    from ratrain.sim.periodic import simulate_periodic
    from ratrain.sim.report import format_periodic_summary, periodic_summary
    options = manifest["options"]
    sim = simulate_periodic(lambda n: recompile(manifest, n), options["micro_batches"],
                            options["pp"], profile, **how)
    print(json.dumps(periodic_summary(sim), indent=1) if as_json
          else format_periodic_summary(sim))


def add_simulate_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one training step of a compiled program "
                       "on a hardware profile",
                       description="Replay one pipeline of the program in DIR (the ranks of "
                       "DP replica 0) as discrete events: compute streams, ports shared by "
                       "pipeline messages and DP collectives (costed from the DP degree), "
                       "non-blocking overlap as the runtime does it. Prints step time, "
                       "tokens/s, bubble, exposed tail and per-stage memory peaks.")
    p.add_argument("program", metavar="DIR", help="program directory from `ratrain compile`")
    add_options(p, "--hw", hw={"default": None,
                               "help": f"{HW_HELP} (default: the one DIR was compiled for)"})
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome trace (JSON) of the simulated step to FILE")
    add_options(p, "--schedule-png")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None, help="collective "
                   "algorithm (default: the profile's collective_algorithm, else ring)")
    add_link_options(p)
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
    p.add_argument("--skip-steps", type=non_negative_int, default=2, metavar="N",
                   help="with --against, leave the first N traced steps out (default: 2)")
    p.set_defaults(func=cmd_simulate)
