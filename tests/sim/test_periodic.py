"""Periodic steps (NOTE [periodic steps], sim/periodic.py): a step of M micro-batches
extended from replays of instances of a few must equal the replay of the whole step."""
from dataclasses import replace
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import trace_for
from ratrain.hw import load_profile
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.sim import simulate
from ratrain.sim.periodic import simulate_periodic

CASES = {
    "tiny-pp2-cpu": dict(model="tiny", hw="cpu", pp=2),
    "tiny-pp4-dp2-zero2-fp16": dict(model="tiny", hw="mt3000", pp=4, dp=2, zero=2,
                                    precision="fp16", recompute="selective"),
    "tiny-pp3-baseline-full": dict(model="tiny", hw="mt3000", pp=3, schedule="baseline",
                                   recompute="full"),
    "tied-pp2-dp2-clip": dict(model="tiny-tied", hw="mt3000", pp=2, dp=2, zero=1, clip=1.0),
    "tiny-pp2-dp2-zero3": dict(model="tiny", hw="mt3000", pp=2, dp=2, zero=3,
                               precision="fp16"),
    "tiny-pp3-dp2-zero2-scatter": dict(model="tiny", hw="mt3000", pp=3, dp=2, zero=2,
                                       grad_accum="scatter", recompute="selective"),
    "tiny-pp3-dp2-zero1-zb1": dict(model="tiny", hw="mt3000", pp=3, dp=2, zero=1,
                                   pipeline_schedule="zb1"),
    "tiny-pp2-baseline-zb1-full": dict(model="tiny", hw="cpu", pp=2, schedule="baseline",
                                       recompute="full", pipeline_schedule="zb1"),
}


@lru_cache(maxsize=None)
def _graph(model: str, options: CompileOptions):
    return trace_for(models.get_config(model), model, options)


def _instances(case: str, micro_batches: int, budget=None, seq_len=None):
    flags = dict(CASES[case])
    model, hw = flags.pop("model"), flags.pop("hw")
    options = CompileOptions(micro_batches=micro_batches, hw=hw, budget=budget,
                             seq_len=seq_len or 128, **flags)
    graph = _graph(model, replace(options, micro_batches=1, budget=None))

    def compile_instance(n: int):
        built = None if n == micro_batches else n
        return run_pipeline(Program(graph, options, built_micro_batches=built),
                            verify=False, record=False)[0]
    return compile_instance, load_profile(hw), options


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("micro_batches", [33, 64])
def test_periodic_step_equals_the_whole_step(case, micro_batches):
    compile_instance, profile, options = _instances(case, micro_batches)
    periodic = simulate_periodic(compile_instance, micro_batches, options.pp, profile)
    whole = simulate(compile_instance(micro_batches), profile)
    assert periodic.built < micro_batches // 2  # extended, not replayed whole
    assert periodic.step_time == pytest.approx(whole.step_time, rel=1e-9)
    assert periodic.exposed_tail == pytest.approx(whole.exposed_tail, rel=1e-9, abs=1e-12)
    assert periodic.bubble_fraction == pytest.approx(whole.bubble_fraction, rel=1e-9)
    assert periodic.peaks == whole.memory_peaks()
    assert periodic.tokens_per_s == pytest.approx(whole.tokens_per_s, rel=1e-9)


def test_an_instance_keeps_the_constants_of_the_step():
    """The loss cotangent of an instance is 1/M of the step, not 1/n of the instance."""
    compile_instance, _, _ = _instances("tiny-pp2-cpu", 40)
    instance = compile_instance(7)
    assert instance.micro_batches == 7 and instance.options.micro_batches == 40
    fills = [c for lt in instance.lowered[1] for c in lt.calls if c.note == "loss cotangent"]
    assert fills and all(dict(c.params)["value"] == 1 / 40 for c in fills)
    assert sum(t.kind == "F" for t in instance.tasks[0]) == 7


def test_a_short_step_is_replayed_whole():
    compile_instance, profile, options = _instances("tiny-pp2-cpu", 6)
    periodic = simulate_periodic(compile_instance, 6, options.pp, profile)
    assert periodic.built == 6
    assert periodic.step_time == simulate(compile_instance(6), profile).step_time


@pytest.mark.slow
def test_auto_recompute_under_a_budget():
    """LLaMA-2-7B, pp 4, mt3000 at 20 GB: auto recompute chooses per instance; the step
    time still repeats (NOTE [periodic steps]) and equals the whole step's."""
    options = CompileOptions(pp=4, dp=8, zero=2, micro_batches=48, seq_len=2048,
                             precision="fp16", hw="mt3000", recompute="auto",
                             budget=20 * 10**9)
    graph = trace_for(models.get_config("llama2-7b"), "llama2-7b", options)
    compile_instance = lambda n: run_pipeline(
        Program(graph, options, built_micro_batches=None if n == 48 else n),
        verify=False, record=False)[0]
    profile = load_profile("mt3000")
    periodic = simulate_periodic(compile_instance, 48, 4, profile)
    whole = simulate(compile_instance(48), profile)
    assert periodic.built < 24
    assert periodic.step_time == pytest.approx(whole.step_time, rel=1e-9)
    assert periodic.exposed_tail == pytest.approx(whole.exposed_tail, rel=1e-9)


@pytest.mark.slow
def test_a_transient_that_grows_like_a_period_is_not_taken_for_one():
    """See NOTE [periodic steps]: LLaMA-2-7B, pp 8, one sequence per micro-batch at 20 GB:
    stage 0 recomputes fully and sets the pace, but for the first micro-batches past P its
    idle time absorbs the extra work, and the step grows by one constant, smaller amount
    per micro-batch. Extending that would undercount the step; the extension must wait
    for growth no smaller than stage 0's work, and then equal the whole replay. Three
    instances show the transient, so n doubles at once rather than after nine."""
    options = CompileOptions(pp=8, micro_batches=64, seq_len=2048, precision="fp16",
                             hw="mt3000", recompute="auto", budget=20 * 10**9,
                             update_rule="after-norm")
    graph = trace_for(models.get_config("llama2-7b"), "llama2-7b", options)
    compile_instance = lambda n: run_pipeline(
        Program(graph, options, built_micro_batches=None if n == 64 else n),
        verify=False, record=False)[0]
    profile = load_profile("mt3000")
    early = [simulate(compile_instance(n), profile) for n in (11, 12, 13)]
    growth = [b.step_time - a.step_time for a, b in zip(early, early[1:])]
    work = early[2].replay.busy(0) - early[1].replay.busy(0)
    assert growth[0] == pytest.approx(growth[1], rel=1e-9) and growth[1] < 0.95 * work
    asked = []
    periodic = simulate_periodic(lambda n: asked.append(n) or compile_instance(n), 64, 8,
                                 profile)
    whole = simulate(compile_instance(64), profile)
    assert asked == [11, 12, 13, 22, 23, 24] and 22 <= periodic.built <= 24
    assert periodic.step_time == pytest.approx(whole.step_time, rel=1e-9)
