"""ZeRO-3 in the simulator: a gather prefetched a layer ahead crosses the DP link while
the previous layer computes, so on mt3000 (gathers exposed at dp 4) a step with
--zero3-prefetch >= 1 is shorter than with gathers at use (0); ZeRO-2, which gathers
each view once per step, stays shorter still; and every shared use costs one gather."""
from functools import lru_cache

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.passes.program import CompileOptions
from ratrain.sim import simulate
from ratrain.sim.steps import Start


@lru_cache(maxsize=None)
def step_time(zero: int, prefetch: int = 1) -> float:
    options = CompileOptions(pp=2, dp=4, micro_batches=4, micro_batch_size=1, seq_len=64,
                             zero=zero, zero3_prefetch=prefetch, precision="fp16",
                             hw="mt3000", recompute="none")
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    return simulate(program, load_profile("mt3000")).step_time


def test_prefetching_gathers_shortens_the_step():
    at_use, ahead, further = step_time(3, 0), step_time(3, 1), step_time(3, 2)
    assert ahead < 0.8 * at_use        # measured 0.69: half the gather time hidden
    assert further < ahead
    assert step_time(2) < further      # ZeRO-2 gathers once per step, not per use


def test_every_use_pays_one_gather_on_the_dp_link():
    options = CompileOptions(pp=1, dp=2, micro_batches=2, micro_batch_size=1, seq_len=16,
                             zero=3, hw="mt3000")
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    from ratrain.sim.calls import ProfileCosts
    costs = ProfileCosts(program, load_profile("mt3000"))
    gathers = [s for t in program.tasks[0] for s in costs.steps(t)
               if isinstance(s, Start) and s.what.startswith("allgather")]
    layers = len(program.stages[0])
    # pp 1 runs F0 B0 F1 B1: 4 uses per layer; the head's F and B of a micro-batch share
    # one gather (twice), and so do B0's embedding and F1's
    assert [str(t) for t in program.tasks[0]][:2] == ["0GATH_F[L0]0", "0GATH_F[L1]0"]
    assert len(gathers) == 4 * layers - 3
    assert all(s.nbytes > 0 for s in gathers)
