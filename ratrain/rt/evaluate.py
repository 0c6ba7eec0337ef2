"""Held-out evaluation during a run: which steps evaluate, the held-out batches, and the
mean next-token loss over them, computed by the program's forward tasks only
(RankExecutor.run_forward, NOTE [held-out loss] in rt/executor.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ratrain.rt.data import Batches, data_rows


@dataclass(frozen=True)
class HeldOut:
    batches: Batches                    # the held-out rows in file order, global batches
    count: int                          # global batches per evaluation
    every: int                          # evaluate after every N steps (0: last step only)


def check_eval_options(args) -> None:
    """A ValueError naming the flag if the evaluation flags do not go together."""
    if args.eval_every < 0 or args.eval_batches < 1:
        raise ValueError(f"--eval-every must be 0 or more and --eval-batches 1 or more, got "
                         f"{args.eval_every} and {args.eval_batches}")
    if args.eval_data is None and args.eval_every:
        raise ValueError(f"--eval-every {args.eval_every} needs --eval-data FILE, the "
                         "held-out text to evaluate on")


def held_out(args, row_len: int, global_batch: int, text) -> HeldOut | None:
    """The --eval-data set of a run (None without one); a DataError or ValueError (the
    flags) otherwise."""
    check_eval_options(args)
    if args.eval_data is None:
        return None
    rows = data_rows(args.eval_data, "--eval-data", row_len, text)
    return held_out_rows(rows, global_batch, args.eval_batches, args.eval_every)


def held_out_rows(rows: np.ndarray, global_batch: int, batches: int, every: int = 0) -> HeldOut:
    """The held-out set of `rows` in file order: its first `batches` global batches, fewer
    if it has fewer rows (the last one wrapping to the first rows, as Batches.step does).
    A run's --eval-data and `ratrain eval` both take their rows here."""
    count = min(batches, -(-len(rows) // global_batch))
    return HeldOut(Batches(rows, global_batch, shuffle=False, seed=0), count, every)


def due(held: HeldOut | None, step: int, last_step: int) -> bool:
    """Evaluate after 1-based `step`? After every `every` steps and after the last one."""
    return held is not None and (step == last_step or held.every > 0 and step % held.every == 0)


def evaluate(executor, comms, held: HeldOut) -> float | None:
    """The mean loss over all ranks' held-out micro-batches, on rank 0 (None elsewhere).
    Micro-batches hold equally many tokens, so this is the mean next-token loss of the
    held-out rows. Any error aborts the job with the rank and task."""
    losses = []
    for k in range(held.count):
        losses += _forward(executor, held.batches.step(k))
    gathered = comms.gather_to_root(losses)
    if comms.rank != 0:
        return None
    return float(np.mean([loss for rank in gathered for loss in rank]))


def _forward(executor, tokens: np.ndarray) -> list[float]:
    from ratrain.rt import comm
    try:
        return executor.run_forward(tokens)
    except KeyboardInterrupt:
        comm.abort_job(f"ratrain: rank {executor.comms.rank} interrupted while evaluating")
    except Exception as e:
        task, call = executor.position
        comm.abort_job(f"ratrain: rank {executor.comms.rank} failed evaluating at task {task} "
                       f"(call {getattr(call, 'op', '-')}): {type(e).__name__}: {e}")
