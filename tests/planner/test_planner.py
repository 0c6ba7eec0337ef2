"""The planner on the tiny model: memory estimates against plan_memory, specific reasons
for infeasible candidates, ranking by simulated step time, and the smallest cluster
count checked by brute force."""
import re
from dataclasses import replace
from functools import lru_cache

import pytest


from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.passes.partition_stages import PartitionError, partition_stages
from ratrain.passes.pipeline import PIPELINE, run_pipeline
from ratrain.passes.plan_memory import MemoryBudgetError, plan_memory
from ratrain.passes.program import CompileOptions, Program
from ratrain.planner import Planner, Search
from ratrain.planner.candidates import layouts
from ratrain.planner.estimate import Estimator
from ratrain.planner.memory_estimate import stage_bytes, total
from ratrain.planner.screen import memory_key
from ratrain.sim import simulate

CPU = load_profile("cpu")
MB = 10**6
STAGE_REASON = re.compile(r"stage \d+ \(layers \d+-\d+; ranks? \d+")
CATEGORY = re.compile(r"(params|optimizer|views|grads|activations|comm|workspace) "
                      r"\d+\.\d\d [KMG]iB")


def search(budget: int, **changes) -> Search:
    return Search(models.get_config("tiny"), "tiny", 8, 32, CPU, budget, **changes)


@lru_cache(maxsize=None)
def planned(budget: int, clusters: int = 4, schedules=("ratrain",)):
    return Planner(search(budget, schedules=schedules)).plan(clusters)


def graph(micro_batch_size: int = 1):
    return trace_for(models.get_config("tiny"), "tiny", CompileOptions(
        micro_batch_size=micro_batch_size, seq_len=32))


# ---- the memory estimate ---------------------------------------------------------------

@pytest.mark.parametrize("level", ["none", "selective", "full"])
@pytest.mark.parametrize("layout", [dict(pp=1, micro_batches=4),
                                    dict(pp=2, dp=2, zero=2, micro_batches=4),
                                    dict(pp=2, dp=2, zero=2, micro_batches=4,
                                         grad_accum="scatter"),
                                    dict(pp=3, dp=2, zero=1, micro_batches=6),
                                    dict(pp=2, dp=2, zero=3, micro_batches=4),
                                    dict(pp=1, dp=2, zero=3, micro_batches=2,
                                         zero3_prefetch=0),
                                    dict(pp=4, micro_batches=8, micro_batch_size=2)])
def test_stage_estimate_bounds_plan_memorys_peak(layout, level):
    """The screen drops candidates on this estimate, so it must not exceed the real peak,
    and it must stay close to it to be of use."""
    layout = {"grad_accum": "local", **layout}
    options = CompileOptions(seq_len=32, recompute=level, **layout)
    program = partition_stages(Program(graph(options.micro_batch_size), options))
    compiled = run_pipeline(program, PIPELINE[1:] + [plan_memory], verify=False)[0]
    estimator = Estimator(CPU)
    local = options.grad_accum == "local"
    for stage, memory in compiled.memory.stages.items():
        estimate = total(stage_bytes(estimator, program, stage, level, local))
        # the estimate is the peak at a backward; since NOTE [fused gradient accumulation]
        # shrank B's workspace, the real peak can be at a forward or a SYNC instead (a
        # message or a gradient shard more): still a lower bound (the screen never drops
        # a candidate that fits), within 1%
        assert 0.99 * memory.peak_bytes <= estimate <= memory.peak_bytes


def test_fewer_micro_batches_have_the_same_peaks():
    """See NOTE [memory check]: min(M, pp) micro-batches stand for M in 1F1B."""
    arenas = []
    for micro_batches in (3, 9):
        options = CompileOptions(pp=3, micro_batches=micro_batches, seq_len=32,
                                 recompute="full")
        program = compile_graph(graph(), options)[0]
        arenas.append([m.arena_bytes for m in program.memory.stages.values()])
    assert arenas[0] == arenas[1]


# ---- infeasible candidates -----------------------------------------------------------------

def test_infeasible_reasons_name_the_stage_and_its_categories():
    """At 18 MB: pp 1 fails in partition_stages, pp 2 in every split, pp 4 only in the
    estimate of its one split."""
    plan = planned(18 * MB)
    infeasible = [r for r in plan.rows if not r.feasible]
    assert infeasible and all(r.step_time_s is None for r in infeasible)
    for row in infeasible:
        assert STAGE_REASON.search(row.reason) and CATEGORY.search(row.reason), row.reason
        assert re.search(r"needs (at least|about) \d+\.\d\d MiB > 17\.17 MiB", row.reason)
    # ZeRO-3's view slots are not in partition_stages' per-layer sums: its rows fail later
    roots = {r.pp: r.reason for r in infeasible
             if not r.reason.startswith("needs more") and r.zero < 3}
    assert roots[1].startswith("stage 0 (layers 0-5; ranks 0, 1, ...) needs at least")
    assert roots[2].startswith("no split into 2 stages fits: stage ")
    assert roots[4].startswith("estimated: stage ")


