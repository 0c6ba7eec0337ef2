"""The simulator against the dry run, the 1F1B bubble formula, plan_memory's peaks, and
overlap of DP collectives with compute."""
from dataclasses import replace
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.hw.topology import node_per_rank
from ratrain.ir.tasks import BACKWARDS, Kind, parse_schedule, parse_task
from ratrain.passes.layer_buffers import layer_param_count
from ratrain.passes.dryrun import dry_run
from ratrain.passes.plots import unit_cost
from ratrain.passes.program import CompileOptions
from ratrain.passes.schedule_1f1b import schedule_1f1b
from ratrain.sim import UnitCosts, replay, simulate
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.steps import Compute, Recv, Send, Start, Touch

CONFIGS = {
    "pp1": dict(pp=1),
    "pp2": dict(pp=2),
    "pp3-full": dict(pp=3, recompute="full"),
    "pp4-selective": dict(pp=4, recompute="selective"),
    "pp2-dp2-zero1-clip": dict(pp=2, dp=2, zero=1, clip=1.0),
    "pp3-dp2-zero2-scatter-fp16": dict(pp=3, dp=2, zero=2, grad_accum="scatter",
                                      precision="fp16", recompute="full"),
    "pp2-dp2-zero2-baseline": dict(pp=2, dp=2, zero=2, schedule="baseline"),
    "pp1-dp2-zero2-fp16": dict(pp=1, dp=2, zero=2, precision="fp16"),
    "pp1-dp2": dict(pp=1, dp=2),
    "tied-pp1": dict(model="tiny-tied", pp=1),
    "tied-pp2": dict(model="tiny-tied", pp=2),
    "tied-pp3-dp2-zero2-clip": dict(model="tiny-tied", pp=3, dp=2, zero=2, clip=1.0),
    "pp2-dp2-zero3": dict(pp=2, dp=2, zero=3),
    "pp1-dp2-zero3-at-use-fp16-full": dict(pp=1, dp=2, zero=3, zero3_prefetch=0,
                                           precision="fp16", recompute="full"),
    "tied-pp2-dp2-zero3-prefetch2": dict(model="tiny-tied", pp=2, dp=2, zero=3,
                                         zero3_prefetch=2),
}


@lru_cache(maxsize=None)
def compiled(name: str, micro_batches: int = 5):
    flags = dict(CONFIGS[name])
    model = flags.pop("model", "tiny")
    options = CompileOptions(micro_batches=micro_batches, micro_batch_size=2, seq_len=32,
                             **flags)
    graph = trace_for(models.get_config(model), model, options)
    return compile_graph(graph, options)[0]


def spans(result):
    return {rank: [(str(s.task), s.start, s.end) for s in row]
            for rank, row in result.spans.items()}


