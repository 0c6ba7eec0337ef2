"""The one cost model (sim/costs.py): the dry run's task costs, the simulator's runtime
calls and the planner's estimate cost the same SYNC, UPD, PREF and NORM alike on one
profile, whichever collective algorithm the profile names; and the planned traffic of
ratrain/cluster counts the bytes the simulator puts on the port."""
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.cluster.volume import _call_bytes
from ratrain.hw import load_profile
from ratrain.hw.topology import node_per_rank
from ratrain.ir.tasks import Kind
from ratrain.passes import layer_buffers, lower_state
from ratrain.passes.layer_buffers import layer_param_count
from ratrain.passes.program import CompileOptions
from ratrain.planner import estimate as estimate_module
from ratrain.planner.estimate import Estimator, StagePlan, _StageModel
from ratrain.sim import costs as costs_module
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.costs import (collective_port_bytes, collective_seconds, dp_group,
                               norm_seconds, sync_seconds, task_cost_model, update_bytes)
from ratrain.sim.steps import Compute, Send, Start, TieSum, WorldSum

# mt3000 without measured op costs, its link slow enough that bytes matter; a large latency
# makes `tree` and `auto` differ from `ring` for the tiny model's gradients
MT3000 = node_per_rank(load_profile("mt3000") | {"link_bandwidth": 1e9, "op_costs": {}})
SLOW_START = {"link_latency": 1e-3}
ALGORITHMS = {"ring": MT3000 | {"collective_algorithm": "ring"},
              "tree": node_per_rank(MT3000 | {"collective_algorithm": "tree"} | SLOW_START),
              "auto": node_per_rank(MT3000 | {"collective_algorithm": "auto"} | SLOW_START)}


@lru_cache(maxsize=None)
def compiled(model="tiny", schedule="baseline", **flags):
    options = CompileOptions(micro_batches=2, micro_batch_size=2, seq_len=32,
                             schedule=schedule, **flags)
    return compile_graph(trace_for(models.get_config(model), model, options), options)[0]


def _task(program, text: str):
    return next(t for ts in program.tasks.values() for t in ts if str(t) == text)


def _started(costs: ProfileCosts, program, text: str) -> list[Start]:
    return [s for s in costs.steps(_task(program, text)) if isinstance(s, Start)]


def _computed(costs: ProfileCosts, program, text: str) -> float:
    """Compute seconds of a local task (its Touch waits cost nothing alone)."""
    steps = costs.steps(_task(program, text))
    assert not any(isinstance(s, (Start, Send, WorldSum)) for s in steps)
    return sum(s.seconds for s in steps if isinstance(s, Compute))


def _alone(profile: dict, start: Start) -> float:
    """Seconds of a simulator collective alone on the link: its bytes at the rate the
    node moves them (NOTE [node memory]), or at the link's bandwidth."""
    return start.latency + start.nbytes / (start.rate or profile["link_bandwidth"])


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("zero", [0, 2])
def test_sync_costs_the_same_in_dry_run_simulator_and_planner(algorithm, zero):
    profile, program = ALGORITHMS[algorithm], compiled(pp=2, dp=4, zero=zero)
    costs, dry_run = ProfileCosts(program, profile), task_cost_model(program, profile)
    stage, o = 1, program.options
    per_layer = []
    for layer in program.stages[stage]:
        (start,) = _started(costs, program, f"{stage}SYNC[L{layer}]")
        simulated = _alone(profile, start)
        assert dry_run(_task(program, f"{stage}SYNC[L{layer}]")) == pytest.approx(simulated, rel=1e-12)
        assert sync_seconds(profile, o, layer_param_count(program, layer)) == \
            pytest.approx(simulated, rel=1e-12)
        per_layer.append(simulated)
    plan = StagePlan(local_grads=True, level="none", lowered=0, need={})
    estimate = _StageModel(Estimator(profile), program, stage, plan)
    assert estimate.sync == pytest.approx(sum(per_layer), rel=1e-12)
    ring = collective_seconds(node_per_rank(ALGORITHMS["ring"] |
                                            {"link_latency": profile["link_latency"]}),
                              "reduce_scatter" if zero else "allreduce", 4,
                              4 * layer_param_count(program, program.stages[stage][0]),
                              group=dp_group(profile, o, stage))
    assert (per_layer[0] == pytest.approx(ring)) == (algorithm == "ring")  # the test can tell


