"""See NOTE [cache residency]: which operands of a rank's calls are still cached, and what a
profile with warm and cold kernel costs charges a step for it."""
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.program_format.lowered import Call, Slot
from ratrain.passes.program import CompileOptions
from ratrain.sim import simulate
from ratrain.sim.residency import BLOCK, cold_fractions

MiB = 1 << 20


def slot(name: str, mib: int = 1) -> Slot:
    return Slot(name, 0, "float32", (mib * MiB // 4,))


def fractions(order: list[tuple[str, tuple[str, ...]]], sizes: dict, capacity: int) -> dict:
    """cold_fractions of one task whose calls read the named buffers, laid end to end."""
    offsets, at = {}, 0
    for name, mib in sizes.items():
        offsets[name] = (at, mib * MiB)
        at += mib * MiB
    calls = tuple(Call("matmul", (), tuple(slot(b, sizes[b]) for b in reads), note=label)
                  for label, reads in order)
    result = cold_fractions(["t"], {"t": calls}, offsets, capacity)
    return {calls[i].note: f for (_, i), f in result.items()}


def test_operands_touched_within_the_cache_share_are_warm_and_older_ones_cold():
    """a is read, then 3 MiB of others, then a again: warm with a 4 MiB share, cold with
    2 MiB. The walk repeats (a step after a step), so even the first read of a counts what
    the end of the previous walk touched."""
    sizes = {"a": 1, "b": 1, "c": 1, "d": 1}
    order = [("first a", ("a",)), ("b", ("b",)), ("c", ("c",)), ("d", ("d",)),
             ("a again", ("a",))]
    roomy = fractions(order, sizes, 4 * MiB)
    assert roomy == {"first a": 0, "b": 0, "c": 0, "d": 0, "a again": 0}
    tight = fractions(order, sizes, 2 * MiB)
    assert tight["a again"] == 1 and tight["b"] == 1      # b: c, d and a twice since
    assert tight["first a"] == 0                          # a was the previous walk's last


def test_distance_counts_distinct_bytes_not_touches():
    """Reading b ten times between two reads of a evicts no more than reading it once."""
    sizes = {"a": 1, "b": 1}
    order = [("a", ("a",))] + [(f"b{i}", ("b",)) for i in range(10)] + [("a again", ("a",))]
    assert fractions(order, sizes, 2 * MiB)["a again"] == 0
    assert fractions(order, sizes, BLOCK)["a again"] == 1


def test_a_call_counts_the_share_of_its_bytes_that_left():
    """A call reading a (evicted) and c (just written) pays for a's bytes only."""
    sizes = {"a": 1, "b": 3, "c": 1}
    order = [("a", ("a",)), ("b", ("b",)), ("c", ("c",)), ("a and c", ("a", "c"))]
    assert fractions(order, sizes, 3 * MiB + BLOCK)["a and c"] == pytest.approx(0.5)


@lru_cache(maxsize=None)
def program():
    options = CompileOptions(pp=2, micro_batches=4, micro_batch_size=1, seq_len=64)
    return compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]


def with_costs(warm: dict, cold: dict | None, cache_bytes: int | None) -> dict:
    profile = load_profile("cpu") | {"op_costs": {"fp32": warm}}
    profile.pop("threads", None)
    if cold is not None:
        profile["op_costs_cold"] = {"fp32": cold}
    if cache_bytes is not None:
        profile["cache_bytes"] = cache_bytes
    return profile


def test_a_step_costs_between_all_warm_and_all_cold():
    warm = {"matmul": {"seconds": 1e-3}, "matmul_bwd": {"seconds": 2e-3}}
    cold = {"matmul": {"seconds": 3e-3}, "matmul_bwd": {"seconds": 5e-3}}
    step = lambda *a: simulate(program(), with_costs(*a)).step_time
    all_warm, all_cold = step(warm, None, None), step(cold, None, None)
    assert all_warm < all_cold
    assert step(warm, cold, 1 << 40) == pytest.approx(all_warm, rel=1e-12)  # all cached
    assert step(warm, cold, None) == pytest.approx(all_warm, rel=1e-12)     # no share
    tight = step(warm, cold, 2 * BLOCK)
    assert all_warm < tight < all_cold
    assert all_warm < step(warm, cold, 64 * 1024) <= tight
