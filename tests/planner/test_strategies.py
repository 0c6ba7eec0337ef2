"""The strategies of planner/strategies.py on the tiny model: each plan holds only the
candidates its strategy allows, each best is a real compile and simulation of its row,
and the comparison relates every best to ratrain's."""
from dataclasses import replace
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.planner import Planner, Search
from ratrain.planner.compare import compare_strategies, config_text, merged_plan
from ratrain.planner.strategies import STRATEGIES, Strategy
from ratrain.sim import simulate

CPU = load_profile("cpu")
MB = 10**6


def search(budget: int) -> Search:
    return Search(models.get_config("tiny"), "tiny", 8, 32, CPU, budget,
                  schedules=("ratrain", "baseline"))


@lru_cache(maxsize=None)
def compared(budget: int, clusters: int = 4):
    planner = Planner(search(budget))
    return planner, compare_strategies(planner, clusters)


def test_each_plan_holds_only_its_strategys_candidates():
    _, bests = compared(30 * MB)
    for best in bests:
        strategy = STRATEGIES[best.strategy]
        assert best.plan.strategy == best.strategy and best.plan.rows
        assert all(strategy.allows(r.candidate) for r in best.plan.rows), best.strategy
    schedules = {b.strategy: {r.schedule for r in b.plan.rows} for b in bests}
    assert schedules["ratrain"] == {"ratrain"} and schedules["tuned"] == {"baseline"}
    policies = {b.strategy: {r.recompute for r in b.plan.rows} for b in bests}
    assert policies["backward-checkpointing"] == {"full"} and policies["keep-all"] == {"none"}
    assert policies["tuned"] == {"auto", "full", "selective", "none"}


def test_a_strategys_best_is_its_simulated_program():
    """Every best row is what compiling and simulating its candidate gives, and the
    speedup is ratrain's tokens/s over it."""
    planner, bests = compared(30 * MB)
    ours = bests[0]
    assert ours.strategy == "ratrain" and ours.speedup == 1.0
    for best in bests:
        if best.row is None:
            continue
        options = best.row.candidate.options(planner.search)
        program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options),
                                options)[0]
        step = simulate(program, CPU)
        assert (best.row.step_time_s, best.row.peak_bytes) == \
            (step.step_time, program.memory.peak_bytes), best.strategy
        assert best.speedup == pytest.approx(ours.row.tokens_per_s / step.tokens_per_s)


def test_backward_checkpointing_recomputes_every_pair_at_backward_time():
    _, bests = compared(30 * MB)
    best = next(b for b in bests if b.strategy == "backward-checkpointing")
    pairs = 6 - 2  # the tiny model's decoders (6 layers with embedding and head)
    assert best.row.recompute == "full" and best.row.schedule == "baseline"
    assert best.note == (f"{pairs * best.row.micro_batches} of {pairs * best.row.micro_batches}"
                         f" (layer, micro-batch) pairs recomputed (full "
                         f"{pairs * best.row.micro_batches})")


def test_a_strategy_that_cannot_fit_says_what_comes_closest():
    """At 18 MB on 6 ranks keeping every activation fits no layout."""
    _, bests = compared(18 * MB, clusters=6)
    keep = next(b for b in bests if b.strategy == "keep-all")
    assert keep.row is None and keep.speedup is None
    assert keep.note.startswith("does not fit; closest: pp ") and "> 17.17 MiB" in keep.note
    assert next(b for b in bests if b.strategy == "ratrain").row is not None


def test_merged_plan_ranks_both_schedules_rows():
    _, bests = compared(30 * MB)
    plan = merged_plan(bests)
    simulated = [r for r in plan.rows if r.simulated]
    assert {r.schedule for r in simulated} == {"ratrain", "baseline"}
    assert [r.step_time_s for r in simulated] == sorted(r.step_time_s for r in simulated)
    assert plan.best == simulated[0] and plan.strategy is None
    by_name = {b.strategy: b for b in bests}
    assert plan.best.step_time_s == min(by_name["ratrain"].row.step_time_s,
                                        by_name["tuned"].row.step_time_s)
    assert len(plan.rows) == len(by_name["ratrain"].plan.rows) + len(by_name["tuned"].plan.rows)


def test_zero3_heavy_gathers_at_use():
    strategy = STRATEGIES["zero3-heavy"]
    planner = Planner(search(30 * MB))
    found = planner.candidates(4, strategy)
    assert found and all((c.zero, c.zero3_prefetch, c.schedule) == (3, 0, "baseline")
                         for c in found)
    assert found[0].options(planner.search).zero3_prefetch == 0


def test_strategy_filters_and_texts():
    tuned, keep = STRATEGIES["tuned"], STRATEGIES["keep-all"]
    assert (tuned.simulated_policy, keep.simulated_policy) == ("auto", "none")
    zero3 = Strategy("z", "baseline", ("auto",), (3,), zero3_prefetch=0)
    planner = Planner(search(30 * MB))
    moved = zero3.candidates(planner.candidates(4))
    assert moved and {(c.zero, c.zero3_prefetch, c.recompute, c.schedule) for c in moved} \
        == {(3, 0, "auto", "baseline")}
    assert all(c.dp > 1 for c in moved)
    assert {c.grad_accum for c in moved} == {"scatter", None}
    local = next(c for c in moved if c.grad_accum is None)
    scatter = replace(local, grad_accum="scatter")
    assert config_text(local).startswith(f"pp {local.pp} x dp {local.dp}, zero 3/at use, ")
    assert config_text(scatter).startswith(f"pp {local.pp} x dp {local.dp}, zero 3/at use, "
                                           "scatter, ")
    assert "zero 3 (gathers at use), " in str(local)
    assert "zero 3 (gathers at use; gradients reduce-scattered each micro-batch), " \
        in str(scatter)


def test_seeds_are_simulated_beside_the_best_by_estimate():
    """See NOTE [seeded search]: a seed that the estimate does not rank first is simulated
    too, and compare_strategies seeds ratrain's plan with the others' best configurations,
    so ratrain's best is at least as fast as each of theirs."""
    from dataclasses import replace as replaced
    planner = Planner(replaced(search(30 * MB), simulate=1))
    ratrain = STRATEGIES["ratrain"]
    plain = planner.plan(4, strategy=ratrain)
    assert sum(r.simulated for r in plain.rows) == 1
    seed = next(r.candidate for r in plain.rows
                if r.feasible and not r.simulated and r.recompute == "auto")
    seeded = planner.plan(4, strategy=ratrain, seeds=(seed,))
    rows = {r.candidate: r for r in seeded.rows}
    assert rows[seed].simulated and sum(r.simulated for r in seeded.rows) == 2
    _, bests = compared(30 * MB)
    ours = next(b for b in bests if b.strategy == "ratrain").row
    assert all(ours.tokens_per_s >= b.row.tokens_per_s for b in bests if b.row is not None)
