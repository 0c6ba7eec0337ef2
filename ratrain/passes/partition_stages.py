"""partition_stages: split the model's layers into `pp` contiguous pipeline stages.

The first pass: runs on a traced Program before schedule_1f1b. A Program that already
holds stages (a program directory's recorded split, rebuilt by compiler.recompile) keeps
them: NOTE [a recorded split is kept].
Balances per-stage compute time (seconds on the program's profile, else FLOPs, over the
stage speed) under a per-rank memory estimate
that follows the 1F1B in-flight rule (DESIGN.md §5-6); plan_memory later computes the
exact peak. `stage_memory_estimate` is the estimate other passes and the planner reuse.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ratrain.ir.vocab import is_vocab_parallel, pipeline_layer_count
from ratrain.passes.program import Program
from ratrain.program_format.shards import shard_size
from ratrain.units import format_bytes

STATE_CATEGORIES = ("params", "optimizer", "views", "grads")   # per layer, step-long
MEMORY_CATEGORIES = STATE_CATEGORIES + ("activations", "comm")


class PartitionError(ValueError):
    """No split of the layers into stages fits the per-rank memory budget."""

    def __init__(self, message: str, *, peak: int = 0, budget: int | None = None,
                 stage: int = 0, layers: tuple[int, ...] = (),
                 breakdown: dict[str, int] | None = None):
        super().__init__(message)
        self.peak = peak                # least memory any split needs on its worst stage
        self.budget = budget            # the budget it was checked against
        self.stage = stage              # that worst stage, in the least-memory split
        self.layers = layers            # its layers
        self.breakdown = breakdown or {}  # its stage_memory_estimate


def partition_stages(program: Program) -> Program:
    """Assign every layer to one of `options.pp` pipeline stages.

    Requires: program.graph traced; 1 <= options.pp <= number of layers.
    Guarantees: `stages` is a tuple of pp non-empty tuples of consecutive layer indices
    covering all layers in order (embedding in stage 0, head in the last stage); the
    split minimises the slowest stage's time (stage_time_estimate: fwd + bwd seconds of
    the program's cost model, else FLOPs, over the stage speed)
    among splits whose every stage_memory_estimate fits `options.budget`; ties go to the
    least memory on the heaviest stage, then to the lexicographically earliest split.
    Raises PartitionError (with the least achievable peak and its breakdown) otherwise.
    """
    num_layers, num_stages = pipeline_layer_count(program.graph), program.options.pp
    if program.stages:
        _check_recorded_split(program.stages, num_layers, num_stages)
        return program
    if num_stages > num_layers:
        raise PartitionError(f"cannot split {num_layers} layers into {num_stages} stages: "
                             f"every stage needs at least one layer (use --pp <= {num_layers})")
    table = _SplitTable(program)
    bounds = _best_split(program, table)
    stages = tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))
    return replace(program, stages=stages)


# NOTE [a recorded split is kept]: a program directory records the split it was compiled
# with (program.json "stages"), and everything rebuilt from it (`ratrain simulate DIR`,
# `--against`, `calibrate --from`, the pictures) must be that program, not a fresh split.
# The split is a function of the profile's costs (NOTE [a compute task's seconds]), so a
# directory compiled before the costs changed, or on another profile, would otherwise
# recompile to other stages: its traces then name tasks its rebuilt stages do not run.
# So partition_stages keeps stages a Program arrives with, after checking they are a
# split of this model into options.pp stages; the memory fit was checked when the
# directory was compiled, and plan_memory checks the exact peak again.

def _check_recorded_split(stages, num_layers: int, num_stages: int):
    if len(stages) != num_stages or any(not s for s in stages) or \
            [l for s in stages for l in s] != list(range(num_layers)):
        raise PartitionError(f"the recorded split {[list(s) for s in stages]} is not "
                             f"{num_stages} non-empty stages of layers 0..{num_layers - 1} "
                             "in order; recompile the program")


# ---------------------------------------------------------------- per-stage estimates

def in_flight_micro_batches(program: Program, stage_index: int) -> int:
    """Micro-batches of activations stage s holds at once: min(P - s, M), or min(P + 1 -
    s, M) under --vocab-parallel, whose shards act as one more stage.

    See NOTE [1F1B warm-up count] in schedule_1f1b, NOTE [vocabulary-parallel schedule].
    """
    return min(pipeline_depth(program) - stage_index, program.micro_batches)


def pipeline_depth(program: Program) -> int:
    """Stages a micro-batch passes through: pp, and the vocabulary shards' turn under
    --vocab-parallel (NOTE [vocabulary-parallel schedule], passes/schedule_vocab.py)."""
    return program.options.pp + int(is_vocab_parallel(program))


def stage_time_estimate(program: Program, stage_index: int, layers) -> float:
    """What the split balances for `layers` on stage `stage_index`: one micro-batch's
    forward and backward over the stage's speed (_layer_passes' unit)."""
    return sum(_layer_passes(program)[l] for l in layers) / _stage_speeds(program)[stage_index]


def _layer_passes(program: Program) -> list[float]:
    """Per layer, one micro-batch's F and B at speed 1: seconds on the program's profile
    where it has a cost model (the kernels the simulator charges, NOTE [a compute task's
    seconds], sim/task_seconds.py), else FLOPs."""
    layers = range(pipeline_layer_count(program.graph))
    if program.cost_model is not None:
        layer_pass = program.cost_model(program).layer_pass
        return [layer_pass(l) for l in layers]
    return [float(program.layer_cost(l).fwd_flops + program.layer_cost(l).bwd_flops)
            for l in layers]


def stage_memory_estimate(program: Program, stage_index: int, layers) -> dict[str, int]:
    """Bytes per rank of stage `stage_index` holding `layers`, by MEMORY_CATEGORIES.

    Step-long state per layer (fp32 master, Adam m and v, compute-dtype view, fp32
    gradient; ZeRO shards over DP), activations of min(P - s, M) micro-batches in
    flight, and one send plus one receive buffer of the stage's output.
    """
    layers = tuple(layers)
    terms = [_layer_memory_terms(program, l) for l in layers]
    estimate = {c: sum(t[c] for t in terms) for c in STATE_CATEGORIES}
    per_micro_batch = sum(t["activations"] for t in terms)
    estimate["activations"] = (in_flight_micro_batches(program, stage_index) * per_micro_batch
                               + _recompute_workspace(program, layers))
    estimate["comm"] = 2 * program.layer_cost(layers[-1]).output_bytes
    return estimate


def _layer_memory_terms(program: Program, layer: int) -> dict[str, int]:
    """Additive bytes of one layer: step-long state, and activations of ONE micro-batch."""
    options, cost = program.options, program.layer_cost(layer)
    num_params = cost.param_bytes // np.dtype(program.graph.dtype).itemsize
    return {"params": _shard(program, 4 * num_params, options.zero >= 1),
            "optimizer": _shard(program, 8 * num_params, options.zero >= 1),
            "views": 0 if options.zero == 3 else cost.param_bytes,  # ZeRO-3: a ring per stage
            "grads": _shard(program, 4 * num_params, options.zero >= 2),
            "activations": _kept_activation_bytes(program, layer)}


def _shard(program: Program, nbytes: int, sharded: bool) -> int:
    """This rank's part of a per-layer buffer: 1/D of it (rounded up) when ZeRO shards it."""
    return shard_size(nbytes, program.options.dp) if sharded else nbytes


