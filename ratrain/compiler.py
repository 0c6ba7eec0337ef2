"""The compile driver: CompileOptions from a command's flags, the model traced, the pass
pipeline run (a long step as a periodic program, NOTE [periodic programs]), over-budget
programs turned into one-line errors, a program rebuilt from its manifest, and the dry
run `ratrain compile --report` prints. JAX and the passes are imported by the functions
that need them, so a command that only parses its flags starts quickly.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace

from ratrain.errors import UserError
from ratrain.hw.profiles import Profile
from ratrain.program_format.options import flag_fields
from ratrain.units import format_budget


# The flags a compile takes, by CompileOptions field (every field but NOT_FLAGS): unset
# (None) ones are filled from the model and the profile by resolve_options.
FLAGS = flag_fields()


def resolve_options(config: dict, profile: dict, **flags):
    """CompileOptions from `flags` (FLAGS), filling unset ones from the model and the
    profile: seq_len models.config.default_seq_len, precision and ZeRO the profile's
    defaults (ZeRO only with dp > 1), the budget the profile's usable memory."""
    from ratrain.models.config import check_sequence_length, default_seq_len
    from ratrain.passes.program import CompileOptions
    flags, profile = {k: v for k, v in flags.items() if v is not None}, Profile.of(profile)
    defaults = {"seq_len": default_seq_len(config),
                "precision": profile.default_precision,
                "zero": profile.default_zero if flags.get("dp", 1) > 1 else 0,
                "budget": int(profile.usable_memory)}
    if "clip" in flags and not (math.isfinite(flags["clip"]) and flags["clip"] > 0):
        raise UserError(f"--clip must be a positive gradient norm, e.g. 1.0; got "
                        f"{flags['clip']:g} (leave it out for no clipping)")
    try:
        options = CompileOptions(**(defaults | flags), hw=profile.name)
        check_sequence_length(config, options.seq_len)  # a sliding window is refused here
    except ValueError as e:
        raise UserError(str(e)) from None
    return options


def trace_for(config: dict, name: str, options):
    """The TrainGraph the options ask for: fp16 and bf16 programs trace in their dtype,
    --vocab-parallel ones with the head's rows (and with both, the embedding's) split
    over the stages (NOTE [vocabulary-parallel head], NOTE [vocabulary-parallel
    embedding])."""
    from ratrain.models.trace import trace_model
    from ratrain.program_format.options import GRAPH_DTYPE
    dtype = GRAPH_DTYPE[options.precision]
    vocab = int(config["vocab_size"])
    if options.splits_head and vocab % options.pp:
        raise UserError(f"--vocab-parallel splits the LM head's {vocab} rows evenly over the "
                        f"stages: --pp {options.pp} does not divide them (choose a --pp "
                        "that does, or drop --vocab-parallel)")
    return trace_model(config, micro_batch_size=options.micro_batch_size,
                       seq_len=options.seq_len, dtype=dtype, name=name,
                       vocab_shards=options.pp if options.splits_head else 0,
                       split_embed=options.splits_embedding)


def compile_graph(graph, options, expand: bool = False, profile: dict | None = None,
                  stages: tuple = ()):
    """Run the pass pipeline; (program, records). A long step compiles as a periodic
    program (NOTE [periodic programs]) unless `expand`; over-budget programs are user
    errors. `profile`: the hardware compiled for, whose cost model places zb1's W's
    (NOTE [zb1 schedule]) and weighs where auto recompute runs (NOTE [where recovery
    runs]) and balances the stages; None: unit costs (FLOPs for recovery and the
    partition). `stages`: a split to keep rather than balance (NOTE [a recorded split is
    kept])."""
    from ratrain.passes.partition_stages import PartitionError
    from ratrain.passes.plan_memory import MemoryBudgetError
    try:
        if not expand:
            found = _compile_periodic(graph, options, profile, stages)
            if found is not None:
                return found
        return _compile_instance(graph, options, None, profile, stages)
    except (PartitionError, MemoryBudgetError) as e:
        over_budget = isinstance(e, MemoryBudgetError) or e.peak > 0
        raise UserError(f"the {options.schedule} program does not fit --budget "
                          f"{format_budget(options.budget)} per rank:\n{e}" if over_budget
                          else str(e)) from None


