"""partition_stages: exact optimum against brute force over all splits, memory estimate values.

The tiny preset (6 layers: embed, 4 decoders, head) is small enough to enumerate every
split; the brute force ranks splits by the pass's stated objective (slowest stage, then
heaviest stage, then earliest split), so it checks the tie-breaks too.
"""
import itertools

import pytest

from ratrain.models.trace import trace_model
from ratrain.models import get_config
from ratrain.passes.partition_stages import (PartitionError, format_bytes, partition_stages,
                                             stage_memory_estimate, stage_time_estimate)
from ratrain.passes.program import CompileOptions, Program

GiB = 2**30


@pytest.fixture(scope="module")
def tiny():
    return trace_model(get_config("tiny"), micro_batch_size=1, seq_len=128)


def all_splits(num_layers, num_stages):
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0,) + cuts + (num_layers,)
        yield tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))


def stage_peaks(program, stages):
    return [sum(stage_memory_estimate(program, s, layers).values())
            for s, layers in enumerate(stages)]


def split_key(program, stages):
    """The pass's objective: (slowest stage, heaviest stage, split) — min is the optimum."""
    slowest = max(stage_time_estimate(program, s, layers) for s, layers in enumerate(stages))
    return slowest, max(stage_peaks(program, stages)), stages


def brute_force(program):
    """Optimal split over all splits fitting the budget, or None if none fits."""
    budget = program.options.budget
    feasible = [stages for stages in all_splits(len(program.graph.layers), program.options.pp)
                if budget is None or max(stage_peaks(program, stages)) <= budget]
    return min(feasible, key=lambda stages: split_key(program, stages), default=None)


def assert_valid_split(program):
    stages, num_layers = program.stages, len(program.graph.layers)
    assert len(stages) == program.options.pp
    assert all(len(layers) >= 1 for layers in stages)
    assert [l for layers in stages for l in layers] == list(range(num_layers))
    assert program.graph.layers[stages[0][0]].kind == "embed"
    assert program.graph.layers[stages[-1][-1]].kind == "head"


@pytest.mark.parametrize("pp", range(1, 7))
def test_tiny_split_is_valid_and_optimal(tiny, pp):
    program = partition_stages(Program(tiny, CompileOptions(pp=pp, micro_batches=4)))
    assert_valid_split(program)
    assert program.stages == brute_force(program)


def test_tiny_known_splits(tiny):
    # embed ~0 FLOPs, decoder ~154 MFLOP, head ~17 MFLOP per micro-batch.
    split = {pp: partition_stages(Program(tiny, CompileOptions(pp=pp))).stages for pp in (2, 3)}
    assert split[2] == ((0, 1, 2), (3, 4, 5))
    assert split[3] == ((0, 1), (2, 3), (4, 5))


def test_fast_stage_takes_more_layers(tiny):
    even = partition_stages(Program(tiny, CompileOptions(pp=2)))
    hetero = partition_stages(Program(tiny, CompileOptions(pp=2, stage_speeds=(2.0, 1.0))))
    assert hetero.stages == ((0, 1, 2, 3), (4, 5))
    assert len(hetero.stages[0]) > len(even.stages[0])
    assert hetero.stages == brute_force(hetero)


def test_three_speeds_match_brute_force(tiny):
    program = partition_stages(Program(tiny, CompileOptions(pp=3, stage_speeds=(1.0, 3.0, 1.0))))
    assert program.stages == brute_force(program)
    assert len(program.stages[1]) == max(len(layers) for layers in program.stages)


def test_budget_forces_a_worse_balanced_split(tiny):
    # The fast stage 0 wants 3 decoders; a budget just below that stage's need caps it.
    options = dict(pp=2, micro_batches=4, stage_speeds=(2.0, 1.0), recompute="none")
    free = partition_stages(Program(tiny, CompileOptions(**options)))
    budget = max(stage_peaks(free, free.stages)) - 1
    program = partition_stages(Program(tiny, CompileOptions(budget=budget, **options)))
    assert free.stages == ((0, 1, 2, 3), (4, 5))
    assert program.stages == ((0, 1, 2), (3, 4, 5))
    assert max(stage_peaks(program, program.stages)) <= budget
    assert split_key(program, program.stages)[0] > split_key(free, free.stages)[0]
    assert program.stages == brute_force(program)


def test_impossible_budget_names_the_least_peak_and_breakdown(tiny):
    program = Program(tiny, CompileOptions(pp=2, dp=2, micro_batches=4, budget=2**20,
                                           recompute="none"))
    least = min(max(stage_peaks(program, stages)) for stages in all_splits(6, 2))
    with pytest.raises(PartitionError) as info:
        partition_stages(program)
    error = info.value
    assert error.peak == least and error.budget == 2**20
    assert error.breakdown == stage_memory_estimate(program, error.stage, error.layers)
    message = str(error)
    assert f"least achievable peak is {format_bytes(least)}" in message
    assert "budget of 1.00 MiB" in message
    for category in ("params", "optimizer", "views", "grads", "activations", "comm"):
        assert f"{category} {format_bytes(error.breakdown[category])}" in message
    assert "more stages" in message and "--zero 1" in message and "--recompute full" in message


def test_more_stages_than_layers_is_an_error(tiny):
    with pytest.raises(PartitionError, match="every stage needs at least one layer"):
        partition_stages(Program(tiny, CompileOptions(pp=7)))


def test_stage_memory_estimate_values(tiny):
    # tiny fp32, seq 128: embed 65,536 params (residual: 512 B of token ids), decoder 791,040
    # params (2,239,488 B residuals), hidden state 131,072 B. Stage 0 of 2 holds min(2, 4) = 2 mbs.
    zero1 = Program(tiny, CompileOptions(pp=2, dp=2, zero=1, micro_batches=4, recompute="none"))
    params = 65_536 + 791_040
    assert stage_memory_estimate(zero1, 0, (0, 1)) == {
        "params": 4 * params // 2, "optimizer": 8 * params // 2, "views": 4 * params,
        "grads": 4 * params, "activations": 2 * (512 + 2_239_488), "comm": 2 * 131_072}
    zero2_full = Program(tiny, CompileOptions(pp=2, dp=2, zero=2, micro_batches=4,
                                              recompute="full"))
    estimate = stage_memory_estimate(zero2_full, 0, (0, 1))
    assert estimate["grads"] == 4 * params // 2
    assert estimate["activations"] == 2 * (512 + 131_072) + 2_239_488
    assert stage_memory_estimate(zero2_full, 1, (5,))["comm"] == 8   # the head sends a loss


def test_llama2_70b_partitions_under_20_gib():
    graph = trace_model(get_config("llama2-70b"), micro_batch_size=1, seq_len=2048,
                        dtype="float16")
    options = dict(pp=16, dp=64, micro_batches=64, micro_batch_size=1, seq_len=2048,
                   budget=20 * GiB, recompute="full", precision="fp16")
    # ZeRO-1 keeps a full fp32 gradient: 5 decoders need ~17 GiB of it alone.
    with pytest.raises(PartitionError, match=r"--zero 2 \(this stage would need"):
        partition_stages(Program(graph, CompileOptions(zero=1, **options)))
    program = partition_stages(Program(graph, CompileOptions(zero=2, **options)))
    assert_valid_split(program)
    assert [len(layers) for layers in program.stages] == [6] + [5] * 14 + [6]
    assert max(stage_peaks(program, program.stages)) <= 20 * GiB
