"""insert_recovery's auto in ratrain mode: where recovery runs (NOTE [where recovery runs]).

Under a tight budget a forward-side REC, which keeps a micro-batch's rebuilt layers
alive through its B, can need more recompute than recovering in B; auto then leaves
micro-batches to B and moves the last ones to the forward side where they fit.
"""
from dataclasses import replace
from functools import lru_cache

from ratrain import models
from ratrain.compiler import trace_for

from ratrain.ir.tasks import Kind
from ratrain.passes.layer_buffers import recovers_in_backward
from ratrain.passes.residuals import recompute_flops
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.printer import format_program
from ratrain.passes.program import CompileOptions, Program
from test_compiled_semantics import B, T, assert_matches_reference, graph

PP, M = 2, 4


@lru_cache(maxsize=None)
def compiled(schedule: str, recompute: str, budget: int | None = None):
    options = CompileOptions(pp=PP, micro_batches=M, micro_batch_size=B, seq_len=T,
                             schedule=schedule, recompute=recompute, budget=budget)
    return run_pipeline(Program(graph(), options))[0]


def flops(program) -> int:
    return sum(recompute_flops(program, l, m) for l, m in program.recompute)


def rec_micro_batches(program, stage: int) -> set[int]:
    return {t.micro_batch for t in program.tasks[stage] if t.kind == Kind.REC}


def budgets():
    """Arena sizes from B-time full recompute's up to forward-side full recompute's."""
    low = compiled("baseline", "full").memory.arena_bytes
    high = compiled("ratrain", "full").memory.arena_bytes
    assert low < high, "forward-side recovery must need more memory on this model"
    return range(low, high + 1, max(1, (high - low) // 16))


def test_tight_budget_recovers_in_backward_with_no_more_recompute_than_baseline():
    budget = compiled("baseline", "full").memory.arena_bytes
    ratrain, baseline = compiled("ratrain", "auto", budget), compiled("baseline", "auto", budget)
    assert ratrain.memory.arena_bytes <= budget
    assert ratrain.backward_recovery == {(0, m) for m in range(M)}
    assert rec_micro_batches(ratrain, 0) == set()
    assert flops(ratrain) == flops(baseline) > 0
    assert "recovered in B: 0.mb0 0.mb1 0.mb2 0.mb3" in format_program(ratrain)


def mixed():
    """The auto programs whose stage 0 recovers some micro-batches in B, some not."""
    programs = [p for p in (compiled("ratrain", "auto", b) for b in budgets())
                if 0 < len(p.backward_recovery) < M]
    assert programs, "some budget must split stage 0 between the two placements"
    return programs


def test_last_micro_batches_move_to_the_forward_side_where_they_fit():
    for program in mixed():
        assert program.memory.arena_bytes <= program.options.budget
        in_b = {m for s, m in program.backward_recovery if s == 0}
        forward = set(range(M)) - in_b
        assert forward == set(range(min(forward), M)), "the moved ones are the last ones"
        dropped = {m for l, m in program.recompute if l in program.stages[0]}
        assert rec_micro_batches(program, 0) == forward & dropped
        assert all(recovers_in_backward(program, 0, m) == (m in in_b) for m in range(M))
        baseline = compiled("baseline", "auto", program.options.budget)
        assert flops(program) <= flops(baseline)


def test_roomy_budget_keeps_forward_side_recovery():
    high = compiled("ratrain", "full").memory.arena_bytes
    program = compiled("ratrain", "auto", high + (high >> 4))
    assert program.recompute and not program.backward_recovery
    assert rec_micro_batches(program, 0) == {m for l, m in program.recompute
                                             if l in program.stages[0]}


def test_mixed_placement_computes_the_whole_model():
    program = mixed()[0]
    assert rec_micro_batches(program, 0), "some REC must run on the forward side"
    assert_matches_reference(program, 1, M)


def test_where_recovery_runs_repeats_with_the_micro_batches():
    """See NOTE [where recovery runs]: its two searches end inside a micro-batch, so a tie
    between them must not be broken by where they end, or a stage recovers in B at one
    micro-batch count and on the forward side at the next, and instances of a periodic
    step (NOTE [periodic steps]) stop repeating. Tiny, pp 3 on mt3000, under budgets from
    full recompute's arena to no recompute's, in instances of 6 to 8 micro-batches."""
    options = CompileOptions(pp=3, micro_batches=32, seq_len=128, hw="mt3000")
    model = trace_for(models.get_config("tiny"), "tiny", replace(options, micro_batches=1))
    instance = lambda opts, n: run_pipeline(Program(model, opts, built_micro_batches=n),
                                            verify=False, record=False)[0]
    low = instance(replace(options, recompute="full"), 6).memory.arena_bytes
    high = instance(replace(options, recompute="none"), 6).memory.arena_bytes
    for budget in range(low, high, (high - low) // 12):
        auto = replace(options, recompute="auto", budget=budget)
        in_b = [{s for s, _ in instance(auto, n).backward_recovery} for n in (6, 7, 8)]
        assert in_b[0] == in_b[1] == in_b[2], f"budget {budget}: stages recovering in B {in_b}"


def test_forward_side_recovery_pays_its_zero3_gathers():
    """See NOTE [where recovery runs]: under ZeRO-3 a REC apart from its B gathers its layer's
    view once more. Tiny, pp 3 x dp 2 on mt3000, just above full recompute's arena:
    recompute FLOPs alone send stage 1 to the forward side; with mt3000's cost model bound
    (as `ratrain compile` binds it) the gathers keep it in B, and that step simulates
    shorter."""
    from functools import partial

    from ratrain.hw import load_profile
    from ratrain.sim import simulate
    from ratrain.sim.costs import task_cost_model
    mt3000 = load_profile("mt3000")
    options = CompileOptions(pp=3, dp=2, zero=3, micro_batches=8, micro_batch_size=2,
                             seq_len=128, hw="mt3000")
    model = trace_for(models.get_config("tiny"), "tiny", replace(options, micro_batches=1))
    run = lambda opts, costs=None: run_pipeline(Program(model, opts, cost_model=costs))[0]
    low = run(replace(options, recompute="full")).memory.arena_bytes
    high = run(replace(options, recompute="none")).memory.arena_bytes
    auto = replace(options, recompute="auto", budget=low + (high - low) // 10)
    by_flops = run(auto)
    by_cost = run(auto, partial(task_cost_model, profile=mt3000))
    assert not by_flops.backward_recovery
    assert {s for s, _ in by_cost.backward_recovery} == {1}
    assert simulate(by_cost, mt3000).step_time < simulate(by_flops, mt3000).step_time