def test_dominated_candidates_cite_an_infeasible_one():
    """A candidate with more memory than an infeasible neighbour (lower ZeRO, larger
    micro-batch, a policy that recomputes less, the compiler's auto gradient accumulation
    rather than scatter) is out with that neighbour's reason."""
    rows = {memory_key(r.candidate): r for r in planned(22 * MB).rows}
    dominated = [r for r in rows.values() if r.reason and r.reason.startswith("needs more")]
    assert dominated
    for row in dominated:
        changes = re.match(r"needs more than with (.+?), which does not fit: ", row.reason)[1]
        root = row.candidate
        for change in changes.split(" and "):
            field, value = change.rsplit(" ", 1)
            field = {"micro-batch size": "micro_batch_size",
                     "gradient accumulation": "grad_accum"}.get(field, field)
            root = replace(root, **{field: value if field in ("recompute", "grad_accum")
                                    else int(value)})
        root_row = rows[memory_key(root)]
        assert not root_row.feasible and root_row.reason in row.reason


def test_a_candidate_that_fails_to_compile_is_infeasible_with_plan_memorys_reason(monkeypatch):
    """The screen passed it, plan_memory did not: its row and its other policies say so."""
    real = Planner._compile
    failing = planned(40 * MB).best.candidate

    def compile_one(planner, candidate, micro_batches, simulate=True):
        if candidate == failing:
            return "stage 1 needs an arena of 42.00 MiB (peak 41.00 MiB), over the budget"
        return real(planner, candidate, micro_batches, simulate)

    monkeypatch.setattr(Planner, "_compile", compile_one)
    plan = Planner(search(40 * MB)).plan(4)
    rows = {r.candidate: r for r in plan.rows}
    assert not rows[failing].feasible
    assert rows[failing].reason.startswith("stage 1 needs an arena of 42.00 MiB")
    # its other policies that the memory screen passed inherit plan_memory's reason
    inherited = [rows[replace(failing, recompute=p)] for p in ("none", "selective", "full")]
    inherited = [r for r in inherited if "estimated:" not in r.reason]
    assert inherited and all(r.reason == "needs more than with recompute auto, which does "
                             "not fit: " + rows[failing].reason for r in inherited)
    assert plan.best is not None and plan.best.candidate != failing


# ---- ranking -------------------------------------------------------------------------------

def test_rows_rank_by_simulated_step_time():
    plan = planned(30 * MB, schedules=("ratrain", "baseline"))
    simulated = [r for r in plan.rows if r.simulated]
    assert len(simulated) >= 2 and plan.rows[:len(simulated)] == tuple(simulated)
    assert [r.step_time_s for r in simulated] == sorted(r.step_time_s for r in simulated)
    assert plan.best == simulated[0]
    for row in simulated:  # what `ratrain compile --hw cpu` builds
        options = row.candidate.options(search(30 * MB))
        program = compile_graph(graph(row.micro_batch_size), options, profile=CPU)[0]
        step = simulate(program, CPU)
        assert (row.step_time_s, row.tokens_per_s, row.peak_bytes) == \
            (step.step_time, step.tokens_per_s, program.memory.peak_bytes)
    rest = plan.rows[len(simulated):]
    assert [r.feasible for r in rest] == sorted((r.feasible for r in rest), reverse=True)


def test_only_auto_candidates_are_simulated():
    """auto recomputes the least that fits, so no other policy of a configuration can
    beat it: the others are listed with their estimate only."""
    plan = planned(30 * MB)
    assert {r.recompute for r in plan.rows if r.simulated} == {"auto"}
    others = [r for r in plan.rows if r.feasible and r.recompute != "auto"]
    assert others and all(r.reason.startswith("not simulated: recompute auto recomputes no "
                                              "more here") for r in others)


# ---- the smallest cluster count ----------------------------------------------------------------

def least_memory_fits(pp: int, dp: int, budget: int) -> bool:
    """Does a least-memory candidate of a layout (full recompute, ZeRO 2 or 3, one
    sequence per micro-batch) compile within the budget?"""
    return any(_compiles(pp, dp, zero, budget) for zero in ((2, 3) if dp > 1 else (0,)))


