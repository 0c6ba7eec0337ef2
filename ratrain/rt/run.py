"""`python -m ratrain.rt DIR` under mpiexec: open and check the program, allocate the
arena, train for --steps and write metrics on rank 0.

Set-up errors (wrong world size, corrupted program, bad data) are agreed on by all ranks
and printed once as one line; any error while running aborts the whole job (no hang).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ratrain.rt.data import Batches, DataError, training_rows
from ratrain.rt.load import SetupError, open_program
from ratrain.rt.metrics import MetricsLog, StepMetrics, rss_bytes
from ratrain.rt.train_options import add_training_options, learning_rate, optimizer_at


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ratrain.rt", description="Run a program "
                                "directory written by `ratrain compile` on pp x dp MPI ranks "
                                "(start it with mpiexec -n <pp*dp>).")
    p.add_argument("program", metavar="DIR", help="program directory (program.json, ...)")
    add_training_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress line per step")
    return p


def initial_params(args, config: dict) -> dict:
    """Seeded initial weights, or those of --init-from, checked against the model."""
    from ratrain import models
    if args.init_from is None:
        return models.init_params(config, args.seed)
    try:
        _, params = models.load_pretrained(args.init_from)
    except (OSError, ValueError) as e:
        raise SetupError(f"cannot load --init-from {args.init_from}: {e}") from None
    for name, shape in models.param_shapes(config).items():
        if name not in params or tuple(params[name].shape) != tuple(shape):
            raise SetupError(f"--init-from {args.init_from} does not fit the program's model: "
                             f"{name} should be {list(shape)}")
    return params


def prepare(args, world_size: int):
    """(program, params, batches) of this job, or a SetupError."""
    from ratrain.cli import UserError
    try:
        manifest, program = open_program(args.program, world_size)
    except UserError as e:
        raise SetupError(str(e).splitlines()[0]) from None
    o, config = program.options, program.graph.config
    if o.precision != "fp32":
        raise SetupError(f"{args.program} is an {o.precision} program; the runtime runs fp32 "
                         "programs only for now: recompile with --precision fp32")
    try:
        rows = training_rows(args.data, o.seq_len, int(config["vocab_size"]))
    except DataError as e:
        raise SetupError(str(e)) from None
    batches = Batches(rows, o.dp * o.micro_batches * o.micro_batch_size,
                      not args.no_shuffle, args.seed)
    return program, initial_params(args, config), batches


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ratrain.rt import comm
    comms = comm.Communicators()
    job, error = None, None
    try:
        job = prepare(args, comms.size)
    except SetupError as e:
        error = str(e)
    except Exception as e:  # a bug, not a user error: say where and stop everyone
        comm.abort_job(f"ratrain: rank {comms.rank} failed at set-up: {type(e).__name__}: {e}")
    errors = comms.agree_on_errors(error)
    if errors:
        if comms.rank == 0:
            print(f"ratrain: error: {errors[0]}", file=sys.stderr)
        return 2
    train(args, comms, *job)
    return 0


def train(args, comms, program, params, batches) -> None:
    from ratrain.rt import comm
    from ratrain.rt.executor import RankExecutor
    executor = RankExecutor(program, comms, params)
    del params
    log = MetricsLog(args.metrics if comms.rank == 0 else None)
    tokens_per_step = batches.global_batch * program.options.seq_len
    for k in range(args.steps):
        start = time.perf_counter()
        try:
            losses = executor.run_step(batches.step(k), optimizer_at(args, k + 1))
        except Exception as e:
            task, call = executor.position
            where = f"{call.op}, {call.note}" if call is not None and call.note else \
                getattr(call, "op", "-")
            comm.abort_job(f"ratrain: rank {comms.rank} failed at task {task} (call {where}): "
                           f"{type(e).__name__}: {e}")
        gathered = comms.gather_to_root((losses, executor.arena_bytes, rss_bytes()))
        if comms.rank == 0:
            _log_step(args, log, k + 1, gathered, tokens_per_step, time.perf_counter() - start)
    executor.finish()
    if comms.rank == 0 and not args.quiet:
        print(log.summary(), flush=True)


def _log_step(args, log: MetricsLog, step: int, gathered, tokens: int, seconds: float):
    losses = [loss for rank_losses, _, _ in gathered for loss in rank_losses]
    metrics = StepMetrics(step, float(np.mean(losses)), tokens / seconds, seconds,
                          learning_rate(args, step), [g[1] for g in gathered],
                          [g[2] for g in gathered])
    log.write(metrics)
    if not args.quiet:
        print(metrics.progress_line(args.steps), flush=True)
