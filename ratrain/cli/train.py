"""`ratrain run DIR -n N` and `ratrain train`: launch the MPI runtime with mpiexec.

run starts `python -m ratrain.rt DIR` on N ranks with the training options, on this host or
on --hosts/--hostfile (rt/hosts.py), or on a test cluster's nodes (--cluster). train first
compiles a model (the tiny preset by default) into a run directory, then runs it (rank 0
prints the progress and one summary). mpiexec is the one of the installed mpich wheel
(next to Python). SIGINT or SIGTERM stops every rank after one step with a checkpoint; the
last line printed names it and the command that resumes, as it does when a rank dies.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from ratrain.calibrate.this_machine import default_hw
from ratrain.cli.train_log import TRAIN_LOG, TerminalLog
from ratrain.errors import UserError
from ratrain.hw.identity import profile_label
from ratrain.inputs import load_hw, read_hf_config
from ratrain.rt.checkpoint import latest_checkpoint
from ratrain.rt.hosts import resolve_hosts
from ratrain.rt.launch import launch
from ratrain.rt.stop import command_text
from ratrain.rt.train_options import add_training_options, resume_argv


# ---- ratrain run ---------------------------------------------------------------------------

def cmd_run(args) -> int:
    """Check the program directory and the rank count here (no MPI job for a certain
    failure), then launch."""
    from ratrain.cli.resume import check_start
    program = Path(args.program)
    check_checkpoint_options(args)
    if args.trust_program_code:
        from ratrain.rt.program import trusted_line
        print(trusted_line(program), flush=True)
    manifest, ranks = check_program(program, args.ranks, args.trust_program_code)
    hosts = resolve_hosts(args.hosts, args.hostfile, ranks)
    check_start(args, manifest["model"]["config"])
    check_save_dir_option(args)
    tokenize_data(args, manifest["model"]["config"], manifest["options"]["seq_len"])
    resume = command_text(["ratrain", "run", program, *resume_argv(args),
                           *(["--cluster", args.cluster] if args.cluster else [])])
    if args.cluster is None:
        return ran(program, args, launch(program, ranks, args, resume, hosts=hosts))
    from ratrain.cluster import ClusterError, cluster_for_run
    try:
        with cluster_for_run(args.cluster, ranks, hosts) as cluster:
            return ran(program, args, launch(program, ranks, args, resume, cluster=cluster,
                                             hosts=hosts))
    except ClusterError as e:
        raise UserError(str(e)) from None


def ran(program: Path, args, code: int) -> int:
    """The job's exit code; a program rebuilt and run to the end is recorded as checked
    (NOTE [tables are derived]), after the job: a start that fails writes nothing."""
    if code == 0 and not args.trust_program_code:
        from ratrain.programs import record_verified
        record_verified(program)
    return code


def check_program(program: Path, ranks: int | None, trust: bool) -> tuple[dict, int]:
    """(manifest, ranks) of a program directory checked as every rank will check it (its
    fields, hashes, rows and rendered code: NOTE [a program directory is data]) and
    rebuilt from its manifest unless `trust` (NOTE [tables are derived]), so that a bad
    one is refused here in one line without starting a job."""
    from ratrain.rt.load import SetupError, check_format, check_manifest, open_program, \
        read_manifest
    try:
        manifest = read_manifest(program)
        check_format(program, manifest)
        check_manifest(program, manifest)
        ranks = ranks if ranks is not None else manifest["world_size"]
        _, opened = open_program(str(program), ranks, trust)
    except SetupError as e:
        raise UserError(str(e)) from None
    if not trust:
        from ratrain.program_format.build import built_beside
        from ratrain.programs import check_derived
        from ratrain.rt.program import stage_source
        sources = [stage_source(opened, s)[1] for s in range(opened.options.pp)]
        with built_beside(sources):  # NOTE [build beside the check]
            check_derived(program, manifest)  # NOTE [tables are derived]
    return manifest, ranks


# NOTE [build beside the check]: a directory this user's ratrain has not checked costs
# `ratrain run` one compile in memory (NOTE [tables are derived]; about 1.3 s for the
# tiny model here) before the ranks start and build the stages' code into the cache
# (about 4.2 s), so a cold run cost 5.3-5.8 s more than a warm one where the build alone
# had cost 4.0-4.4 s (2026-11-28, 3 repetitions). The launcher now builds the code the
# tables render (the same sources the ranks would build, from tables already checked in
# form, two at a time as `compile --build` does: one at a time, a pp 2 cold run cost 8.3-
# 8.7 s more than a warm one, against 4.4 s) in a thread while the compile runs, and
# kills the compilers if the directory is refused, so a refused directory leaves nothing
# in the cache and is refused as soon as before. A build is keyed by its source, so the ranks then find it built; a start refused
# after the check (bad weights to start from) leaves those modules in the cache, as the
# ranks' build would have, and nothing else (NOTE [a failed start is undone]).


def add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a compiled program directory on MPI ranks",
                       description="Start `mpiexec -n N python -m ratrain.rt DIR` with the "
                       "training options below and return its exit code.")
    p.add_argument("program", metavar="DIR", help="program directory from `ratrain compile`")
    p.add_argument("-n", "--ranks", type=int, default=None, metavar="N", help="MPI ranks to "
                   "start; must equal the program's pp x dp (default: the program's)")
    p.add_argument("--cluster", default=None, metavar="NAME", help="run on the nodes of "
                   "the test cluster NAME, in their network namespaces, over their shaped "
                   "links (`ratrain cluster up`; made for this run, a node per rank or per "
                   "--hosts entry, and removed after it if not up; needs root)")
    p.add_argument("--hosts", default=None, metavar="H1,H2,...", help="run on these hosts, "
                   "N / hosts consecutive ranks on each (mpiexec -hosts; started over ssh, "
                   "or on the nodes of --cluster, given as their 10.213.0.x addresses)")
    p.add_argument("--hostfile", default=None, metavar="FILE", help="as --hosts, one host "
                   "per line (`host` or mpiexec's `host:count`; # comments)")
    add_training_options(p)
    p.set_defaults(func=cmd_run)


def check_checkpoint_options(args, save_dir_given: bool = True) -> None:
    """--steps, --save-every, --keep-last, the runtime's numbers and --resume, checked
    before anything is compiled or started (the runtime checks them again for `python -m
    ratrain.rt`); --resume becomes the checkpoint directory it names."""
    from ratrain.rt.checkpoint import find_resume_checkpoint
    from ratrain.rt.loggers import loggers_problem
    from ratrain.rt.train_options import check_run_length, check_run_numbers
    metrics = args.metrics if save_dir_given else "RUN/metrics.jsonl"  # train's default
    problem = check_run_length(args, save_dir_given) or check_run_numbers(args) or \
        loggers_problem(args.log_to, args.metrics or metrics)
    if problem is None and args.resume:
        try:
            args.resume = str(find_resume_checkpoint(args.resume))
        except ValueError as e:
            problem = str(e)
    if problem is not None:
        raise UserError(problem)


def check_save_dir_option(args) -> None:
    """--save-dir can be written (it is created: the last check before a run writes)."""
    from ratrain.rt.checkpoint import check_save_dir
    if args.save_dir and (problem := check_save_dir(args.save_dir)) is not None:
        raise UserError(problem)


# ---- ratrain train -----------------------------------------------------------------------------
# The checks of its inputs, the layout rules and the run directory: cli/train_inputs.py.

def compile_options(args, config: dict, layout, profile: dict):
    """CompileOptions of a train run on `profile`: the layout's, and every compile flag
    (compiler.FLAGS) train takes (the compile command's rules for unset ones)."""
    from ratrain.compiler import FLAGS, resolve_options
    flags = {f: getattr(args, f, None) for f in FLAGS}
    return resolve_options(config, profile, **flags | {
        "pp": layout.pp, "dp": layout.dp, "micro_batches": layout.micro_batches,
        "micro_batch_size": layout.micro_batch_size})


def compile_program(config: dict, name: str, options, hw: str, profile: dict):
    """Compile the model in memory on `profile` (read from `hw`, a name or path): (files,
    manifest_of) of its program directory, so that a program that does not fit is
    reported before anything is written."""
    from ratrain.compiler import compile_graph, trace_for
    from ratrain.hw.machine import Machine, profile_identity
    from ratrain.programs import build_manifest, program_files
    program, records = compile_graph(trace_for(config, name, options), options,
                                     profile=profile)
    hf_config = read_hf_config(name)
    # NOTE [recorded machine]
    machine = Machine(profile=profile_identity(hw)).record(profile)
    return program_files(program, records), \
        lambda h: build_manifest(program, records, profile, h, hf_config, machine)


def write_run(args, run_dir: Path, compiled, made: list[Path]) -> None:
    """run_dir/program and the run's record; on failure the token caches this start
    `made` are removed too (a failed start leaves nothing behind)."""
    from ratrain.cli.resume import write_run_record
    from ratrain.programs import write_program_dir
    try:
        write_program_dir(run_dir / "program", *compiled)
        write_run_record(run_dir, args)
    except OSError as e:
        for file in made:
            file.unlink(missing_ok=True)
        raise UserError(f"cannot write the run directory {run_dir}: {e.strerror or e}") \
            from None


def cmd_train(args) -> int:
    """A new run (every input checked, then compiled into a new run directory) or, with
    --resume RUN (or a checkpoint of RUN) and no other --out, RUN continued in place; run
    it (the runtime prints the progress, the loss plot and the summary)."""
    from ratrain.cli.resume import refuse_old_run_dir, run_of
    from ratrain.cli.train_inputs import check_from_scratch
    check_from_scratch(args)
    run = run_of(args.resume) if args.resume else None
    if run is not None and args.out is not None and Path(args.out).resolve() != run.resolve():
        run = None  # a new run in --out, starting from RUN's checkpoint
    elif args.resume and run is None:
        refuse_old_run_dir(args.resume)
    with TerminalLog() as log:  # RUN/train.log (NOTE [the run's log])
        return resume_run(args, run, log) if run is not None else start_run(args, log)


def start_run(args, log: TerminalLog) -> int:
    """Check every input, then compile, tokenize and write the run directory, in that
    order: nothing is written before every check passed."""
    from ratrain.cli.resume import check_start
    from ratrain.cli.train_inputs import (check_context, check_layout_numbers, check_run_dir,
                                          check_tokenizer_has_data, load_checked_model,
                                          model_source, model_tokenizer, resolve_layout,
                                          take_model_weights, weights_line)
    check_layout_numbers(args)
    config, name = load_checked_model(*model_source(args))
    own_tokenizer = model_tokenizer(args.model)
    if args.tokenizer is None and args.init_from is None:
        args.tokenizer = own_tokenizer
    check_tokenizer_has_data(args, own_tokenizer)
    model_weights = take_model_weights(args, config)
    cores = os.cpu_count() or 1
    layout = resolve_layout(args.pp, args.dp, args.micro_batches, args.global_batch, cores,
                            config["num_hidden_layers"] + 2)
    hw = default_hw()  # NOTE [this machine's profile]
    profile = load_hw(hw)
    options = compile_options(args, config, layout, profile)
    check_context(config, options.seq_len, args.allow_beyond_context)
    check_checkpoint_options(args, save_dir_given=False)
    check_start(args, config)
    run_dir = check_run_dir(args.out)
    check_save_dir_option(args)  # creates --save-dir: the last check
    if args.init_from and not args.resume:
        print(weights_line(args.init_from, config) +
              ("; --from-scratch would start from a seeded initialisation" if model_weights
               else ""),
              flush=True)
    print(f"compiling {name} for {options.world_size} ranks (pp {options.pp} x dp "
          f"{options.dp}, {options.micro_batches} micro-batches of {options.micro_batch_size} "
          f"x {options.seq_len} tokens)"
          f"{layout.cores_note(cores, layout.rank_threads(cores, os.environ))}", flush=True)
    print(peak_line(profile, hw, options), flush=True)
    started = time.perf_counter()
    compiled = compile_program(config, name, options, hw, profile)
    made = tokenize_data(args, config, options.seq_len)
    args.metrics = args.metrics or str(run_dir / "metrics.jsonl")
    args.save_dir = args.save_dir or str(run_dir / "checkpoints")
    existed = run_dir.exists()
    write_run(args, run_dir, compiled, made)
    log.open(run_dir / TRAIN_LOG)
    print(f"compiled into {run_dir}/program in {time.perf_counter() - started:.1f} s; "
          f"starting {options.world_size} ranks with mpiexec", flush=True)
    code = launch(run_dir / "program", options.world_size, args,
                  command_text(["ratrain", "train", "--resume", run_dir]))
    if code != 0 and not _has_trained(args):
        log.close()
        _undo_start(run_dir, existed, made)
    return code


def peak_line(profile: dict, hw: str, options) -> str:
    """`MFU against this machine's profile (...): 2 ranks x 94.5 GFLOP/s fp32 peak`."""
    from ratrain.sim.kernels import peak_flops
    from ratrain.sim.simulate import rank_profile
    rank = rank_profile(profile, options.world_size)
    return (f"MFU against {profile_label(profile, hw)}: {options.world_size} rank"
            f"{'s' * (options.world_size > 1)} x "
            f"{peak_flops(rank, options.precision) / 1e9:.1f} GFLOP/s {options.precision} peak")


# NOTE [a failed start is undone]: a new run whose job ends before it trained a step or
# saved a checkpoint (the ranks refused it at set-up, exit 2; a rank failed at set-up and
# aborted the job, exit 1; a rank died; a stop signal came first) has nothing to resume:
# the stop and lost-rank lines name no checkpoint then. What the start wrote is removed
# (_undo_start), so the same command runs again, where a left-behind RUN/program made it
# refuse with "already holds a run".


def _has_trained(args) -> bool:
    metrics = Path(args.metrics)
    return (metrics.is_file() and metrics.stat().st_size > 0) or \
        latest_checkpoint(args.save_dir) is not None


def _undo_start(run_dir: Path, existed: bool, made: list[Path]) -> None:
    """Remove what a failed start wrote (NOTE [a failed start is undone]): the program, the
    record, empty metrics and checkpoint folders, the token caches it made."""
    from ratrain.rt.train_options import RUN_RECORD
    shutil.rmtree(run_dir / "program", ignore_errors=True)
    for file in (run_dir / RUN_RECORD, run_dir / "metrics.jsonl", run_dir / TRAIN_LOG,
                 *made):
        file.unlink(missing_ok=True)
    for folder in (run_dir / "checkpoints", *(() if existed else (run_dir,))):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def resume_run(args, run: Path, log: TerminalLog) -> int:
    """RUN continued in place (NOTE [a run directory is the unit of work] in
    cli/resume.py): its program, recorded options and newest checkpoint."""
    from ratrain.cli.resume import (check_start, keep_metrics_until, recorded_steps,
                                    resumed_args, write_run_record)
    from ratrain.rt.train_options import schedule_change
    from ratrain.rt.load import SetupError, read_manifest
    old_steps = recorded_steps(run)
    start = resumed_args(args, run)
    try:
        manifest = read_manifest(run / "program")
    except SetupError as e:
        raise UserError(str(e)) from None
    config, seq_len = manifest["model"]["config"], manifest["options"]["seq_len"]
    check_checkpoint_options(args)
    check_start(args, config)
    step = _resumed_step(args)
    if step >= args.steps:
        raise UserError(f"{run} has reached step {step} of --steps {args.steps} already; "
                        "pass a larger --steps to train it further")
    check_save_dir_option(args)
    tokenize_data(args, config, seq_len)
    dropped = keep_metrics_until(Path(args.metrics), step)
    write_run_record(run, args, start)
    log.open(run / TRAIN_LOG)
    where = "its start (no checkpoint yet)" if args.resume == start["resume"] else \
        f"its checkpoint {args.resume}"
    print(f"resuming {run} from {where}: steps {step + 1}..{args.steps}"
          + (f"; {dropped} metrics records after step {step} dropped" if dropped else ""),
          flush=True)
    if old_steps is not None and (change := schedule_change(args, old_steps, step)):
        print(change, flush=True)
    return launch(run / "program", manifest["world_size"], args,
                  command_text(["ratrain", "train", "--resume", run]))


def _resumed_step(args) -> int:
    """The step the run continues after: its checkpoint's (0 from a seeded start)."""
    from ratrain.rt.checkpoint import STATE_FILE
    if not args.resume:
        return 0
    return int(json.loads((Path(args.resume) / STATE_FILE).read_text())["step"])


def tokenize_data(args, config: dict, seq_len: int) -> list[Path]:
    """Tokenize text --data/--eval-data into their caches here, once, before the ranks
    start (NOTE [tokenize once] in rt/data.py); the cache files made (none on failure)."""
    from ratrain.rt.data import DataError, prepare_text_data
    try:
        return prepare_text_data(args, config, seq_len)
    except DataError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"cannot read {e.filename}: {e.strerror}") from None


def add_train_parser(sub, model_help: str) -> None:
    from ratrain.cli.options import add_options
    p = sub.add_parser("train", help="compile a model and train it on MPI ranks in one "
                       "command", description="Compile MODEL (tiny by default) into a run "
                       "directory, start one MPI rank per core with mpiexec, print a progress "
                       "line per step and a summary. --resume RUN continues the run directory "
                       "RUN in place with the options it started with.")
    p.add_argument("--model", default="tiny", help=f"the model: {model_help}; a directory "
                   "holding weights (model.safetensors or a sharded index) is started from "
                   "them, unless --from-scratch (default: tiny)")
    add_options(p, "--from-scratch", "--allow-beyond-context")
    p.add_argument("--out", default=None, metavar="DIR", help="run directory for the program "
                   "and the metrics (default: runs/<timestamp>)")
    _add_layout_options(p)
    add_training_options(p)
    p.set_defaults(func=cmd_train)


def _add_layout_options(p) -> None:
    """The layout (NOTE [default layout]) and the compile policies; the profile is cpu."""
    from ratrain.cli.options import POLICY_FLAGS, add_options
    add_options(p, "--seq-len", "--global-batch", "--micro-batches", "--pp", "--dp",
                *POLICY_FLAGS)