def _compiles(pp: int, dp: int, zero: int, budget: int) -> bool:
    options = CompileOptions(pp=pp, dp=dp, micro_batches=8 // dp, seq_len=32,
                             recompute="full", zero=zero, budget=budget)
    try:
        run_pipeline(Program(graph(), options), PIPELINE + [plan_memory], verify=False)
    except (PartitionError, MemoryBudgetError):
        return False
    return True


@pytest.mark.parametrize("budget", [21 * MB, 26 * MB])
def test_smallest_cluster_count_matches_brute_force(budget):
    plan = Planner(search(budget)).smallest(16)
    assert plan.best is not None and plan.best.feasible
    assert plan.best.reason.startswith("not simulated: memory checked with")
    assert least_memory_fits(plan.best.pp, plan.best.dp, budget)
    smaller = [(pp, dp) for clusters in range(1, plan.clusters)
               for pp, dp in layouts(clusters, 8, 6)]
    assert smaller and not any(least_memory_fits(pp, dp, budget) for pp, dp in smaller)


def test_a_candidate_the_commit_rule_does_not_fit_falls_back_to_after_norm(
        after_norm_only_budget):
    """See NOTE [update rule fallback]: fp16 on one rank, a budget between the after-norm
    program's arena and the commit rule's (its undo copies): the planner keeps the
    candidate under after-norm, and the row compiles within the budget."""
    budget = after_norm_only_budget
    planner = Planner(Search(models.get_config("tiny"), "tiny", 8, 32, load_profile("cpu"),
                             budget, precision="fp16"))
    plan = planner.plan(1)
    assert plan.best is not None and plan.best.update_rule == "after-norm"
    assert plan.best.peak_bytes <= budget


def test_a_simulated_pipeline_has_its_zb1_twin_beside_it():
    """See NOTE [zb1 twins]: a pipelined candidate the planner simulates is simulated again
    under --pipeline-schedule zb1; the twin's row has its own compile's peak and step."""
    from ratrain.planner.candidates import Candidate
    seed = Candidate(2, 2, 0, 1, 4, "auto", "ratrain")
    plan = Planner(search(10**12)).plan(4, seeds=(seed,))
    rows = {r.pipeline_schedule: r for r in plan.rows if r.candidate in (seed, replace(
        seed, pipeline_schedule="zb1"))}
    assert set(rows) == {"1f1b", "zb1"} and rows["zb1"].simulated and rows["1f1b"].simulated
    assert rows["zb1"].peak_bytes >= rows["1f1b"].peak_bytes  # its W operands on top
    assert rows["zb1"].step_time_s != rows["1f1b"].step_time_s
    assert rows["zb1"].estimated_step_s is None and rows["zb1"].reason is None
    assert all(r.pipeline_schedule == "1f1b" for r in plan.rows if r.pp == 1)
    # the twin is the program `ratrain compile --hw cpu` builds: its W's ordered by the
    # profile's costs (sim.costs.bound_cost_model), not by unit costs
    twin = rows["zb1"].candidate
    program = compile_graph(graph(), twin.options(search(10**12)), profile=CPU)[0]
    assert rows["zb1"].step_time_s == simulate(program, CPU).step_time


def test_a_row_is_the_program_compile_builds_with_the_profiles_costs():
    """The passes that weigh time (where recovery runs, zb1's W order) weigh it in the
    profile's cost model when `ratrain compile --hw` builds a program, so the planner
    compiles with it too. Tiny pp 3 x dp 2 ZeRO-3 on mt3000, just above full recompute's
    arena: there the cost model, not the FLOPs, decides that stage 1 recovers in B
    (tests/passes/test_recovery_placement.py)."""
    from ratrain.planner.candidates import Candidate
    mt3000 = load_profile("mt3000")
    seed = Candidate(3, 2, 3, 2, 8, "auto", "ratrain")
    tiny = trace_for(models.get_config("tiny"), "tiny",
                     CompileOptions(micro_batch_size=2, seq_len=128))
    at = lambda budget: Search(models.get_config("tiny"), "tiny", 32, 128, mt3000, budget)
    arena = lambda recompute: compile_graph(tiny, replace(seed, recompute=recompute).options(
        at(10**12)))[0].memory.arena_bytes
    search = at(arena("full") + (arena("none") - arena("full")) // 10)
    row, = [r for r in Planner(search).plan(6, seeds=(seed,)).rows if r.candidate == seed]
    program = compile_graph(tiny, seed.options(search), profile=mt3000)[0]
    assert {s for s, _ in program.backward_recovery} == {1}
    assert row.simulated and row.step_time_s == simulate(program, mt3000).step_time
