"""Measured profiles in the simulator: op_costs replace the roofline of the ops they
cover, and a profile measured per thread count is narrowed to the job's threads per rank."""
import math
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.ir.costs import node_flops
from ratrain.ir.tasks import parse_task
from ratrain.passes.program import CompileOptions
from ratrain.sim import simulate
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.costs import (UPDATE_BYTES_PER_PARAM, layer_view_gather, prefetch_seconds,
                              view_cast_bytes)
from ratrain.sim.kernels import fitted_seconds, kernel_shape, node_bytes, node_seconds
from ratrain.sim.simulate import rank_profile
from ratrain.sim.steps import Compute

MATMUL = {"seconds": 1e-4, "flop_rate": 2e10, "byte_rate": 5e9}


@lru_cache(maxsize=None)
def compiled(pp: int):
    options = CompileOptions(pp=pp, micro_batches=2, micro_batch_size=1, seq_len=32)
    return compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]


def first_node(program, op):
    kind = program.graph.kinds["decoder"]
    return next(n for n in kind.fwd.nodes if n.op == op)


def test_fitted_seconds_adds_call_time_flops_and_bytes():
    assert fitted_seconds(MATMUL, 4e10, 1e9) == pytest.approx(1e-4 + 2 + 0.2)
    assert fitted_seconds({"seconds": 3e-6}, 4e10, 1e9) == 3e-6


# a runtime call's cases, every rank at once: slower per byte the larger (NOTE [streaming
# calls past the cases]); the fit over them streams faster than the largest did
STREAMED = {"seconds": 0.0, "byte_rate": 3.7e9,
            "measured": [[0, 4e6, 0.004], [0, 1e6, 0.0002], [0, 2e6, 0.001]]}


def test_a_call_without_flops_costs_its_cases_interpolated_and_past_them_the_largests_rate():
    assert fitted_seconds(STREAMED, 0, 2e6) == 0.001                      # a case: as timed
    assert fitted_seconds(STREAMED, 0, 3e6) == pytest.approx(0.0025)      # between 2 and 4 MB
    assert fitted_seconds(STREAMED, 0, 12e6) == pytest.approx(0.012)      # 4 MB's 1 GB/s
    assert fitted_seconds(STREAMED, 0, 5e5) == pytest.approx(5e5 / 3.7e9)  # below: the fit
    # a call or cases with FLOPs keep the fit
    assert fitted_seconds(STREAMED, 1e9, 12e6) == pytest.approx(12e6 / 3.7e9)
    with_flops = STREAMED | {"measured": [[1e9, 4e6, 0.004]]}
    assert fitted_seconds(with_flops, 0, 12e6) == pytest.approx(12e6 / 3.7e9)


# RoPE cases of the same FLOPs and bytes (B x T x H x D = 2 x 256 x 4 x 64), timed apart:
# its sines and cosines are per position (NOTE [cases by shape])
ROPE = {"seconds": 0.0, "byte_rate": 1e10,
        "measured": [[393216, 1048576, 0.098e-3, "B=4 T=128 H=4 D=64"],
                     [393216, 1048576, 0.148e-3, "B=2 T=256 H=4 D=64"],
                     [393216, 1048576, 0.248e-3, "B=1 T=512 H=4 D=64"]]}


def test_a_kernel_costs_the_case_of_its_own_shape_not_the_first_of_its_flops_and_bytes():
    for _, _, seconds, shape in ROPE["measured"]:
        assert fitted_seconds(ROPE, 393216, 1048576, shape) == seconds
    # a shape no case ran: the fit, not another shape's time
    assert fitted_seconds(ROPE, 393216, 1048576, "B=8 T=64 H=4 D=64") == \
        pytest.approx(1048576 / 1e10)
    # rows of an older profile carry no shape: they match on FLOPs and bytes, as before
    shapeless = ROPE | {"measured": [row[:3] for row in ROPE["measured"]]}
    assert fitted_seconds(shapeless, 393216, 1048576, "B=2 T=256 H=4 D=64") == 0.098e-3
    # a call without a kernel family (no shape) matches on FLOPs and bytes
    assert fitted_seconds(ROPE, 393216, 1048576) == 0.098e-3


