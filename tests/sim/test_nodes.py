"""Nodes of several ranks (hw/topology.py, sim/collectives.node_collective): where ranks sit,
the node's shared memory and port in the collectives' costs (NOTE [node memory]), DP
transfers stalled while their rank computes (NOTE [manual progress]), and the node fields
of a profile validated by name."""
import importlib
import json
from dataclasses import replace

import pytest

from ratrain import models
from ratrain.calibrate.node_fit import node_fields
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import ProfileError, load_profile
from ratrain.hw.topology import Node, dp_group_nodes, node_of, node_per_rank
from ratrain.passes.program import CompileOptions
from ratrain.program_format.placement import Placement
from ratrain.ir.tasks import parse_schedule
from ratrain.sim import replay, simulate
from ratrain.sim.collectives import collective_cost, node_collective
from ratrain.sim.steps import Compute, Start, Touch

NODE = Node(ranks=8, memory_bandwidth=96e9, port_bandwidth=2e9, port_latency=5e-6,
            link_bandwidth=10e9, link_latency=1e-6, progress_share=1.0)
S = 64e6


def test_pipelines_fill_a_node_first():
    """Pipeline-major: rank = replica x pp + stage, nodes of consecutive ranks."""
    assert dp_group_nodes(Placement(pp=2, dp=8), stage=1, ranks=8) == (4, 4)
    assert dp_group_nodes(Placement(pp=1, dp=16), stage=0, ranks=16) == (16,)
    assert dp_group_nodes(Placement(pp=8, dp=4), stage=3, ranks=4) == (1, 1, 1, 1)


def test_dp_groups_fill_a_node_first_under_dp_major():
    """rank = stage x dp + replica: each stage's group on nodes of its own."""
    assert dp_group_nodes(Placement(pp=2, dp=8, block=8), stage=1, ranks=8) == (8,)
    assert dp_group_nodes(Placement(pp=8, dp=4, block=4), stage=3, ranks=4) == (4,)
    assert dp_group_nodes(Placement(pp=4, dp=8, block=4), stage=2, ranks=8) == (4, 4)


def test_within_a_node_the_members_share_its_memory():
    """Reduce-scatter: 3 bytes of traffic per byte; all-gather 2; at most the link."""
    rs = node_collective("reduce_scatter", (8,), S, NODE)
    assert rs.nbytes == pytest.approx(7 / 8 * S)
    assert rs.seconds == pytest.approx(7 / 8 * S / (96e9 / (8 * 3)))
    ag = node_collective("allgather", (8,), S, NODE)
    assert ag.seconds == pytest.approx(7 / 8 * S / (96e9 / (8 * 2)))
    pair = node_collective("allgather", (2,), S, NODE)  # 24 GB/s of memory: the link bounds
    assert pair.seconds == pytest.approx(S / 2 / 10e9)
    ar = node_collective("allreduce", (8,), S, NODE)
    assert ar.seconds == pytest.approx(rs.seconds + ag.seconds)
    assert ar.latency == pytest.approx(14 * 1e-6)


# what calibrate timed on the 8 ranks of NODE (NOTE [measured node collectives]): groups
# of 8 and of 4 side by side, 32 MB; and a row of another rank count, which must not count
ROWS = (("reduce_scatter", 8, 1, 32e6, 0.020), ("reduce_scatter", 4, 2, 32e6, 0.030),
        ("reduce_scatter", 4, 2, 4e6, 0.001), ("allreduce", 4, 2, 32e6, 0.070),
        ("allgather", 2, 1, 32e6, 0.001))


def test_within_a_node_a_measured_collective_is_charged_its_time_per_byte():
    measured = replace(NODE, collective_rows=ROWS)
    # a group of 4: the largest row of 4 members, 3/4 of S moved per member
    rs = node_collective("reduce_scatter", (4,), S, measured)
    assert rs.seconds == pytest.approx(0.030 / (3 / 4 * 32e6) * (3 / 4 * S))
    # 8 members: the row of 8; 2 members: 4 is the nearest timed (8 ranks busy), scaled by
    # the bytes a member of 2 moves (1/2 of S)
    assert node_collective("reduce_scatter", (8,), S, measured).seconds == \
        pytest.approx(0.020 / (7 / 8 * 32e6) * (7 / 8 * S))
    assert node_collective("reduce_scatter", (2,), S, measured).seconds == \
        pytest.approx(0.030 / (3 / 4 * 32e6) * (1 / 2 * S))
    assert node_collective("allreduce", (4,), S, measured).seconds == \
        pytest.approx(0.070 * S / 32e6)
    # no all-gather row timed with the node's 8 ranks busy: the copy-rate model
    assert node_collective("allgather", (8,), S, measured) == \
        node_collective("allgather", (8,), S, NODE)
    assert rs.latency == node_collective("reduce_scatter", (4,), S, NODE).latency


def test_a_profiles_measured_rows_reach_its_node():
    rows = [list(r) for r in ROWS]  # as the profile's JSON holds them
    node = node_of({"link_bandwidth": 10e9, "link_latency": 1e-6, "ddr_bandwidth": 12e9,
                    "ranks_per_node": 8, "node_collectives": {"rows": rows}})
    assert node.collective_rows == ROWS
    assert node_of({"link_bandwidth": 10e9, "link_latency": 1e-6, "ddr_bandwidth": 12e9,
                    "ranks_per_node": 8}).collective_rows == ()


def test_one_member_per_node_is_the_flat_collective_on_the_port():
    cost = collective_cost("allreduce", 4, S, 5e-6, 2e9)
    flat = node_collective("allreduce", (1, 1, 1, 1), S, NODE)
    assert (flat.latency, flat.nbytes, flat.seconds) == \
        pytest.approx((cost.latency, cost.nbytes, cost.nbytes / 2e9))