@pytest.mark.parametrize("zero", [0, 1])
def test_update_costs_the_same_in_dry_run_simulator_and_planner(zero):
    profile, program = MT3000, compiled(pp=2, dp=2, zero=zero)
    costs, dry_run = ProfileCosts(program, profile), task_cost_model(program, profile)
    simulated = []
    for layer in program.stages[0]:
        seconds = _computed(costs, program, f"0UPD[L{layer}]")
        assert dry_run(_task(program, f"0UPD[L{layer}]")) == pytest.approx(seconds, rel=1e-12)
        simulated.append(seconds)
    local = layer_param_count(program, program.stages[0][0]) / (2 if zero else 1)
    assert simulated[0] == pytest.approx(update_bytes(local) / profile["ddr_bandwidth"])
    plan = StagePlan(local_grads=True, level="none", lowered=0, need={})
    estimate = _StageModel(Estimator(profile), program, 0, plan)
    assert estimate.update == pytest.approx(sum(simulated), rel=1e-12)


@pytest.mark.parametrize("zero", [0, 2])
def test_sync_compute_is_the_same_in_simulator_and_planner(zero):
    """What a SYNC costs its rank besides the link: the collective's finish, and on a
    TCP link the host's share of its bytes (NOTE [link host cost])."""
    profile = MT3000 | {"link_host_cost": 2e-9}
    program = compiled(pp=2, dp=4, zero=zero)
    costs, finishes, host = ProfileCosts(program, profile), 0.0, 0.0
    for layer in program.stages[1]:
        steps = costs.steps(_task(program, f"1SYNC[L{layer}]"))
        finishes += sum(s.finish for s in steps if isinstance(s, Start))
        host += sum(s.seconds for s in steps if isinstance(s, Compute))
    assert finishes > 0 and host > 0
    plan = StagePlan(local_grads=True, level="none", lowered=0, need={})
    estimate = _StageModel(Estimator(profile), program, 1, plan)
    assert estimate.sync_compute == pytest.approx(finishes + host, rel=1e-12)


@pytest.mark.parametrize("flags", [dict(zero=0, clip=1.0), dict(zero=2, precision="fp16")])
def test_speculative_update_costs_the_same_in_simulator_and_planner(flags):
    """See NOTE [commit rule]: a speculative UPD also takes its gradient's norm share and
    copies master, m and v into undo."""
    profile, program = MT3000, compiled(schedule="ratrain", pp=2, dp=2, **flags)
    costs = ProfileCosts(program, profile)
    simulated = sum(_computed(costs, program, f"0UPD[L{layer}]") for layer in program.stages[0])
    local = sum(layer_param_count(program, l) / (2 if flags["zero"] else 1)
                for l in program.stages[0])
    assert simulated > 1.5 * update_bytes(local) / profile["ddr_bandwidth"]
    plan = StagePlan(local_grads=True, level="none", lowered=0, need={})
    estimate = _StageModel(Estimator(profile), program, 0, plan)
    assert estimate.update == pytest.approx(simulated, rel=1e-12)


