"""Per-step metrics on rank 0: one JSON line per step (step, loss, tokens/s, step seconds,
lr, gradient norm, loss scale and skipped steps; per rank the arena bytes, the measured and
planned arena peaks and resident memory; elapsed and remaining seconds, model FLOPs and MFU;
eval_loss on the steps that evaluated), the progress line and the run's one summary.
"""
from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass

from ratrain.rt.loggers import logged_scalars
from ratrain.units import format_bytes

# NOTE [model FLOPs and MFU]: as in PaLM, Megatron and torchtitan, MFU is the model FLOPs
# of a step over the step's seconds and the peak FLOP/s of all ranks. Model FLOPs are what
# the model needs, whatever the program runs to fit or to save memory: forward and
# backward of every layer, micro-batch and replica, counted as PaLM does as 3 x the
# forward (a product's backward is two products of its size), by the op rule tables on
# the traced graph (TrainGraph.micro_batch_flops). So no recompute counts: neither the
# forward again that --recompute runs nor what kernels redo inside their backward (the
# rules' bwd_flops, which the simulator times, include flash attention's second QK^T
# and the chunked cross-entropy's second logits). For a dense decoder this is
# 6 x non-embedding parameters (the head included) x tokens, plus attention's
# 12 x layers x heads x head-dim x visible (query, key) pairs per sequence (T(T+1)/2
# causal), plus a few percent of elementwise ops. The compiler records them with the peak
# (the profile's for the program's precision, per rank as the simulator takes it, times
# the world size) in program.json under "flops" (programs.step_flops): the runtime reads
# two numbers and traces nothing. The peak is the profile's the program was compiled on:
# `ratrain train`'s is this machine's (NOTE [this machine's profile]), and "peak_of"
# names it, which the summary prints.


# NOTE [elapsed across resumes]: elapsed_s counts the run's training time, not the job's:
# a checkpoint records the elapsed seconds at its step in trainer_state.json, and a job
# resumed from it counts on from there, so a run stopped and resumed three times reads
# as one clock in metrics.jsonl, the progress line and loss.png (steps after the
# checkpoint are trained again and dropped from the metrics, so their time is not
# counted twice). The ETA is this job's own mean step; the summary says both times.
# Checkpoints written before they recorded it resume at 0.


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
    elapsed_s: float = 0.0              # wall seconds the run has trained (NOTE [elapsed
                                        # across resumes])
    eta_s: float = 0.0                  # the steps left at the mean step time (clock())
    model_flops: int | None = None      # of one step (NOTE [model FLOPs and MFU]); None:
                                        # a program compiled before they were recorded
    mfu: float | None = None            # model_flops / step_seconds / peak of all ranks

    def progress_line(self, steps: int) -> str:
        line = f"step {self.step}/{steps}  loss {self.loss:.4f}"
        if self.eval_loss is not None:
            line += f"  eval loss {self.eval_loss:.4f}"
        line += f"  lr {self.lr:.3g}  {self.tokens_per_s:,.0f} tokens/s"
        if self.mfu is not None:
            line += f"  {flop_rate(self.model_flops / self.step_seconds)}  MFU {self.mfu:.1%}"
        line += (f"  mem {format_bytes(max(self.rss_bytes))}  elapsed {clock(self.elapsed_s)}"
                 f"  ETA {clock(self.eta_s)}")
        if self.grad_norm is not None:
            line += f"  grad norm {self.grad_norm:.3g}"
        if self.loss_scale is not None:
            line += f"  loss scale {self.loss_scale:g}"
        return line + ("  skipped (gradient overflow)" if self.skipped else "")


@dataclass(frozen=True)
class Throughput:
    model_flops: int                    # of one step (NOTE [model FLOPs and MFU])
    peak_flops: float                   # FLOP/s of all ranks at the program's precision
    peak_of: str = ""                   # the profile it is of (hw/identity.profile_label);
                                        # "": a program compiled before it was recorded

    @staticmethod
    def of_manifest(manifest: dict) -> Throughput | None:
        """The program's recorded "flops" (programs.step_flops); None if it has none."""
        flops = manifest.get("flops")
        return None if flops is None else \
            Throughput(flops["model_per_step"], flops["peak"], flops.get("peak_of", ""))

    def mfu(self, step_seconds: float) -> float:
        return self.model_flops / step_seconds / self.peak_flops


