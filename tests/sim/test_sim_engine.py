"""The simulator's parts: link sharing, message rendezvous, the world sum, collective
formulas, the GEMM shape curve and the backward FLOPs of each node."""
import pytest

from ratrain import models
from ratrain.ir.costs import coarse_bwd_flops, layer_cost, node_flops
from ratrain.ir.tasks import Kind, counterpart, parse_schedule
from ratrain.models.trace import trace_model
from ratrain.sim import UnitCosts, replay
from ratrain.sim.collectives import Cost, collective_cost
from ratrain.sim.engine import Engine, Link, Signal
from ratrain.sim.kernels import backward_partners, efficiency, shape_factor
from ratrain.sim.steps import Compute, Send, WorldSum


def finish_times(sends):
    """Queue (channel, bytes) at time 0 on a 1 B/s link; when each transfer ends."""
    engine = Engine()
    link = Link(engine, bandwidth=1.0)
    done = [Signal(engine) for _ in sends]
    for (channel, nbytes), signal in zip(sends, done):
        link.send(channel, nbytes, signal)
    engine.run()
    return [signal.time for signal in done]


def test_channels_share_the_port_and_queue_within_a_channel():
    assert finish_times([("dp", 2.0), ("dp", 2.0)]) == [2.0, 4.0]
    assert finish_times([("dp", 2.0), ("next", 2.0)]) == [4.0, 4.0]
    # 1 B each until the short one ends at 2, then the long one alone: 2 + 3 = 5
    assert finish_times([("dp", 1.0), ("next", 4.0)]) == [2.0, 5.0]


class Messages(UnitCosts):
    """F and B take 1 s; a message: 1 s of latency, then 4 bytes on a 2 B/s port."""

    def __init__(self):
        super().__init__(lambda t: float(t.kind in (Kind.F, Kind.B)))

    def steps(self, task):
        if task.kind == Kind.SEND_F:
            return (Send(counterpart(task), "next", 1.0, 4.0),)
        return super().steps(task)


def test_a_message_starts_when_its_receive_is_posted():
    """Sent at 1, posted at 4 (after four 1 s forwards): arrives at 4 + 1 + 4 / 2 = 7;
    the sender's step ends when its message has arrived."""
    schedule = parse_schedule("""
        rank 0: 0F0 0SEND_F0
        rank 1: 1F9 1F8 1F7 1F6 1POST_F0 1RECV_F0 1F0""")
    result = replay(schedule, Messages(), bandwidth=2.0)
    assert [(str(s.task), s.start, s.end) for s in result.spans[1]][-2:] == \
        [("1RECV_F0", 7.0, 7.0), ("1F0", 7.0, 8.0)]
    assert result.ends == {0: 7.0, 1: 8.0}


class Norm(UnitCosts):
    def steps(self, task):
        if task.kind == Kind.NORM:
            return (WorldSum(0.5),)
        return (Compute(float(task.micro_batch + 1)),) if task.kind == Kind.F else ()


def test_world_sum_waits_for_the_last_rank():
    schedule = parse_schedule("rank 0: 0F0 0NORM 0F0\nrank 1: 1F2 1NORM 1F0")
    result = replay(schedule, Norm())
    assert result.ends == {0: 4.5, 1: 4.5}  # rank 1 joins at 3, + 0.5, then 1 s of F


@pytest.mark.parametrize("op, n, expected", [
    ("allreduce", 4, Cost(6 * 1e-6, 2 * 3 / 4 * 1e9)),
    ("reduce_scatter", 4, Cost(3 * 1e-6, 3 / 4 * 1e9)),
    ("allgather", 1024, Cost(1023 * 1e-6, 1023 / 1024 * 1e9)),
    ("allreduce", 1, Cost(0.0, 0.0))])
def test_ring_costs(op, n, expected):
    assert collective_cost(op, n, 1e9, 1e-6, 1e9, "ring") == expected


def test_tree_costs_and_auto_choice():
    tree = collective_cost("allreduce", 1024, 8, 1e-6, 1e9, "tree")
    assert tree == Cost(20 * 1e-6, 16.0)
    assert collective_cost("allreduce", 1024, 8, 1e-6, 1e9, "auto") == tree  # latency-bound
    big = collective_cost("allreduce", 4, 1e9, 1e-6, 1e9, "auto")  # bandwidth-bound
    assert big == collective_cost("allreduce", 4, 1e9, 1e-6, 1e9, "ring")


CURVE = {"gemm_shape_curve": [[16, 0.25], [64, 0.5], [1024, 1.0]], "gemm_efficiency": 0.8}


@pytest.mark.parametrize("dim, factor", [(8, 0.25), (16, 0.25), (32, 0.375), (64, 0.5),
                                         (256, 0.75), (1024, 1.0), (8192, 1.0)])
def test_shape_curve_is_linear_in_log2_dimension(dim, factor):
    assert shape_factor(CURVE, dim) == pytest.approx(factor, rel=1e-12)
    assert shape_factor({}, dim) == 1.0


def tiny_kinds():
    return trace_model(models.get_config("tiny"), micro_batch_size=2, seq_len=32).kinds


def test_backward_nodes_take_their_forward_partners_flops():
    for kind in tiny_kinds().values():
        partners = backward_partners(kind.fwd, kind.bwd)
        flops = sum(coarse_bwd_flops(p) if p is not None else node_flops(n)
                    for n, p in zip(kind.bwd.nodes, partners))
        assert flops == layer_cost(kind).bwd_flops
        assert all(p is not None for n, p in zip(kind.bwd.nodes, partners)
                   if n.op.endswith("_bwd"))


def test_gemm_efficiency_follows_the_smallest_dimension():
    """tiny: 64 tokens x hidden 256; attention over 32 positions of head size 64."""
    decoder = tiny_kinds()["decoder"].fwd
    gemm = next(n for n in decoder.nodes if n.op == "matmul")
    attention = next(n for n in decoder.nodes if n.op == "attention")
    assert efficiency(CURVE, gemm) == pytest.approx(0.8 * 0.5)
    assert efficiency(CURVE, attention) == pytest.approx(0.8 * 0.375)  # 32: halfway 16..64