def _compile_instance(graph, options, micro_batches: int | None, profile: dict | None = None,
                      stages: tuple = ()):
    from ratrain.passes.pipeline import run_pipeline
    from ratrain.passes.program import Program
    from ratrain.sim.costs import bound_cost_model
    return run_pipeline(Program(graph, options, stages=stages, built_micro_batches=micro_batches,
                                cost_model=bound_cost_model(profile)))


def _compile_periodic(graph, options, profile: dict | None = None, stages: tuple = ()):
    """(periodic program, stage 0's instance's records), or None when the step is short
    or shows no period (the caller then compiles it whole)."""
    from ratrain.passes.periodic_program import find_periods, periodic_program, worth_it
    if not worth_it(options.micro_batches, options.pp, options.pipeline_schedule):
        return None
    compiled = {}

    def instance(n: int):
        compiled[n] = _compile_instance(graph, options, n, profile, stages)
        return compiled[n][0]

    periods = find_periods(instance, options.micro_batches, options.pp,
                           lambda text: print(f"ratrain: {text}", file=sys.stderr, flush=True),
                           options.pipeline_schedule)
    if periods is None:
        print(f"ratrain: no repeating period found; compiling all {options.micro_batches} "
              "micro-batches", file=sys.stderr, flush=True)
        return None
    return periodic_program(periods), compiled[periods[0][1].instance][1]


def recompile(manifest: dict, instance: int | None = None):
    """The Program a manifest describes, rebuilt from its model config, options and
    recorded split (NOTE [a recorded split is kept]): the whole step, or its instance of
    `instance` micro-batches."""
    from ratrain.passes.program import CompileOptions
    options = CompileOptions.from_dict(manifest["options"])
    graph = trace_for(manifest["model"]["config"], manifest["model"]["name"], options)
    stages = tuple(tuple(s["layers"]) for s in manifest["stages"])
    if instance is not None:
        return _compile_instance(graph, options, instance, manifest.get("hw"), stages)[0]
    return compile_graph(graph, options, expand=True, profile=manifest.get("hw"),
                         stages=stages)[0]


def simulate(program, profile: dict):
    """dry_run of the stage task lists with the profile's cost model (seconds); a
    periodic program's whole step, each repeated task costed as the one it repeats."""
    from ratrain.sim.costs import task_cost_model
    from ratrain.passes.dryrun import dry_run
    from ratrain.passes.periodic_program import expanded_schedule
    schedule, base = expanded_schedule(program)
    cost = task_cost_model(program, profile)
    return dry_run(schedule, lambda task: cost(base[task]))


def simulated_step(graph, program, profile: dict):
    """The simulated step of `program` on `profile`, the number `ratrain simulate DIR` and
    the plan's row print: a periodic program's extended from replays of instances (NOTE
    [periodic steps]), as the planner does, else the whole step replayed."""
    from ratrain.sim import simulate as replay_step
    from ratrain.sim.periodic import simulate_periodic
    o = program.options
    if not program.periods:
        return replay_step(program, profile)
    return simulate_periodic(lambda n: _compile_instance(graph, o, n, profile,
                                                         program.stages)[0],
                             o.micro_batches, o.pp, profile)


def other_schedule(schedule: str) -> str:
    return "baseline" if schedule == "ratrain" else "ratrain"


def compile_other_schedule(graph, options, profile: dict | None = None):
    """The same configuration under the other schedule, in memory, through plan_memory
    only (its peak and dry run are all the report needs), decided on `profile`'s costs
    as this one was; the error's first line if it does not fit."""
    from ratrain.passes.partition_stages import PartitionError
    from ratrain.passes.pipeline import MEMORY_PIPELINE, run_pipeline
    from ratrain.passes.plan_memory import MemoryBudgetError
    from ratrain.passes.program import Program
    from ratrain.sim.costs import bound_cost_model
    other = Program(graph, replace(options, schedule=other_schedule(options.schedule)),
                    cost_model=bound_cost_model(profile))
    try:
        return run_pipeline(other, MEMORY_PIPELINE, verify=False)[0]
    except (PartitionError, MemoryBudgetError) as e:
        return str(e).splitlines()[0]