def clock(seconds: float) -> str:
    """Seconds to one decimal below a minute, then m:ss, and h:mm:ss from an hour on."""
    if seconds < 59.95:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def flop_rate(flops_per_s: float) -> str:
    """In TFLOP/s as the tools users know print it; GFLOP/s below one TFLOP/s."""
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:.2f} TFLOP/s"
    return f"{flops_per_s / 1e9:.2f} GFLOP/s"


class MetricsLog:
    """Appends StepMetrics as JSON lines (flushed every step); keeps them for the summary
    and times the job from its construction (made just before the first step)."""

    def __init__(self, path: str | None, steps: int, throughput: Throughput | None = None,
                 before: float = 0.0, loggers=()):
        self.path, self.total, self.throughput, self.steps = path, steps, throughput, []
        self.started, self.before, self.loggers = time.perf_counter(), before, list(loggers)
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def elapsed(self) -> float:
        """Seconds the run has trained: this job's so far and, resumed, the `before` its
        checkpoint recorded (NOTE [elapsed across resumes])."""
        return self.before + time.perf_counter() - self.started

    def clock(self, step: int) -> tuple[float, float]:
        """(elapsed, ETA) seconds at the end of `step`, the next to be written. The ETA
        takes the mean wall time of this job's steps after its first (which also builds
        and warms up), evaluations and checkpoints included."""
        elapsed = self.elapsed()
        if not self.steps:
            return elapsed, (elapsed - self.before) * (self.total - step)
        first = self.steps[0]
        per_step = (elapsed - first.elapsed_s) / (step - first.step)
        return elapsed, per_step * (self.total - step)

    def rate_fields(self, step_seconds: float) -> dict:
        """StepMetrics' model_flops and mfu of a step; none for a program without them."""
        if self.throughput is None:
            return {}
        return {"model_flops": self.throughput.model_flops,
                "mfu": self.throughput.mfu(step_seconds)}

    def write(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics)
        record = _record(metrics)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        for logger in self.loggers:  # --log-to (rt/loggers.py)
            logger.write(metrics.step, logged_scalars(record))

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()

    def summary(self) -> str:
        if not self.steps:
            return "no steps run"
        timed = self.steps[1:] or self.steps  # the first step pays for warm-up
        seconds = sum(s.step_seconds for s in timed) / len(timed)
        last = self.steps[-1]
        line = f"done: {len(self.steps)} steps in {clock(last.elapsed_s - self.before)}"
        if self.before:
            line += f" ({clock(last.elapsed_s)} since the run began)"
        line += f", final loss {last.loss:.4f} (first {self.steps[0].loss:.4f})"
        evaluated = [s for s in self.steps if s.eval_loss is not None]
        line += (f", eval loss {evaluated[-1].eval_loss:.4f} at step {evaluated[-1].step}"
                 if evaluated else "")
        line += f", {sum(s.tokens_per_s for s in timed) / len(timed):,.0f} tokens/s"
        if self.throughput is not None:
            against = f" against {self.throughput.peak_of}" if self.throughput.peak_of else ""
            line += (f", {flop_rate(self.throughput.model_flops / seconds)} (MFU "
                     f"{self.throughput.mfu(seconds):.1%}{against})")
        if last.loss_scale is not None:
            line += (f", {last.skipped_steps} skipped steps (gradient overflow), loss scale "
                     f"{last.loss_scale:g}")
        line += (f"; per rank (max) {format_bytes(max(max(s.rss_bytes) for s in self.steps))}"
                 f" resident, arena {format_bytes(max(last.arena_bytes))}")
        return line + (f"; metrics {self.path}" if self.path else "")


def _record(metrics: StepMetrics) -> dict:
    """The JSON line of a step: eval_loss only on the steps that evaluated."""
    record = asdict(metrics)
    if record["eval_loss"] is None:
        del record["eval_loss"]
    return record