def test_a_programs_rope_node_is_charged_its_shapes_case():
    """The shape comes from the node as calibrate names its cases: B, T, H, D of RoPE;
    GEMM rows from every leading dimension."""
    options = CompileOptions(micro_batches=2, micro_batch_size=2, seq_len=256)
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    rope, matmul = first_node(program, "rope"), first_node(program, "matmul")
    assert kernel_shape(rope) == "B=2 T=256 H=4 D=64"
    assert kernel_shape(matmul) == "M=512 N=256 K=256"
    profile = load_profile("cpu") | {"op_costs": {"fp32": {"rope": ROPE}}}
    assert node_seconds(rope, profile, "fp32") == 0.148e-3


def test_op_costs_replace_the_roofline_of_their_ops_only():
    cpu = load_profile("cpu")
    measured = cpu | {"op_costs": {"fp32": {"matmul": MATMUL}}}
    program = compiled(1)
    matmul, norm = first_node(program, "matmul"), first_node(program, "rms_norm")
    assert node_seconds(matmul, measured, "fp32") == pytest.approx(
        1e-4 + node_flops(matmul) / 2e10 + node_bytes(matmul) / 5e9, rel=1e-12)
    assert node_seconds(norm, measured, "fp32") == node_seconds(norm, cpu, "fp32")


def test_an_op_measured_only_in_fp32_costs_16_bit_programs_its_fp32_fit():
    """See NOTE [16-bit costs]: the fp32 fit at the node's own FLOPs and bytes, unless the
    profile measured the op in that format too; an op measured in neither keeps the
    roofline."""
    cpu = load_profile("cpu")
    bf16_rate = {"seconds": 0.0, "flop_rate": 4e10}
    measured = cpu | {"op_costs": {"fp32": {"matmul": MATMUL}, "bf16": {"matmul": bf16_rate}}}
    matmul, norm = first_node(compiled(1), "matmul"), first_node(compiled(1), "rms_norm")
    assert node_seconds(matmul, measured, "fp16") == node_seconds(matmul, measured, "fp32")
    assert node_seconds(matmul, measured, "bf16") == pytest.approx(node_flops(matmul) / 4e10)
    assert node_seconds(norm, measured, "bf16") == node_seconds(norm, cpu, "bf16")


@pytest.mark.parametrize("task, op, per_element", [
    ("0UPD[L1]", "adamw", UPDATE_BYTES_PER_PARAM),    # master, m, v read and written, grad read
    ("0PREF[L1]", "prefetch_view", 8)])              # fp32 master read, fp32 view written
def test_runtime_calls_use_their_measured_cost(task, op, per_element):
    """0.5 s per call instead of their bytes at DDR bandwidth."""
    program, task = compiled(1), parse_task(task)
    seconds = lambda p: sum(s.seconds for s in ProfileCosts(program, p).steps(task)
                            if isinstance(s, Compute))
    calls = [c for lt in program.lowered[0] if lt.task == task for c in lt.calls if c.op == op]
    elements = sum(math.prod((c.inputs if op == "prefetch_view" else c.outputs)[0].shape)
                   for c in calls)
    cpu = load_profile("cpu")
    slow = cpu | {"op_costs": {"fp32": {op: {"seconds": 0.5}}}}
    roofline = per_element * elements / cpu["ddr_bandwidth"]
    assert len(calls) >= 1 and roofline > 0
    assert seconds(slow) == pytest.approx(seconds(cpu) - roofline + 0.5 * len(calls), rel=1e-12)