def test_a_group_across_nodes_runs_hierarchically():
    """Within (S), across the 2 nodes on S / 4 per rank with 4 ranks on the port, within."""
    within_rs = node_collective("reduce_scatter", (4,), S, NODE)
    within_ag = node_collective("allgather", (4,), S, NODE)
    across = collective_cost("allreduce", 2, S / 4, 5e-6, 2e9 / 4)
    both = node_collective("allreduce", (4, 4), S, NODE)
    assert both.seconds == pytest.approx(within_rs.seconds + across.nbytes / (2e9 / 4)
                                         + within_ag.seconds)
    assert both.latency == pytest.approx(within_rs.latency + across.latency + within_ag.latency)
    # the node's port carries S per node per phase, as one rank per node sends alone
    assert across.nbytes * 4 == pytest.approx(collective_cost("allreduce", 2, S, 0, 1).nbytes)


class _Table:
    def __init__(self, steps: dict):
        self.table = steps

    def steps(self, task):
        return self.table.get(str(task), (Compute(1.0),))


@pytest.mark.parametrize("share, step", [(1.0, 4.0), (0.0, 6.0), (0.5, 5.0)])
def test_dp_transfers_move_at_the_progress_share_while_the_rank_computes(share, step):
    """B 0-1 starts a 2 s sync, F 1-3 computes beside it, UPD touches it. During F the
    sync moves 2 x share s of its 2 s; the rest after F, so UPD waits until
    3 + 2 - 2 x share and computes 1 s."""
    schedule = parse_schedule("rank 0: 0B0 0F1 0UPD[L0]")
    table = {"0B0": (Compute(1.0), Start(("grad.L0",), 0.0, 2.0)),
             "0F1": (Compute(2.0),), "0UPD[L0]": (Touch(("grad.L0",)), Compute(1.0))}
    result = replay(schedule, _Table(table), bandwidth=1.0, progress_share=share)
    assert result.step_time == pytest.approx(step)


@pytest.mark.parametrize("share, step", [(0.5, 6.0), (0.0, 6.0), (1.0, 5.0)])
def test_the_compute_beside_a_moving_collective_runs_at_one_over_the_slowdown(share, step):
    """NOTE [kernels beside collectives], slowdown 2: share 0.5, F's 2 s of work and the
    2 s sync both move at half speed from 1 s to 5 s, UPD 5-6; share 0, the sync stands
    still, so F runs alone 1-3 and the sync 3-5 (UPD 5-6); share 1, the sync ends at 3
    with F half done, F's last 1 s runs 3-4 at full speed, UPD 4-5."""
    schedule = parse_schedule("rank 0: 0B0 0F1 0UPD[L0]")
    table = {"0B0": (Compute(1.0), Start(("grad.L0",), 0.0, 2.0)),
             "0F1": (Compute(2.0),), "0UPD[L0]": (Touch(("grad.L0",)), Compute(1.0))}
    result = replay(schedule, _Table(table), bandwidth=1.0, progress_share=share,
                    kernel_slowdown=2.0)
    assert result.step_time == pytest.approx(step)
    f = next(s for s in result.spans[0] if str(s.task) == "0F1")
    assert f.end == pytest.approx({0.5: 5.0, 0.0: 3.0, 1.0: 4.0}[share])


def test_the_simulator_slows_kernels_by_what_the_calibrated_beside_probe_timed(monkeypatch):
    """See NOTE [kernels beside collectives]: `ratrain calibrate` times a GEMM loop alone
    (1.0 s) and beside streaming all-reduces (1.98 s); the profile it writes makes the
    simulator run compute beside a moving collective at 1 / 1.98 (what the replay does
    with that: the test above), and an unprobed profile slows nothing."""
    probe = {"collectives": [], "beside_kernel": {
        "kernel_seconds": 1.0, "kernel_seconds_beside": 1.98, "allreduces_done": 0,
        "allreduce_bytes": 32 << 20}}
    engine, slowdowns = importlib.import_module("ratrain.sim.simulate"), []
    replayed = engine.replay
    monkeypatch.setattr(engine, "replay", lambda *args, **how: slowdowns.append(
        how["kernel_slowdown"]) or replayed(*args, **how))
    options = CompileOptions(dp=2, micro_batches=1, micro_batch_size=2, seq_len=32)
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]
    for profile in (load_profile("cpu") | node_fields(probe, ranks=2), load_profile("cpu")):
        simulate(program, profile)
    assert slowdowns == [pytest.approx(1.98), 1.0]


def test_profiles_default_to_a_node_per_rank_and_name_a_bad_node_field(tmp_path):
    mt3000 = load_profile("mt3000")
    assert node_of(mt3000).ranks == 4 and node_of(mt3000).port_bandwidth == 3.7e9
    plain = {k: v for k, v in mt3000.items() if k not in (
        "ranks_per_node", "inter_node_bandwidth", "inter_node_latency",
        "node_memory_bandwidth", "collective_progress_share")}
    node = node_of(plain)
    assert (node.ranks, node.port_bandwidth, node.port_latency, node.progress_share) == \
        (1, plain["link_bandwidth"], plain["link_latency"], 1.0)
    assert node_of(node_per_rank(mt3000)).port_bandwidth == mt3000["link_bandwidth"]
    for field, value in (("inter_node_bandwidth", 0), ("ranks_per_node", 2.5),
                         ("collective_progress_share", 1.5)):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps(mt3000 | {field: value}))
        with pytest.raises(ProfileError, match=field):
            load_profile(path)
