"""`ratrain plan` and `ratrain compile --plan`: choose a configuration for N ranks.

plan runs the planner (ratrain/planner) and prints the candidates ranked by simulated
step time, the ones only estimated, and why the infeasible ones do not fit; --json gives
every row as a record. --min-clusters finds the smallest cluster count that fits first.
--schedule STRATEGY plans one strategy of planner/strategies.py; --schedule all adds
every strategy's best in one table. compile --plan takes the best row's options.
"""
from __future__ import annotations

import json

from ratrain.cli.machine import planned_machine
from ratrain.cli.measure import check_measure_dir, measure_plan, measure_refusal
from ratrain.cli.options import (DEFAULT_HW, DEFAULT_SIMULATE, HW_HELP, MACHINE_FLAGS,
                                 OPTIONS, PLANNED, add_options, dest, planned_values,
                                 positive_int)
from ratrain.errors import UserError
from ratrain.hw.identity import profile_label
from ratrain.hw.profiles import Profile
from ratrain.inputs import load_model
from ratrain.models.config import default_seq_len
from ratrain.planner.strategies import STRATEGIES
from ratrain.program_format.options import SCHEDULES
from ratrain.units import SIZE_HELP, format_budget, format_bytes

# --schedule: a compiler schedule (all its candidates), a strategy, or everything
SCHEDULE_CHOICES = SCHEDULES + tuple(n for n in STRATEGIES if n not in SCHEDULES) + ("all",)
NOTHING_FITS = 1    # plan's exit status when no configuration fits (2: a usage error)
SCHEDULE_PLAN_HELP = (
    "what to search: a schedule with every configuration (" + OPTIONS["--schedule"].help
    + "), or one strategy: tuned (baseline, any configuration), backward-checkpointing "
    "(baseline, full recompute at backward time), keep-all (baseline, no recompute), "
    "zero3-heavy (baseline, ZeRO-3 gathering parameters at each use); all: both schedules, "
    "then every strategy's best in one table with ratrain's speedup over it")

# ---- running the planner ------------------------------------------------------------------

def search_for(args, schedules: tuple[str, ...], profile: dict):
    """The planner's Search from the command's model and batch flags on `profile`, the
    machine's (cli/machine.planned_machine)."""
    from ratrain.planner import Search
    config, name, profile = *load_model(args.model), Profile.of(profile)
    return Search(config, name, args.global_batch, args.seq_len or default_seq_len(config),
                  profile, args.budget or int(profile.usable_memory), schedules,
                  args.precision or profile.default_precision,
                  args.simulate or DEFAULT_SIMULATE)


def run_plan(search, clusters: int | None, smallest: bool, strategy: str | None = None,
             planner=None):
    """The plan at `clusters`, or (smallest) at the least count up to `clusters` that fits;
    of one strategy (by name) if given."""
    from ratrain.planner import Planner
    planner = planner or Planner(search)
    if strategy is not None:
        return _strategy_plan(planner, clusters, strategy, smallest)
    if not smallest:
        return planner.plan(clusters)
    limit = clusters or search.global_batch * search.num_layers
    plan = planner.smallest(limit)
    if plan is None:
        raise UserError(f"{search.name} fits on no cluster count up to {limit} with a "
                          f"global batch of {search.global_batch} under "
                          f"{format_bytes(search.budget)} per rank")
    return plan


def _strategy_plan(planner, clusters: int | None, name: str, smallest: bool):
    from ratrain.planner.compare import strategy_plan
    if smallest:
        raise UserError(f"--min-clusters searches every candidate: give --schedule "
                          f"ratrain, baseline or all with it, not {name}")
    return strategy_plan(planner, clusters, name)


def _check_search_flags(args) -> None:
    if args.clusters is None and not args.min_clusters and args.nodes is None and \
            not args.machine:
        raise UserError("give --clusters N (or --nodes K), or --min-clusters to find the "
                        "smallest count")
    if args.global_batch is None:
        raise UserError("give --global-batch G (sequences per step)")


# ---- output -------------------------------------------------------------------------------

def plan_json(plan, top: int, smallest: bool, strategies=None) -> dict:
    """The --json record: the search, every strategy's best (--schedule all), then every
    row (feasible rows: the best `top`)."""
    feasible = [r for r in plan.rows if r.feasible][:top]
    record = {"model": plan.model, "clusters": plan.clusters, "global_batch": plan.global_batch,
              "seq_len": plan.seq_len, "hw": plan.hw, "budget": plan.budget,
              "strategy": plan.strategy}
    if smallest:
        record["smallest_clusters"] = plan.clusters
    if strategies is not None:
        record["strategies"] = [s.to_json() for s in strategies]
    return record | {"rows": [r.to_json() for r in feasible + [r for r in plan.rows
                                                               if not r.feasible]]}