def _kept_activation_bytes(program: Program, layer: int) -> int:
    """Bytes one micro-batch leaves alive from F to B in `layer`.

    All residuals, or under full recompute only the layer's input: the previous layer's
    output (hidden state); the embedding's input is the token ids, which are its residual.
    `auto` may recompute as much as `full`, so a split is feasible if `full` makes it fit.
    """
    if program.options.recompute not in ("full", "auto") or layer == 0:
        return program.layer_cost(layer).residual_bytes
    return program.layer_cost(layer - 1).output_bytes


def _recompute_workspace(program: Program, layers: tuple[int, ...]) -> int:
    """Under full recompute, one layer's residuals are rebuilt at a time: the largest, once."""
    if program.options.recompute not in ("full", "auto"):
        return 0
    return max(program.layer_cost(l).residual_bytes for l in layers)


def _stage_speeds(program: Program) -> tuple[float, ...]:
    return program.options.stage_speeds or (1.0,) * program.options.pp


# ---------------------------------------------------------------- the split search

class _SplitTable:
    """Time and memory of every candidate stage, as (P, L+1, L+1) arrays indexed
    [stage, first layer, end layer): the segment is layers first..end-1.

    Memory is held as float64, exact for byte counts below 2**53; the entries are built
    from the same per-layer terms as stage_memory_estimate, so the two agree exactly.
    """

    def __init__(self, program: Program):
        num_layers, num_stages = pipeline_layer_count(program.graph), program.options.pp
        costs = [program.layer_cost(l) for l in range(num_layers)]
        terms = [_layer_memory_terms(program, l) for l in range(num_layers)]
        passes = _segment_float_sums(_layer_passes(program))
        speeds = np.asarray(_stage_speeds(program), dtype=np.float64)
        self.time = passes[None, :, :] / speeds[:, None, None]
        self.memory = _segment_memory(program, costs, terms)
        nonempty = np.triu(np.ones((num_layers + 1,) * 2, dtype=bool), k=1)
        self.valid = np.broadcast_to(nonempty, (num_stages,) + nonempty.shape)


