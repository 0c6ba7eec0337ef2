"""Per-step metrics on rank 0: one JSON line per step (step, loss, tokens/s, step seconds,
lr, gradient norm, loss scale and skipped steps; per rank the arena bytes, the measured and
planned arena peaks and resident memory; eval_loss on the steps that evaluated), the
progress line and the run's summary.
"""
from __future__ import annotations

import json
import os
import resource
from dataclasses import asdict, dataclass


def rss_bytes() -> int:
    """This process's resident memory now (peak if /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class StepMetrics:
    step: int                           # 1-based
    loss: float                         # mean over all micro-batches of the step
    tokens_per_s: float                 # global batch tokens / step seconds
    step_seconds: float                 # wall time of the step on rank 0, loss gathered
    lr: float                           # learning rate of the step
    arena_bytes: list                   # planned (and allocated) arena per rank
    rss_bytes: list                     # resident memory per rank after the step
    grad_norm: float | None = None      # global norm before clipping; None: not computed
                                        # (no --clip, fp32) or not finite (skipped step)
    loss_scale: float | None = None     # the scale of this step's gradients; None: fp32
    skipped: bool = False               # a gradient overflowed: no update this step
    skipped_steps: int = 0              # skipped so far in the run, this step included
    arena_peak_bytes: list = ()         # per rank: most bytes of live buffers, measured
    planned_peak_bytes: list = ()       # per rank: plan_memory's peak
    eval_loss: float | None = None      # held-out loss after this step; None: not evaluated

    def progress_line(self, steps: int) -> str:
        line = (f"step {self.step}/{steps}  loss {self.loss:.4f}  "
                f"{self.tokens_per_s:,.0f} tokens/s  lr {self.lr:.3g}")
        if self.grad_norm is not None:
            line += f"  grad norm {self.grad_norm:.3g}"
        if self.loss_scale is not None:
            line += f"  loss scale {self.loss_scale:g}"
        if self.eval_loss is not None:
            line += f"  eval loss {self.eval_loss:.4f}"
        return line + ("  skipped (gradient overflow)" if self.skipped else "")


class MetricsLog:
    """Appends StepMetrics as JSON lines (flushed every step); keeps them for the summary."""

    def __init__(self, path: str | None):
        self.path, self.steps = path, []
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(_record(metrics)) + "\n")

    def summary(self) -> str:
        if not self.steps:
            return "no steps run"
        timed = self.steps[1:] or self.steps  # the first step pays for warm-up
        rate = sum(s.tokens_per_s for s in timed) / len(timed)
        last = self.steps[-1]
        scaling = "" if last.loss_scale is None else (
            f", {last.skipped_steps} skipped steps (gradient overflow), loss scale "
            f"{last.loss_scale:g}")
        evaluated = [s.eval_loss for s in self.steps if s.eval_loss is not None]
        held_out = f", eval loss {evaluated[-1]:.4f}" if evaluated else ""
        return (f"done: {len(self.steps)} steps, final loss {last.loss:.4f} "
                f"(first {self.steps[0].loss:.4f}){held_out}, {rate:,.0f} tokens/s"
                f"{scaling}, arena "
                f"{max(last.arena_bytes) / 2 ** 20:.1f} MiB per rank (max)")


def _record(metrics: StepMetrics) -> dict:
    """The JSON line of a step: eval_loss only on the steps that evaluated."""
    record = asdict(metrics)
    if record["eval_loss"] is None:
        del record["eval_loss"]
    return record
