"""`mpiexec -n <ranks> python -m ratrain.rt.eval_job DIR CHECKPOINT --data FILE`: the
held-out loss of a checkpoint's weights, computed as a training run's --eval-data is: the
program's forward tasks only (rt/evaluate.py, NOTE [held-out loss] in rt/executor.py) over
the same rows (evaluate.held_out_rows). `ratrain eval` (cli/evaluate.py) starts it after
tokenizing FILE (NOTE [tokenize once] in rt/data.py); rank 0 prints the one result line.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from ratrain.rt.threads import thread_environment


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ratrain.rt.eval_job", description="The "
                                "held-out loss of CHECKPOINT on FILE, run by program DIR's "
                                "forward tasks on pp x dp MPI ranks.")
    p.add_argument("program", metavar="DIR", help="program directory (program.json, ...)")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint directory")
    p.add_argument("--data", required=True, metavar="FILE", help="held-out text or .npy rows")
    p.add_argument("--eval-batches", type=int, default=4, metavar="K",
                   help="global batches of FILE, its first rows in file order")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="tokenizer directory (default: the checkpoint's)")
    return p


def prepare(args, world_size: int, rank: int):
    """(program, this rank's weights, the HeldOut rows), or a SetupError/DataError."""
    from ratrain import models
    from ratrain.rt.data import TextSettings, data_rows
    from ratrain.rt.evaluate import held_out_rows
    from ratrain.ir.vocab import base_name
    from ratrain.rt.load import SetupError, open_program
    from ratrain.rt.program import CodeError, stage_code
    _, program = open_program(args.program, world_size)
    stage = program.coords(rank)[0]
    try:
        stage_code(program, stage)
    except CodeError as e:
        raise SetupError(str(e)) from None
    names = {base_name(name) for layer in program.stages[stage]
             for name, _ in program.layer_params(layer)}
    try:
        params = models.load_pretrained(args.checkpoint, names)[1]
    except (OSError, ValueError, KeyError) as e:
        raise SetupError(f"cannot load {args.checkpoint}: {e}") from None
    o, config = program.options, program.graph.config
    text = TextSettings(config, args.tokenizer, init_from=args.checkpoint, build=False)
    rows = data_rows(args.data, "--data", o.seq_len + 1, text)
    global_batch = o.dp * o.micro_batches * o.micro_batch_size
    return program, params, held_out_rows(rows, global_batch, args.eval_batches)


def result_line(loss: float, held, seq_len: int, args) -> str:
    """What `ratrain eval` prints: loss, perplexity and what they were measured on."""
    rows = held.count * held.batches.global_batch
    return (f"loss {loss:.8g}, perplexity {math.exp(loss):.6g} over {rows} rows of {seq_len} "
            f"next tokens ({held.count} batches of {held.batches.global_batch}) of "
            f"{args.data}; checkpoint {args.checkpoint}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ratrain.rt import comm
    from ratrain.rt.data import DataError
    from ratrain.rt.load import SetupError
    from ratrain.rt.run import agreed_setup
    comms = comm.Communicators()
    job = agreed_setup(comms, lambda: prepare(args, comms.size, comms.rank),
                       (SetupError, DataError))
    return 2 if job is None else evaluate_job(args, comms, *job)


def evaluate_job(args, comms, program, params, held) -> int:
    """The forward-only pass over `held` with the checkpoint's weights; rank 0 prints."""
    from ratrain.rt import comm
    from ratrain.rt.evaluate import evaluate
    from ratrain.rt.executor import RankExecutor
    try:
        executor = RankExecutor(program, comms, params)
    except Exception as e:
        comm.abort_job(f"ratrain: rank {comms.rank} failed at set-up (arena and weights): "
                       f"{type(e).__name__}: {e}")
    loss = evaluate(executor, comms, held)
    executor.finish()
    if comms.rank == 0:
        print(result_line(loss, held, program.options.seq_len, args), flush=True)
    return 0


if __name__ == "__main__":
    # one thread pool per rank, its share of the cores (NOTE [threads per rank]), set
    # before numpy loads, as rt/__main__.py does for training
    os.environ.update(thread_environment(os.environ, os.cpu_count() or 1))
    sys.exit(main())