def _row_line(index: int, row, tokens_per_step: int) -> str:
    """One table row: its step time and tokens/s as simulated, else as estimated, and
    which of the two (the `timed` column)."""
    seconds = row.step_time_s if row.simulated else row.estimated_step_s
    step = f"{seconds:.4g}" if seconds else "-"
    tokens = f"{tokens_per_step / seconds:,.0f}" if seconds else "-"
    timed = "simulated" if row.simulated else "estimated" if seconds else "-"
    status = row.reason.removeprefix("not simulated: ") if row.reason else \
        "twin of the 1f1b row: simulated, not estimated" if \
        row.estimated_step_s is None else \
        f"estimate {row.estimated_step_s:.4g} s ({row.estimated_step_s / seconds - 1:+.1%})"
    grads = row.grad_accum or ("auto" if row.zero >= 2 else "-")
    return (f"{index:>3} {row.pp:>4} {row.dp:>5} {row.placement:<9} {row.zero:>4} {grads:<7} "
            f"{row.micro_batch_size:>4} {row.micro_batches:>5} {row.recompute:<9} "
            f"{_schedule_text(row):<19} {format_bytes(row.peak_bytes):>10} {step:>9} {timed:<9} "
            f"{tokens:>11} {row.bound or '-':<11}  {status}")


def _schedule_text(row) -> str:
    """`ratrain`, or `ratrain/zb1` for a zb1 twin (NOTE [zb1 twins]), with `+vp:both` (or
    `+vp:head`) for a vocabulary-parallel one, naming what it spreads (NOTE
    [vocabulary-parallel head], NOTE [vocabulary-parallel embedding])."""
    return row.schedule + ("/zb1" if row.pipeline_schedule == "zb1" else "") + \
        (f"+vp:{row.vocab_parallel}" if row.vocab_parallel != "none" else "")


def shown_rows(plan) -> list:
    """The rows that fit, as the table numbers them: those of the simulated recompute
    policy and those compiled (the others are never faster: --json lists them)."""
    policy = STRATEGIES[plan.strategy].simulated_policy if plan.strategy else "auto"
    return [r for r in plan.rows if r.feasible and (r.recompute == policy or
                                                    r.candidate in plan.notes)]


def format_plan(plan, top: int, smallest: bool) -> str:
    feasible = [r for r in plan.rows if r.feasible]
    infeasible = [r for r in plan.rows if not r.feasible]
    simulated = sum(r.simulated for r in plan.rows)
    checked = len(plan.notes) - simulated
    machine = f" ({plan.machine})" if plan.machine else ""
    lines = [f"plan {plan.model} on {plan.clusters} {plan.hw} ranks{machine}: global batch "
             f"{plan.global_batch} x {plan.seq_len} tokens, budget {format_budget(plan.budget)} "
             f"per rank",
             f"{len(plan.rows)} candidates in {plan.seconds:.1f} s: {len(feasible)} fit, "
             f"{len(infeasible)} do not"
             + (f"; {simulated} compiled and simulated" if feasible else "")
             + (f", {checked} compiled to check memory" if checked else "")
             + (", the others estimated" if len(feasible) > simulated + checked else "")]
    if smallest:
        lines.insert(0, f"smallest cluster count that fits: {plan.clusters}")
    shown = shown_rows(plan)
    if feasible:
        lines.append(f"{'#':>3} {'pp':>4} {'dp':>5} {'placement':<9} {'zero':>4} {'grads':<7} "
                     f"{'mbs':>4} {'M':>5} {'recompute':<9} {'schedule':<19} {'peak':>10} "
                     f"{'step s':>9} {'timed':<9} {'tokens/s':>11} {'bound':<11}")
        lines += [_row_line(i, r, plan.global_batch * plan.seq_len)
                  for i, r in enumerate(shown[:top], 1)]
        if len(shown) > top:
            lines.append(f"    ({len(shown) - top} more: --top)")
        if len(shown) < len(feasible):
            lines.append(f"    (and {len(feasible) - len(shown)} with recompute none, selective "
                         "or full, never faster than auto in the same configuration: --json "
                         "lists them)")
    lines += _best_lines(plan)
    if infeasible:
        lines.append(f"do not fit ({len(infeasible)}; per pp x dp the one closest to fitting, "
                     "--json lists all):")
        lines += _infeasible_lines(infeasible)
    return "\n".join(lines)