def _segment_memory(program: Program, costs, terms) -> np.ndarray:
    """memory[s, i, j] = sum(stage_memory_estimate(program, s, range(i, j)).values())."""
    static = _segment_sums([sum(t[c] for c in STATE_CATEGORIES) for t in terms])
    per_micro_batch = _segment_sums([t["activations"] for t in terms])
    workspace = (_segment_max([c.residual_bytes for c in costs])
                 if program.options.recompute == "full" else np.zeros_like(static))
    comm = np.array([0] + [2 * c.output_bytes for c in costs], dtype=np.float64)
    in_flight = np.array([in_flight_micro_batches(program, s)
                          for s in range(program.options.pp)], dtype=np.float64)
    return (static + workspace + comm[None, :])[None] + in_flight[:, None, None] * per_micro_batch


def _segment_sums(values) -> np.ndarray:
    """sums[i, j] = sum(values[i:j]) (exact integer sums, then float64)."""
    prefix = np.concatenate([[0], np.cumsum(np.asarray(values, dtype=np.int64))])
    return (prefix[None, :] - prefix[:, None]).astype(np.float64)


def _segment_float_sums(values) -> np.ndarray:
    """sums[i, j] = sum(values[i:j]), each row summed from its first layer on, so equal
    runs of layers sum to equal floats wherever they start (FLOPs stay exact below 2**53)."""
    values = np.asarray(values, dtype=np.float64)
    sums = np.zeros((len(values) + 1,) * 2)
    for first in range(len(values)):
        sums[first, first + 1:] = np.cumsum(values[first:])
    return sums


def _segment_max(values) -> np.ndarray:
    """maxima[i, j] = max(values[i:j]) for i < j, else 0."""
    values = np.asarray(values, dtype=np.float64)
    maxima = np.zeros((len(values) + 1,) * 2)
    for first in range(len(values)):
        maxima[first, first + 1:] = np.maximum.accumulate(values[first:])
    return maxima


# NOTE [partition DP]:
# best[s][j] = the least possible max over stages 0..s of w(stage) when stages 0..s
# cover layers [0, j):  best[0][j] = w(0, 0, j);
#   best[s][j] = min over s <= i < j of max(best[s-1][i], w(s, i, j)),
# over allowed segments only; the answer is best[P-1][L]. O(P L^2), vectorised over (i, j).
# The objective is lexicographic (slowest stage, then heaviest stage, then earliest
# split), and a lexicographic min of component-wise maxima does not decompose (a prefix
# that is faster but heavier can lose after the next stage), so it runs in phases:
# T* = min max time over splits that fit the budget; then Mem* = min max memory over
# splits that fit and whose every stage takes <= T*; then the earliest split whose stages
# all satisfy both bounds, found greedily against a suffix-feasibility table. Times and
# memories are compared as the very floats the table holds, so `<= T*` is exact.
def _min_bottleneck(weights: np.ndarray, allowed: np.ndarray) -> float:
    """min over splits using only allowed segments of the max segment weight (inf if none)."""
    best = np.where(allowed[0, 0], weights[0, 0], np.inf)
    for stage in range(1, weights.shape[0]):
        candidates = np.maximum(best[:, None], weights[stage])
        best = np.where(allowed[stage], candidates, np.inf).min(axis=0)
    return float(best[-1])


def _earliest_split(allowed: np.ndarray) -> list[int]:
    """Stage boundaries [0, b1, ..., L] of the lexicographically earliest allowed split."""
    num_stages, num_layers = allowed.shape[0], allowed.shape[1] - 1
    completes = np.zeros((num_stages + 1, num_layers + 1), dtype=bool)
    completes[num_stages, num_layers] = True    # completes[s][i]: [i, L) fits stages s..P-1
    for stage in reversed(range(num_stages)):
        completes[stage] = (allowed[stage] & completes[stage + 1][None, :]).any(axis=1)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(int(np.argmax(allowed[stage, bounds[-1]] & completes[stage + 1])))
    return bounds


