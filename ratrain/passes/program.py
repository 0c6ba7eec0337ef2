"""Program: the state the compiler passes thread through, from TrainGraph to per-rank code.

A pass takes a Program and returns a new one with one more part filled in (stages, tasks,
recovery choices, memory plan, lowered calls). Every DP replica of a stage runs that
stage's task list; ranks are numbered so that pipeline neighbours are adjacent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ratrain.ir.costs import LayerCost
from ratrain.ir.tasks import Schedule, format_schedule
from ratrain.ir.train_graph import TrainGraph

SCHEDULES = ("ratrain", "baseline")
RECOMPUTE_POLICIES = ("none", "full", "selective", "auto")
PRECISIONS = ("fp32", "fp16")


@dataclass(frozen=True)
class CompileOptions:
    pp: int = 1                         # pipeline stages
    dp: int = 1                         # data-parallel replicas of every stage
    micro_batches: int = 1              # M micro-batches per step
    micro_batch_size: int = 1           # sequences per micro-batch
    seq_len: int = 128                  # tokens per sequence
    schedule: str = "ratrain"           # "ratrain" (lifecycle scheduling) or "baseline"
    recompute: str = "none"             # activation recovery policy, RECOMPUTE_POLICIES
    zero: int = 0                       # ZeRO stage 0, 1 or 2 over the DP group
    budget: int | None = None           # usable bytes per rank; None = unlimited
    hw: str = "cpu"                     # hardware profile name
    precision: str = "fp32"             # "fp32" exact mode or "fp16" mixed precision
    clip: float | None = None           # global-norm gradient clipping; None = off
    stage_speeds: tuple[float, ...] | None = None  # relative speed per stage (hetero ranks)

    def __post_init__(self):
        _check_options(self)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp


def _check_options(o: CompileOptions) -> None:
    problems = [f"--{name} must be >= 1 (got {value})" for name, value in
                (("pp", o.pp), ("dp", o.dp), ("micro-batches", o.micro_batches),
                 ("micro-batch-size", o.micro_batch_size), ("seq-len", o.seq_len))
                if value < 1]
    if o.schedule not in SCHEDULES:
        problems.append(f"--schedule must be one of {', '.join(SCHEDULES)}")
    if o.recompute not in RECOMPUTE_POLICIES:
        problems.append(f"--recompute must be one of {', '.join(RECOMPUTE_POLICIES)}")
    if o.zero not in (0, 1, 2):
        problems.append(f"--zero must be 0, 1 or 2 (got {o.zero})")
    if o.precision not in PRECISIONS:
        problems.append(f"--precision must be one of {', '.join(PRECISIONS)}")
    if o.stage_speeds is not None and len(o.stage_speeds) != o.pp:
        problems.append(f"stage speeds give {len(o.stage_speeds)} values for {o.pp} stages")
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Program:
    graph: TrainGraph                   # traced model (layers, kinds, residuals)
    options: CompileOptions             # what the user asked for
    stages: tuple[tuple[int, ...], ...] = ()  # layer indices of each stage, in order
    tasks: Schedule = field(default_factory=dict)  # stage -> its tasks, in order
    recompute: dict = field(default_factory=dict)  # (layer, mb) -> "full"|"selective"
    memory: object | None = None        # MemoryPlan from plan_memory
    lowered: dict | None = None         # stage -> kernel calls, from lower

    def __post_init__(self):
        g, o = self.graph, self.options
        if (g.micro_batch_size, g.seq_len) != (o.micro_batch_size, o.seq_len):
            raise ValueError(f"the graph is traced for micro-batch {g.micro_batch_size} x "
                             f"{g.seq_len} tokens but the options ask for "
                             f"{o.micro_batch_size} x {o.seq_len}")

    def stage_of_layer(self, layer: int) -> int:
        for stage, layers in enumerate(self.stages):
            if layer in layers:
                return stage
        raise KeyError(f"layer {layer} is in no stage")

    def layer_cost(self, layer: int) -> LayerCost:
        return self.graph.kind_costs[self.graph.layers[layer].kind]

    def rank(self, stage: int, replica: int) -> int:
        """Rank of (stage, DP replica): replicas are blocks of `pp` consecutive ranks."""
        return replica * self.options.pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        return rank % self.options.pp, rank // self.options.pp

    def __str__(self) -> str:
        from ratrain.passes.printer import format_program
        return format_program(self)


def schedule_text(program: Program) -> str:
    """Per-stage task lists, one line per stage."""
    return format_schedule(program.tasks)
