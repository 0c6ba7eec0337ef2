"""What a training job starts from (rt/run.prepare): the program, this rank's initial
weights, the batches, the held-out rows and the state a resumed run continues, built once
at set-up and passed to the training loop (rt/run.train), which only reads it.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ratrain.optim import LossScaler
from ratrain.rt.data import Batches
from ratrain.rt.evaluate import HeldOut
from ratrain.rt.metrics import Throughput


class Weights:
    """A rank's initial parameters and moments (None: fresh), handed to the executor once:
    after `take` the job holds no reference to them, so the arena's copy is the only one
    for the rest of the run (a stage's weights are not held twice)."""

    def __init__(self, params: dict, moments: dict | None):
        self._held = (params, moments)

    def take(self) -> tuple[dict, dict | None]:
        """(params, moments); requires: not taken before."""
        if self._held is None:
            raise RuntimeError("the initial weights were handed over already")
        held, self._held = self._held, None
        return held


@dataclass(frozen=True)
class Job:
    program: object                     # the RuntimeProgram (rt/load.open_program)
    weights: Weights                    # this rank's initial weights, taken once
    batches: Batches                    # the training rows, in the run's order
    held_out: HeldOut | None            # the --eval-data rows, None without them
    step: int                           # steps already trained (a resumed run's)
    data_order: dict                    # {"shuffle", "seed"} the rows are ordered by
    scaler: LossScaler                  # the loss scale the run starts from
    skipped_steps: int                  # steps a resumed run skipped (fp16 overflow)
    elapsed: float                      # seconds trained before (NOTE [elapsed across
                                        # resumes], rt/metrics.py)
    checkpoint: dict                    # what every checkpoint holds besides the weights
                                        # (rt/run.checkpoint_contents)
    throughput: Throughput              # the run's throughput terms (MFU), of the manifest
    resume: str | None                  # --resume resolved to its checkpoint directory

    def options(self, args: argparse.Namespace) -> argparse.Namespace:
        """`args` (the run's flags) with --resume as this job resolved it: a copy."""
        return with_resume(args, self.resume)


def with_resume(args: argparse.Namespace, resume: str | None) -> argparse.Namespace:
    """A copy of `args` whose --resume is `resume`; `args` is left alone."""
    return argparse.Namespace(**{**vars(args), "resume": resume})