def dry_spans(result):
    return {rank: [(str(t.task), t.start, t.end) for t in row]
            for rank, row in result.timeline.items()}


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cost", [None, unit_cost], ids=["one-unit", "plot-units"])
def test_unit_costs_reproduce_the_dry_run_task_by_task(name, cost):
    program = compiled(name)
    expected = dry_run(program.tasks, cost)
    result = replay(program.tasks, UnitCosts(cost) if cost else UnitCosts())
    assert spans(result) == dry_spans(expected)
    assert result.step_time == expected.makespan


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 4, 7, 16])
def test_1f1b_bubble_on_equal_stages(stages, micro_batches):
    """F = 1, B = 2, messages free: (M + P - 1) (F + B) per step, 1F1B's bubble."""
    fb = lambda t: {Kind.F: 1.0, Kind.B: 2.0}.get(t.kind, 0.0)
    result = replay(schedule_1f1b(stages, micro_batches), UnitCosts(fb))
    assert result.step_time == 3 * (micro_batches + stages - 1)
    assert result.bubble_fraction == pytest.approx(
        (stages - 1) / (micro_batches + stages - 1), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", CONFIGS)
def test_memory_peaks_are_plan_memorys(name):
    program = compiled(name)
    sim = simulate(program, load_profile("mt3000"))
    assert sim.memory_peaks() == {program.rank(s, 0): m.peak_bytes
                                  for s, m in program.memory.stages.items()}


class _Table:
    """Steps per task text: a hand-written cost model."""

    def __init__(self, steps: dict):
        self.table = steps

    def steps(self, task):
        return self.table.get(str(task), (Compute(1.0),))


def _sync(layer, nbytes):
    return (Start((f"grad.L{layer}",), 0.0, nbytes, 0.0, f"sync L{layer}"),)


def _update(layer):
    return (Touch((f"grad.L{layer}",)), Compute(1.0))


OVERLAP = {"0SYNC[L1]": _sync(1, 2.0), "0SYNC[L0]": _sync(0, 2.0),
           "0UPD[L1]": _update(1), "0UPD[L0]": _update(0)}


@pytest.mark.parametrize("overlap, step", [(True, 6.0), (False, 7.0)])
def test_update_overlaps_the_next_layers_sync(overlap, step):
    """B 0-1; the syncs take 2 s each, one after the other on the DP channel (1-3, 3-5);
    overlapped, UPD[L1] runs 3-4 during SYNC[L0] and UPD[L0] 5-6; serialized 5-6, 6-7."""
    schedule = parse_schedule("rank 0: 0B0 0SYNC[L1] 0SYNC[L0] 0UPD[L1] 0UPD[L0]")
    result = replay(schedule, _Table(OVERLAP), bandwidth=1.0, overlap=overlap)
    assert result.step_time == step


SLOW_LINK = {"link_bandwidth": 2e8}


@pytest.mark.parametrize("name, at_most", [
    ("pp2-dp2-zero1-clip", 0.99),            # only all-gathers overlap updates: NORM waits
    ("pp2-dp2-zero2-baseline", 0.98),        # updates overlap the next layer's sync
    ("pp3-dp2-zero2-scatter-fp16", 0.85)])   # each micro-batch's scatter overlaps later B's
def test_overlapping_collectives_shortens_the_step(name, at_most):
    program = compiled(name)
    profile = node_per_rank(load_profile("mt3000") | SLOW_LINK)
    # one step alone: with overlap=False nothing is in flight at the step end either
    overlapped = simulate(program, profile, steady=False)
    serialized = simulate(program, profile, overlap=False, steady=False)
    assert overlapped.step_time < at_most * serialized.step_time


def test_steady_state_period_hides_the_view_gathers_behind_the_next_forwards():
    """See NOTE [steady state]: after a NORM the ratrain schedule gathers views in layer order
    and the next step's forwards start behind them, so a step of a run is shorter than a
    step timed alone; unit tests of the replay: a run of two steps minus one."""
    program = compiled("pp1-dp2-zero2-fp16")
    # gathers outlast casting
    profile = node_per_rank(load_profile("mt3000") | {"link_bandwidth": 1e9})
    alone, steady = simulate(program, profile, steady=False), simulate(program, profile)
    assert steady.replay.period is not None and alone.replay.period is None
    assert steady.step_time < 0.99 * alone.step_time
    assert steady.replay.ends == alone.replay.ends  # the drained step is reported as is


def expected_dp_bytes(program) -> float:
    """Per step and rank of replica 0, summed over stages: ZeRO-2 reduce-scatters each
    layer's fp32 gradient and all-gathers its fp32 master shards (padded to dp equal
    shards), a ring sending (n-1)/n of either."""
    n = program.options.dp
    total = 0.0
    for layers in program.stages:
        for layer in layers:
            params = layer_param_count(program, layer)
            total += (n - 1) / n * 4 * (params + -(-params // n) * n)
    return total


@pytest.mark.parametrize("dp", [2, 1024])
def test_dp_collectives_are_costed_from_the_dp_degree(dp):
    """Only the two ranks of replica 0 are replayed, however many replicas there are."""
    program = compiled_dp(dp)
    sim = simulate(program, load_profile("mt3000") | {"collective_algorithm": "ring"})
    assert set(sim.replay.spans) == {0, 1}
    sent = sum(i.nbytes for row in sim.replay.intervals.values() for i in row
               if i.lane == "port: dp")
    assert sent == pytest.approx(expected_dp_bytes(program), rel=1e-12)
    assert sim.tokens_per_step == dp * 2 * 2 * 32


@lru_cache(maxsize=None)
def compiled_dp(dp: int):
    options = CompileOptions(pp=2, dp=dp, zero=2, micro_batches=2, micro_batch_size=2,
                             seq_len=32)
    graph = trace_for(models.get_config("tiny"), "tiny", options)
    return compile_graph(graph, options)[0]


def test_rejects_an_uncompiled_program():
    with pytest.raises(ValueError, match="compiled program"):
        simulate(replace(compiled("pp2"), lowered=None), load_profile("mt3000"))


def test_stage_speeds_scale_compute():
    """A stage twice as fast (heterogeneous ranks) spends half the compute seconds."""
    program = compiled("pp2-dp2-zero2-baseline")
    fast = replace(program, options=replace(program.options, stage_speeds=(2.0, 1.0)))
    compute = lambda p, text: sum(s.seconds for s in ProfileCosts(p, load_profile("mt3000"))
                                  .steps(parse_task(text)) if isinstance(s, Compute))
    for text in ("0F1", "0B1", "0UPD[L1]"):
        assert compute(fast, text) == pytest.approx(compute(program, text) / 2, rel=1e-12)
    assert compute(fast, "1B1") == compute(program, "1B1") > 0


def one_micro_batch_dp2(schedule: str):
    options = CompileOptions(micro_batches=1, micro_batch_size=2, seq_len=32,
                             **dict(CONFIGS["pp1-dp2"], schedule=schedule))
    return compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]


@pytest.mark.parametrize("schedule", ["ratrain", "baseline"])
def test_ratrain_starts_each_sync_inside_the_last_backward(schedule):
    """See NOTE [sync issue point]: as the runtime does, SYNC[L] starts where the task list
    puts it, right after layer L's piece of the step's last B (ratrain), not after the
    whole B (baseline)."""
    program = one_micro_batch_dp2(schedule)
    replay = simulate(program, node_per_rank(load_profile("mt3000") | SLOW_LINK)).replay
    last_b = max(s.end for s in replay.spans[0] if s.task.kind in BACKWARDS)
    starts = [i.start for i in replay.intervals[0] if i.lane.startswith("port")
              and i.label.startswith("allreduce")]
    assert len(starts) == program.num_layers
    # the link carries one transfer at a time, so later ones queue behind the first
    assert (min(starts) < last_b) == (schedule == "ratrain")


def test_a_sync_moved_in_the_task_list_starts_where_it_now_stands():
    """See NOTE [sync issue point]: the list is the truth. The first SYNC, right after its
    layer's piece, starts its transfer before the pieces end; moved behind the last
    piece, after them. Nothing but its place in the list decides it."""
    program = one_micro_batch_dp2("ratrain")
    tasks = program.tasks[0]
    sync = next(t for t in tasks if t.kind == Kind.SYNC)
    after = max(i for i, t in enumerate(tasks) if t.kind == Kind.BL)
    assert tasks.index(sync) < after
    moved = [t for t in tasks[:after + 1] if t != sync] + [sync] + list(tasks[after + 1:])
    profile = node_per_rank(load_profile("mt3000") | SLOW_LINK)
    for order, early in ((tasks, True), (tuple(moved), False)):
        replay = simulate(replace(program, tasks={0: order}), profile).replay
        spans = {s.task: s for s in replay.spans[0]}
        start = min(i.start for i in replay.intervals[0] if i.lane.startswith("port")
                    and i.label == f"allreduce L{sync.layer}")
        assert start >= spans[sync].reached
        assert (start < spans[tasks[after]].end) == early


@pytest.mark.parametrize("name", ["pp2", "pp1-dp2", "pp2-dp2-zero1-clip"])
def test_link_host_cost_is_compute_per_byte_sent_or_received(name):
    """See NOTE [link host cost]: a profile's link_host_cost adds exactly that many compute
    seconds per byte a task sends (a message, or a collective's port bytes) or receives
    (a message, or as many as a collective sends), and nothing else."""
    program, host = compiled(name), 1e-9
    profile = load_profile("cpu")
    plain, costly = ProfileCosts(program, profile), \
        ProfileCosts(program, profile | {"link_host_cost": host})
    tasks = [t for stage in program.tasks.values() for t in stage]
    sent = {s.message: s.nbytes for t in tasks for s in plain.steps(t) if isinstance(s, Send)}
    total = 0.0
    for task in tasks:
        steps = costly.steps(task)
        moved = sum(2 * s.nbytes for s in steps if isinstance(s, Start)) + \
            sum(s.nbytes for s in steps if isinstance(s, Send)) + \
            sum(sent[s.message] for s in steps if isinstance(s, Recv))
        compute = [sum(s.seconds for s in c.steps(task) if isinstance(s, Compute))
                   for c in (plain, costly)]
        assert compute[1] - compute[0] == pytest.approx(host * moved, rel=1e-9, abs=1e-15)
        total += moved
    assert total > 0