def _infeasible_lines(rows) -> list[str]:
    """The first (closest to fitting) row of each (pp, dp), with how many it stands for."""
    layouts: dict = {}
    for row in rows:
        layouts.setdefault((row.pp, row.dp), []).append(row)
    return [f"  {group[0].candidate}: {group[0].reason}"
            + (f" (and {len(group) - 1} more with pp {pp} x dp {dp})" if len(group) > 1 else "")
            for (pp, dp), group in layouts.items()]


def _timing(row) -> str:
    if row.simulated:
        return f"simulated step {row.step_time_s:.4g} s, {row.tokens_per_s:,.0f} tokens/s"
    return row.reason.removeprefix("not simulated: ")


def _best_lines(plan) -> list[str]:
    best = plan.best
    if best is None:
        return ["no candidate compiled within the budget"]
    return [f"best: {best.candidate}: peak {format_bytes(best.peak_bytes)}, {_timing(best)}",
            f"  {plan.notes[best.candidate]}"]


def strategy_lines(bests) -> list[str]:
    """The --schedule all table: each strategy's best, and ratrain's over it."""
    from ratrain.planner.compare import config_text
    width = max([len("configuration")] + [len(config_text(b.row.candidate))
                                          for b in bests if b.row is not None])
    lines = ["strategies, each at its best configuration (compiled and simulated; "
             "ratrain/x: ratrain's tokens/s over x's):",
             f"  {'strategy':<22} {'configuration':<{width}} {'peak':>10} {'step s':>9} "
             f"{'tokens/s':>11} {'ratrain/x':>9}"]
    for b in bests:
        if b.row is None:
            lines.append(f"  {b.strategy:<22} {b.note}")
            continue
        r, ratio = b.row, "-" if b.speedup is None else f"{b.speedup:.3f}x"
        lines.append(f"  {b.strategy:<22} {config_text(r.candidate):<{width}} "
                     f"{format_bytes(r.peak_bytes):>10} {r.step_time_s:>9.4g} "
                     f"{r.tokens_per_s:>11,.0f} {ratio:>9}")
    lines += [f"  {b.strategy}: {b.note}" for b in bests if b.row is not None]
    return lines


def plan_everything(planner, args):
    """--schedule all: (the plan of both schedules' rows, every strategy's best). The
    ratrain and tuned strategies' plans hold every candidate of the two schedules; with
    --min-clusters the smallest count is found first and the strategies compared there."""
    from ratrain.planner.compare import compare_strategies, merged_plan
    if args.min_clusters:
        plan = run_plan(planner.search, args.clusters, True, planner=planner)
        return plan, compare_strategies(planner, plan.clusters)
    bests = compare_strategies(planner, args.clusters)
    return merged_plan(bests), bests


def _check_measure_flags(args, profile: dict) -> None:
    """--measure only where the plan is for this machine (NOTE [choosing by measuring]),
    checked before anything is planned or run."""
    if args.measure_dir and not args.measure:
        raise UserError("--measure-dir keeps what --measure K runs: give --measure K too")
    if not args.measure:
        return
    if args.json:
        raise UserError("--measure prints its runs and pick as text: drop --json")
    check_measure_dir(args.measure_dir)
    refusal = measure_refusal(args, profile, args.clusters)
    if refusal is not None:
        raise UserError(refusal)


def cmd_plan(args) -> int:
    from ratrain.planner import Planner
    _check_search_flags(args)
    name = args.schedule
    strategy = None if name in SCHEDULES + ("all",) else name
    schedules = SCHEDULES if name == "all" else \
        (STRATEGIES[strategy].schedule,) if strategy else (name,)
    planned = planned_machine(args)
    machine, base, profile = planned
    _check_measure_flags(args, profile)
    planner = Planner(search_for(args, schedules, profile))
    label = profile_label(base, machine.profile)
    if args.clusters is None and not args.min_clusters:
        raise UserError(f"--machine {args.machine} names no nodes: give --clusters N or "
                        "--nodes K")
    if name == "all":
        plan, bests = plan_everything(planner, args)
    else:
        plan, bests = run_plan(planner.search, args.clusters, args.min_clusters, strategy,
                               planner), None
    if args.json:
        record = plan_json(plan, args.top, args.min_clusters, bests) | {"profile": label}
        print(json.dumps(record, indent=1))
    else:
        print(format_plan(plan, args.top, args.min_clusters)
              + ("\n" + "\n".join(strategy_lines(bests)) if bests else "")
              + f"\nprofile: {label}", flush=True)
    if plan.best is None:
        return NOTHING_FITS
    return _measure(plan, args, planned) if args.measure else 0


def _measure(plan, args, planned) -> int:
    """--measure K: the table's K best rows measured here (cli/measure.py)."""
    refusal = measure_refusal(args, planned[2], plan.clusters)  # --min-clusters chose it
    if refusal is not None:
        raise UserError(refusal)
    return measure_plan(plan, shown_rows(plan)[:args.measure], args, planned)


