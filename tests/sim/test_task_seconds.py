"""See NOTE [a compute task's seconds]: the cost the passes weigh a compute task by (the
program's cost model, which partition_stages, zb1's W order and where recovery runs ask)
is what the simulator charges it: three compiled programs (1f1b, zb1, auto recompute)
and a baseline whose B's rebuild. "The simulator's charge" here is the sum of
ProfileCosts.call_charges over the task's IR calls (the kernels; its runtime calls need
arena slots the passes do not have yet) on the rank's profile (kernels.rank_profile),
which has no cold costs, so every call is charged warm."""
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.ir.tasks import Kind
from ratrain.passes.program import CompileOptions
from ratrain.sim.calls import ProfileCosts, is_kernel_call
from ratrain.sim.simulate import rank_profile
from ratrain.sim.task_seconds import COMPUTE_KINDS

CPU = load_profile("cpu")               # calibrated: two thread counts, measured op costs


class Asked:
    """A cost model that records the kinds of task the passes asked it about."""

    def __init__(self, profile: dict):
        from ratrain.sim.costs import task_cost_model
        self.profile, self.model, self.kinds = profile, task_cost_model, set()

    def __call__(self, program):
        costs = self.model(program, self.profile)
        asked = self

        class Recording:
            layer_pass = costs.layer_pass

            def __call__(self, task):
                asked.kinds.add(task.kind)
                return costs(task)

        self.kinds.add("layer_pass")
        return Recording()


def _options(**flags):
    return CompileOptions(pp=2, micro_batches=4, micro_batch_size=2, seq_len=32, **flags)


@lru_cache(maxsize=None)
def _graph():
    return trace_for(models.get_config("tiny"), "tiny", _options())


def _compile(profile=None, asked=None, **flags):
    from ratrain.passes.pipeline import run_pipeline
    from ratrain.passes.program import Program
    from ratrain.sim.costs import bound_cost_model
    if profile is None:  # as `ratrain compile --hw` builds it
        return compile_graph(_graph(), _options(**flags), expand=True)[0]
    return run_pipeline(Program(_graph(), _options(**flags),
                                cost_model=asked or bound_cost_model(profile)))[0]


def _auto_budget() -> int:
    """Between full and no recompute's arenas: auto recomputes some pairs."""
    low = _compile(recompute="full").memory.arena_bytes
    high = _compile(recompute="none").memory.arena_bytes
    return low + (high - low) // 10


PROGRAMS = {"1f1b": dict(stage_speeds=(1.0, 0.5)),
            "zb1": dict(pipeline_schedule="zb1"),
            "auto": dict(recompute="auto"),
            "in-B": dict(schedule="baseline", recompute="selective")}
ASKED = {"1f1b": {"layer_pass"}, "zb1": {"layer_pass", Kind.F, Kind.B, Kind.W},
         "auto": {"layer_pass", Kind.REC}, "in-B": {"layer_pass"}}


def _charge(costs: ProfileCosts, program, task) -> float:
    calls = program.lowered[task.stage]
    lowered = next(lt.calls for lt in calls if lt.task == task)
    return sum(seconds for call, (seconds, *_) in zip(lowered, costs.call_charges(task))
               if is_kernel_call(call))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_passes_weigh_each_compute_task_by_the_simulators_charge(name):
    flags = PROGRAMS[name] | ({"budget": _auto_budget()} if name == "auto" else {})
    asked = Asked(CPU)
    program = _compile(CPU, asked, **flags)
    assert ASKED[name] <= asked.kinds      # the passes asked the cost model
    rank = rank_profile(CPU, program.options.world_size)
    assert "op_costs_cold" not in rank and rank["rank_threads"]
    model, costs = program.cost_model(program), ProfileCosts(program, rank)
    tasks = [t for ts in program.tasks.values() for t in ts if t.kind in COMPUTE_KINDS]
    for task in tasks:
        assert model(task) == pytest.approx(_charge(costs, program, task), rel=1e-12), task
    kinds = {t.kind for t in tasks}
    assert {"1f1b": {Kind.F, Kind.B, Kind.BL}, "zb1": {Kind.W}, "auto": {Kind.REC},
            "in-B": {Kind.B}}[name] <= kinds
    if name == "in-B":  # every B rebuilds its layers (NOTE [backward-time recovery])
        assert program.recompute and Kind.REC not in kinds


def test_the_partition_balances_the_simulators_forward_and_backward():
    """partition_stages's per-layer time is one micro-batch's F and B as charged."""
    program = _compile(CPU, **PROGRAMS["1f1b"])
    model, costs = program.cost_model(program), ProfileCosts(program, rank_profile(CPU, 2))
    speeds = program.options.stage_speeds
    for stage, layers in enumerate(program.stages):
        f, b = (next(t for t in program.tasks[stage] if t.kind == kind and t.micro_batch == 0)
                for kind in (Kind.F, Kind.B))
        charged = _charge(costs, program, f) + _charge(costs, program, b)
        assert sum(model.layer_pass(l) for l in layers) / speeds[stage] == \
            pytest.approx(charged, rel=1e-12)


CHARGED = {Kind.S: "vocab_stats", Kind.T: "vocab_grad", Kind.E: "embed_rows",
           Kind.G: "embed_grad"}


def test_s_t_e_and_g_weigh_the_charges_of_their_shard_calls():
    """See NOTE [vocabulary-parallel head] and see NOTE [vocabulary-parallel embedding]: a
    stage's S and T cost what the simulator charges its vocab_stats and vocab_grad, the
    shard's cross-entropy forward and backward; its E and G what it charges embed_rows
    and embed_grad, the shard's embedding forward and backward."""
    from ratrain.passes.pipeline import run_pipeline
    from ratrain.passes.program import Program
    from ratrain.sim.costs import bound_cost_model
    options = _options(vocab_parallel="both")
    graph = trace_for(models.get_config("tiny"), "tiny", options)
    program = run_pipeline(Program(graph, options, cost_model=bound_cost_model(CPU)))[0]
    model, costs = program.cost_model(program), ProfileCosts(program, rank_profile(CPU, 2))
    tasks = [t for ts in program.tasks.values() for t in ts if t.kind in CHARGED]
    assert len(tasks) == 4 * 2 * 4       # one S, T, E and G per stage and micro-batch
    for task in tasks:
        lowered = next(lt.calls for lt in program.lowered[task.stage] if lt.task == task)
        charged = [seconds for call, (seconds, *_) in zip(lowered, costs.call_charges(task))
                   if call.op == CHARGED[task.kind]]
        assert len(charged) == 1 and model(task) == pytest.approx(charged[0], rel=1e-12), task
        assert model(task) > 0