def test_a_scattered_gradient_costs_the_same_in_simulator_and_planner():
    """costs.grad_scatter: the estimate's reduce-scatter of each layer's gradients in a
    micro-batch's B moves the bytes the simulator's grad_scatter call does."""
    profile = ALGORITHMS["tree"]
    program = compiled(pp=1, dp=4, zero=2, grad_accum="scatter")
    costs = ProfileCosts(program, profile)
    started = {s.what.split()[1]: s for s in _started(costs, program, "0B0")}
    assert len(started) == len(program.stages[0])
    for layer in program.stages[0]:
        g = estimate_module._grad_scatter(program, layer_param_count(program, layer))
        start = started[f"L{layer}"]
        assert start.nbytes == collective_port_bytes(profile, "reduce_scatter", 4, g.reduced)
        assert start.finish == pytest.approx(g.add / profile["ddr_bandwidth"], rel=1e-12)


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("flags", [dict(zero=0), dict(zero=1, precision="fp16"), dict(zero=2)])
def test_prefetch_costs_the_same_in_dry_run_simulator_and_planner(flags, in_place, monkeypatch):
    """A PREF alone: its cast, and under ZeRO its all-gather and the copy into the view
    when it is waited for (none when gathered in place: the tiny model's views all are,
    so the other case is forced)."""
    if not in_place:
        for module in (layer_buffers, lower_state, costs_module, estimate_module):
            monkeypatch.setattr(module, "gathers_in_place", lambda program, layer: False)
        compiled.cache_clear()
    profile, program = ALGORITHMS["tree"], compiled(pp=2, dp=4, **flags)
    compiled.cache_clear()
    assert any(any(dict(c.params).get("in_place") for c in lt.calls)
               for lt in program.lowered[1]) == (in_place and program.options.zero > 0)
    costs, dry_run = ProfileCosts(program, profile), task_cost_model(program, profile)
    simulated = []
    for layer in program.stages[1]:
        steps = costs.steps(_task(program, f"1PREF[L{layer}]"))
        seconds = sum(s.seconds for s in steps if isinstance(s, Compute)) + \
            sum(_alone(profile, s) + s.finish for s in steps if isinstance(s, Start))
        assert dry_run(_task(program, f"1PREF[L{layer}]")) == pytest.approx(seconds, rel=1e-12)
        simulated.append(seconds)
    assert len(set(simulated)) > 1  # layers of different sizes
    plan = StagePlan(local_grads=True, level="none", lowered=0, need={})
    estimate = _StageModel(Estimator(profile), program, 1, plan)
    assert estimate.prefetch == pytest.approx(sum(simulated), rel=1e-12)


@pytest.mark.parametrize("pp", [1, 2])
def test_tie_costs_the_same_in_dry_run_and_simulator(pp):
    """See NOTE [tied weights]: one stage adds both copies in place; two stages add their
    copy each and all-reduce the sum."""
    profile, program = ALGORITHMS["tree"], compiled("tiny-tied", pp=pp, dp=2)
    costs, dry_run = ProfileCosts(program, profile), task_cost_model(program, profile)
    ties = [t for ts in program.tasks.values() for t in ts if t.kind == Kind.TIE]
    assert len(ties) == pp
    for tie in ties:
        steps = costs.steps(tie)
        seconds = sum(s.seconds for s in steps if isinstance(s, (Compute, TieSum)))
        assert any(isinstance(s, TieSum) for s in steps) == (pp > 1)
        assert dry_run(tie) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_norm_costs_the_same_in_dry_run_and_simulator(algorithm):
    profile, program = ALGORITHMS[algorithm], compiled(pp=2, dp=4, zero=0, clip=1.0)
    costs, dry_run = ProfileCosts(program, profile), task_cost_model(program, profile)
    world = [s for s in costs.steps(_task(program, "0NORM")) if isinstance(s, WorldSum)]
    assert world == [WorldSum(norm_seconds(profile, program.options))]
    assert dry_run(_task(program, "0NORM")) == pytest.approx(world[0].seconds, rel=1e-12)


@pytest.mark.parametrize("flags", [dict(zero=0), dict(zero=2), dict(zero=1, precision="fp16"),
                                   dict(zero=3, precision="fp16")])
def test_planned_traffic_is_what_the_simulator_puts_on_the_port(flags):
    """ring: the bytes cluster/volume.py plans for each task's calls (its sends, gradient
    collectives and ZeRO view gathers; fp16 views gather fp16 shards) are the bytes the
    simulator puts on the rank's port for that task."""
    profile, program = ALGORITHMS["ring"], compiled(pp=2, dp=2, **flags)
    costs, checked = ProfileCosts(program, profile), 0
    for stage, lowered in program.lowered.items():
        for lt in lowered:
            planned = sum(_call_bytes(c, program.options) for c in lt.calls
                          if c.op != "global_norm")  # a scalar: the simulator's WorldSum
            port = sum(s.nbytes for s in costs.steps(lt.task) if isinstance(s, (Start, Send)))
            assert planned == pytest.approx(port, rel=1e-12), str(lt.task)
            checked += planned > 0
    gathers = len(program.graph.layers) if program.options.zero >= 1 else 0
    assert checked >= len(program.graph.layers) + gathers  # every layer synced and gathered