# ---- compile --plan --------------------------------------------------------------------------

# the options the planner assumes at their defaults (those it chooses: options.PLANNED)
UNPLANNED = ("--clip",)


def apply_plan(args):
    """compile --plan: set the parallel and policy options from the best row and return
    the machine planned for (cli/machine.planned_machine); without --plan, refuse the
    planner's flags rather than ignore them, and return None."""
    if not args.plan:
        search_flags = [f for f in ("--clusters", "--global-batch", "--min-clusters",
                                    "--simulate", *MACHINE_FLAGS) if getattr(args, dest(f))]
        if search_flags:
            verb, them = ("steers", "it") if len(search_flags) == 1 else ("steer", "them")
            raise UserError(f"{', '.join(search_flags)} {verb} only the planner: add --plan "
                            f"to let it choose the layout, or drop {them} and give --pp, --dp "
                            "and --micro-batches yourself")
        return None
    given = [flag for flag in PLANNED + UNPLANNED
             if getattr(args, dest(flag)) != OPTIONS[flag].default]
    if given:
        raise UserError(f"--plan chooses the configuration without {', '.join(given)}: "
                          "give either those or --plan")
    _check_search_flags(args)
    planned = planned_machine(args)
    search = search_for(args, (args.schedule,), planned[2])
    plan = run_plan(search, args.clusters, args.min_clusters)
    if plan.best is None:
        raise UserError(f"no configuration of {plan.model} on {plan.clusters} rank(s) fits "
                          f"--budget {format_bytes(plan.budget)}; see `ratrain plan`")
    best = plan.best
    for flag, value in planned_values(best).items():
        setattr(args, dest(flag), value)
    args.seq_len = plan.seq_len
    print(f"planned for {plan.clusters} ranks: {best.candidate} ({_timing(best)})")
    return planned


# ---- argument parsers -------------------------------------------------------------------------

def add_search_options(p, *, required: bool) -> None:
    """--clusters, --min-clusters, --global-batch, --simulate and the machine
    (MACHINE_FLAGS): shared by plan and compile."""
    add_options(p, "--clusters")
    p.add_argument("--min-clusters", action="store_true", help="find the smallest cluster "
                   "count (up to --clusters, if given) at which a configuration fits, and "
                   "plan there")
    add_options(p, "--global-batch", "--simulate", global_batch={"required": required})
    add_options(p, *MACHINE_FLAGS)


def add_plan_parser(sub, model_help: str) -> None:
    p = sub.add_parser("plan", help="search configurations for N ranks under a memory budget "
                       "and rank them by simulated step time",
                       description="Search pipeline and DP degrees (pp x dp = N), ZeRO stage, "
                       "gradient accumulation under ZeRO 2 and 3 (the grads column: auto, or "
                       "scatter: reduce-scattered each micro-batch), micro-batch size and count "
                       "(dp x M x B = G), recompute policy, schedule and, on nodes of several ranks "
                       "(--nodes, --ranks-per-node), the placement. Candidates that cannot fit are dropped with the stage and "
                       "memory categories over budget; the rest are ordered by an analytic "
                       "estimate and the best few compiled and simulated. Exit status "
                       f"{NOTHING_FITS} when no configuration fits (the table says why). "
                       f"Sizes: {SIZE_HELP}.")
    p.add_argument("model", help=f"the model: {model_help}")
    add_search_options(p, required=True)
    add_options(p, "--seq-len", "--hw", "--budget", "--precision", "--schedule",
                hw={"default": None, "help": f"{HW_HELP} (default: the --machine file's, "
                    f"else {DEFAULT_HW})"},
                schedule={"choices": SCHEDULE_CHOICES, "help": SCHEDULE_PLAN_HELP})
    add_options(p, "--measure", "--measure-dir")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="show the K best rows that fit (default: 10)")
    p.add_argument("--json", action="store_true", help="print the search and its rows as "
                   "one JSON object (rows: pp, dp, zero, micro_batch_size, micro_batches, "
                   "recompute, schedule, zero3_prefetch, update_rule, grad_accum, placement, "
                   "pipeline_schedule (zb1: the simulated twin of a pipelined row), vocab_parallel "
                   "(none, or both: the twin with the LM head's and the input embedding's "
                   "rows over the stages), "
                   "feasible, reason, peak_bytes, step_time_s, tokens_per_s (simulated), "
                   "estimated_step_s, bound; with --schedule all, "
                   "strategies: strategy, "
                   "paper, best (a row or null), note, speedup)")
    p.set_defaults(func=cmd_plan)
