"""Program: the state the compiler passes thread through, from TrainGraph to per-rank code.

A pass takes a Program and returns a new one with one more part filled in (stages, tasks,
recovery choices, memory plan, lowered calls). Every DP replica of a stage runs that
stage's task list; the options' placement numbers the ranks (NOTE [placement]).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from ratrain.ir.costs import LayerCost
from ratrain.ir.tasks import Schedule
from ratrain.ir.train_graph import TrainGraph
from ratrain.ir.vocab import embed_layers, vocab_layers
from ratrain.program_format.options import CompileOptions  # noqa: F401  (re-exported)


@lru_cache(maxsize=64)
def _stage_by_layer(stages: tuple[tuple[int, ...], ...]) -> dict[int, int]:
    """layer -> its stage; memory passes ask it per (layer, micro-batch)."""
    return {layer: stage for stage, layers in enumerate(stages) for layer in layers}


@dataclass(frozen=True)
class Program:
    graph: TrainGraph                   # traced model (layers, kinds, residuals)
    options: CompileOptions             # what the user asked for
    stages: tuple[tuple[int, ...], ...] = ()  # layer indices of each stage, in order
    tasks: Schedule = field(default_factory=dict)  # stage -> its tasks, in order
    recompute: dict = field(default_factory=dict)  # (layer, mb) -> "full"|"selective"
    backward_recovery: frozenset = frozenset()  # (stage, mb) whose B rebuilds (ratrain)
    scatter_grads: frozenset = frozenset()  # layers reduce-scattered after every B (ZeRO-2)
    memory: object | None = None        # MemoryPlan from plan_memory
    lowered: dict | None = None         # stage -> kernel calls, from lower
    built_micro_batches: int | None = None  # micro-batches the task lists hold, if fewer
                                        # than options.micro_batches: an instance of the
                                        # step (NOTE [periodic steps], sim/periodic.py)
    cost_model: Callable | None = field(default=None, compare=False)  # program -> (task ->
                                        # seconds) on the hardware compiled for
                                        # (sim.costs.bound_cost_model); None: unit costs.
                                        # partition_stages balances stages, zb1 places
                                        # W's and auto recompute weighs where recovery
                                        # runs by it
    periods: dict | None = None         # stage -> StagePeriod of a periodic program, whose
                                        # stages may come from different instances (NOTE
                                        # [periodic programs], passes/periodic_program.py)

    def __post_init__(self):
        g, o = self.graph, self.options
        if (g.micro_batch_size, g.seq_len) != (o.micro_batch_size, o.seq_len):
            raise ValueError(f"the graph is traced for micro-batch {g.micro_batch_size} x "
                             f"{g.seq_len} tokens but the options ask for "
                             f"{o.micro_batch_size} x {o.seq_len}")
        split = (len(vocab_layers(g)), len(embed_layers(g)))
        asked = (o.pp if o.splits_head else 0, o.pp if o.splits_embedding else 0)
        if split != asked:
            raise ValueError(f"the graph's head and embedding are split into {split} row "
                             f"shards but the options ask for {asked} (trace it with "
                             "compiler.trace_for; NOTE [vocabulary-parallel head])")

    def stage_of_layer(self, layer: int) -> int:
        """The stage holding the layer (a row shard of the head or the embedding: NOTE
        [vocabulary-parallel head])."""
        for shards in (vocab_layers(self.graph), embed_layers(self.graph)):
            if layer in shards:
                return shards.index(layer)
        stage = _stage_by_layer(self.stages).get(layer)
        if stage is None:
            raise KeyError(f"layer {layer} is in no stage")
        return stage

    def layer_cost(self, layer: int) -> LayerCost:
        return self.graph.kind_costs[self.graph.layers[layer].kind]

    def rank(self, stage: int, replica: int) -> int:
        """Rank of (stage, DP replica) under the options' placement (NOTE [placement],
        program_format/placement.py; pipeline-major by default: rank = replica x pp + stage)."""
        return self.options.rank_placement.rank(stage, replica)

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        return self.options.rank_placement.coords(rank)

    @property
    def micro_batches(self) -> int:
        """Micro-batches the task lists run: options.micro_batches, or the instance's
        built_micro_batches. Passes enumerate these; constants of the step (the loss
        cotangent 1/M) keep options.micro_batches."""
        return self.built_micro_batches or self.options.micro_batches

    @property
    def num_layers(self) -> int:
        return len(self.graph.layers)

    def state_slots(self, layer: int) -> tuple:
        """master, m, v slots of a layer, its full and shard sizes (lower.state_slots)."""
        from ratrain.passes.lower_state import state_slots
        return state_slots(self, layer)

    def view_slots(self, layer: int) -> tuple:
        from ratrain.passes.lower_state import view_slots
        return view_slots(self, layer)

    def layer_params(self, layer: int) -> tuple:
        """(HF name, shape) of a layer's parameters in flattening order."""
        spec = self.graph.layers[layer]
        return tuple((n, tuple(p.shape)) for n, p in
                     zip(spec.param_names, self.graph.kinds[spec.kind].fwd.params))

    def __str__(self) -> str:
        from ratrain.passes.printer import format_program
        return format_program(self)
