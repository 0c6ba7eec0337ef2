"""insert_recovery's auto in ratrain mode: where recovery runs (NOTE [where recovery runs]).

Under a tight budget a forward-side REC, which keeps a micro-batch's rebuilt layers
alive through its B, can need more recompute than recovering in B; auto then leaves
micro-batches to B and moves the last ones to the forward side where they fit.
"""
from functools import lru_cache

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