def _best_split(program: Program, table: _SplitTable) -> list[int]:
    """Boundaries of the optimal split (NOTE [partition DP]); PartitionError if none fits."""
    budget = program.options.budget
    fits = table.valid & (table.memory <= (np.inf if budget is None else budget))
    slowest = _min_bottleneck(table.time, fits)
    if slowest == np.inf:
        raise _over_budget_error(program, table)
    fast_enough = fits & (table.time <= slowest)
    heaviest = _min_bottleneck(table.memory, fast_enough)
    return _earliest_split(fast_enough & (table.memory <= heaviest))


# ---------------------------------------------------------------- when nothing fits

def _least_memory_split(program: Program, table: _SplitTable) -> tuple[int, int, list[int]]:
    """(least achievable peak, its heaviest stage, boundaries of the earliest such split)."""
    peak = _min_bottleneck(table.memory, table.valid)
    bounds = _earliest_split(table.valid & (table.memory <= peak))
    stage_peaks = [table.memory[s, a, b] for s, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return int(peak), int(np.argmax(stage_peaks)), bounds


def _over_budget_error(program: Program, table: _SplitTable) -> PartitionError:
    options = program.options
    peak, stage, bounds = _least_memory_split(program, table)
    layers = tuple(range(bounds[stage], bounds[stage + 1]))
    breakdown = stage_memory_estimate(program, stage, layers)
    message = (
        f"no split of {pipeline_layer_count(program.graph)} layers into {options.pp} stages fits the "
        f"budget of {format_bytes(options.budget)} per rank: the least achievable peak is "
        f"{format_bytes(peak)}, on stage {stage} (layers {layers[0]}-{layers[-1]}, "
        f"{in_flight_micro_batches(program, stage)} micro-batches in flight): "
        + ", ".join(f"{c} {format_bytes(breakdown[c])}" for c in MEMORY_CATEGORIES)
        + ". To fit: " + "; ".join(_fixes(program, stage, layers)))
    return PartitionError(message, peak=peak, budget=options.budget, stage=stage,
                          layers=layers, breakdown=breakdown)


def _fixes(program: Program, stage: int, layers: tuple[int, ...]) -> list[str]:
    """Changes that lower the heaviest stage, each with what that stage would then need."""
    options, fixes = program.options, [_more_stages_fix(program)]
    changes = [(f"--zero {z}", {"zero": z}) for z in range(options.zero + 1, 4) if options.dp > 1]
    if options.recompute != "full":
        changes.append(("--recompute full", {"recompute": "full"}))
    in_flight = _fewest_needed_in_flight(program, stage, layers)
    if in_flight < in_flight_micro_batches(program, stage):
        changes.append((f"fewer micro-batches in flight (--micro-batches {in_flight})",
                        {"micro_batches": in_flight}))
    for flag, change in changes:
        need = _stage_need(replace(program, options=replace(options, **change)), stage, layers)
        fixes.append(f"{flag} (this stage would need {format_bytes(need)})")
    return fixes


def _fewest_needed_in_flight(program: Program, stage: int, layers: tuple[int, ...]) -> int:
    """Most micro-batches in flight with which this stage fits (1 if even that does not)."""
    for in_flight in reversed(range(2, in_flight_micro_batches(program, stage))):
        fewer = replace(program, options=replace(program.options, micro_batches=in_flight))
        if _stage_need(fewer, stage, layers) <= program.options.budget:
            return in_flight
    return 1


def _stage_need(program: Program, stage: int, layers: tuple[int, ...]) -> int:
    return sum(stage_memory_estimate(program, stage, layers).values())


def _more_stages_fix(program: Program) -> str:
    """The smallest --pp (same other options) whose least-memory split fits, if any."""
    options, num_layers = program.options, pipeline_layer_count(program.graph)
    if is_vocab_parallel(program):  # each --pp has its own shards: not tried here
        return "more stages"
    for pp in range(options.pp + 1, num_layers + 1):
        table = _SplitTable(replace(program, options=replace(options, pp=pp, stage_speeds=None)))
        if _min_bottleneck(table.memory, table.valid) <= options.budget:
            return f"more stages (--pp {pp} fits)"
    return f"more stages would not suffice (even --pp {num_layers}, one layer per stage)"