def test_all_reduce_finishing_work_uses_its_measured_cost():
    """The mean written back when a gradient all-reduce is waited for (baseline: the
    SYNC task starts it; in ratrain mode the last B does, NOTE [sync issue point])."""
    options = CompileOptions(dp=2, micro_batches=2, micro_batch_size=1, seq_len=32,
                             schedule="baseline")
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    sync = parse_task("0SYNC[L1]")
    start = lambda p: next(s for s in ProfileCosts(program, p).steps(sync) if hasattr(s, "finish"))
    cpu = load_profile("cpu")
    assert start(cpu).finish > 0
    assert start(cpu | {"op_costs": {"fp32": {"grad_sync": {"seconds": 0.25}}}}).finish == 0.25


@pytest.mark.parametrize("zero, task", [(3, "0GATH_F[L1]0"), (1, "0PREF[L1]")])
def test_a_gathers_start_costs_its_measured_time(zero, task):
    """See NOTE [gather start]: a ZeRO-3 gather (and a ZeRO 1-2 prefetch's gather) charges the
    rank the `gather_view` case's time for its cast bytes instead of those bytes at DDR
    bandwidth; the estimate's PREF does the same."""
    options = CompileOptions(dp=2, zero=zero, micro_batches=2, micro_batch_size=1, seq_len=32)
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    task = parse_task(task)
    compute = lambda p: sum(s.seconds for s in ProfileCosts(program, p).steps(task)
                            if isinstance(s, Compute))
    gathers = [c for lt in program.lowered[0] if lt.task == task for c in lt.calls
               if c.op in ("gather_view", "prefetch_view")]
    cpu = load_profile("cpu")
    slow = cpu | {"op_costs": {"fp32": {"gather_view": {"seconds": 0.5}}}}
    cast = sum(view_cast_bytes(math.prod(c.inputs[0].shape), 4) for c in gathers)
    assert len(gathers) == 1 and cast > 0
    assert compute(slow) == pytest.approx(compute(cpu) - cast / cpu["ddr_bandwidth"] + 0.5,
                                          rel=1e-12)
    in_place = bool(dict(gathers[0].params).get("in_place"))
    pref = lambda p: prefetch_seconds(program, p, 1, in_place)
    assert pref(slow) == pytest.approx(pref(cpu) - layer_view_gather(program, 1, in_place).cast
                                       / cpu["ddr_bandwidth"] + 0.5, rel=1e-12)


PER_THREADS = {"node_cores": 4, "threads": {"1": {"ddr_bandwidth": 1e9},
                                            "2": {"ddr_bandwidth": 2e9},
                                            "4": {"ddr_bandwidth": 4e9}}}


@pytest.mark.parametrize("world_size, threads", [(1, 4), (2, 2), (3, 1), (4, 1), (8, 1)])
def test_rank_profile_takes_the_runtimes_threads_per_rank(world_size, threads):
    profile = rank_profile(load_profile("cpu") | PER_THREADS, world_size)
    assert (profile["rank_threads"], profile["ddr_bandwidth"]) == (threads, threads * 1e9)


def test_rank_profile_takes_the_nearest_count_below():
    profile = load_profile("cpu") | {"node_cores": 8, "threads": {"1": {}, "2": {}, "8": {}}}
    assert rank_profile(profile, 2)["rank_threads"] == 2      # 4 threads wanted
    assert rank_profile(profile, 1)["rank_threads"] == 8
    assert rank_profile(load_profile("mt3000"), 2) == load_profile("mt3000")


def test_simulate_uses_each_jobs_threads():
    """Half the DDR bandwidth at 1 thread per rank: PP=2's memory-bound update slows,
    the 1-rank program (all cores, 2 threads) runs on the fast entry."""
    plain = load_profile("mt3000") | {"cores": 2}          # one rate for any thread count
    split = plain | {"node_cores": 2, "threads": {
        "1": {"ddr_bandwidth": plain["ddr_bandwidth"] / 2}, "2": {}}}
    assert simulate(compiled(1), split).step_time == simulate(compiled(1), plain).step_time
    assert simulate(compiled(2), split).step_time > simulate(compiled(2), plain).step_time
    assert simulate(compiled(2), split).profile["rank_threads"] == 1
