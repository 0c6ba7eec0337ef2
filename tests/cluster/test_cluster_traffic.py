"""Every byte the program plans to send crosses the shaped links: the qdisc byte counters
of a run on the cluster, per step (two step counts differenced, so MPI set-up and the
runtime's start cancel), equal the planned communication volume within 10%, for PP=2
(activations and their gradients) and DP=2 (gradient all-reduce)."""
import os

import pytest

from cluster_helpers import compile_tiny, needs_root, ratrain, unique_name
from ratrain.cluster import harness
from ratrain.cluster.volume import planned_volume

pytestmark = [needs_root, pytest.mark.mpi]
STEPS = (2, 5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    os.environ["RATRAIN_CLUSTER_STATE"] = str(state)
    name = unique_name("t")
    made = harness.bring_up(name, 2, 60e6, 0.0)
    yield made, dict(os.environ)
    harness.bring_down(name)
    del os.environ["RATRAIN_CLUSTER_STATE"]


def counted_per_step(cluster, program) -> dict[int, float]:
    """rank -> bytes its link's qdisc counted per step, from runs of STEPS[0] and
    STEPS[1] steps."""
    made, env = cluster
    sent = []
    for steps in STEPS:
        before = harness.link_counters(made)
        done = ratrain("run", program, "--cluster", made.name, "--steps", steps, env=env)
        assert done.returncode == 0, done.stderr
        after = harness.link_counters(made)
        sent.append({r: after[r][0] - before[r][0] for r in after})
    return {r: (sent[1][r] - sent[0][r]) / (STEPS[1] - STEPS[0]) for r in sent[0]}


@pytest.mark.parametrize("layout", [
    pytest.param(("--pp", 2, "--micro-batches", 4), id="pp2"),
    pytest.param(("--dp", 2, "--micro-batches", 2), id="dp2", marks=pytest.mark.slow)])
def test_qdisc_bytes_equal_planned_volume(cluster, tmp_path, layout):
    program = compile_tiny(tmp_path / "program", *layout)
    planned = planned_volume(program)
    counted = counted_per_step(cluster, program)
    assert set(counted) == set(planned) == {0, 1}
    for rank, nbytes in planned.items():
        print(f"{layout[:2]} rank {rank}: counted {counted[rank]:,.0f} B/step, planned "
              f"{nbytes:,.0f}, ratio {counted[rank] / nbytes:.4f}")
        assert nbytes > 0
        assert counted[rank] == pytest.approx(nbytes, rel=0.10), (rank, counted, planned)


def test_planned_volume_of_a_pipeline_is_its_activations(tmp_path):
    program = compile_tiny(tmp_path / "pp2", "--pp", 2, "--micro-batches", 4)
    activation = 1 * 32 * 256 * 4   # micro-batch 1 x seq 32 x hidden 256, fp32
    assert planned_volume(program) == {0: 4 * activation, 1: 4 * activation}


def test_planned_volume_of_data_parallel_is_the_gradient(tmp_path):
    from ratrain import models
    program = compile_tiny(tmp_path / "dp2", "--dp", 2, "--micro-batches", 2)
    params = sum(int(__import__("math").prod(s))
                 for s in models.param_shapes(models.get_config("tiny")).values())
    # a 2-member all-reduce: each member sends its whole fp32 gradient once
    assert planned_volume(program) == {0: 4 * params, 1: 4 * params}


@pytest.mark.slow
def test_probe_measures_the_shaped_link_and_simulate_uses_it(cluster, tmp_path):
    """`ratrain cluster probe`: MPI payload bandwidth within 10% of the 60 MB/s shaping,
    a positive latency and host cost, recorded in the state; `simulate --cluster` then
    costs a DP=2 step on exactly those link fields (NOTE [link host cost])."""
    import json

    from ratrain.cluster.scaling import with_link
    from ratrain.compiler import recompile
    from ratrain.hw.topology import node_per_rank
    from ratrain.programs import read_manifest
    from ratrain.sim import simulate
    made, env = cluster
    done = ratrain("cluster", "probe", made.name, env=env)
    assert done.returncode == 0, done.stderr
    probed = harness.read_cluster(made.name).probed
    assert abs(probed["link_bandwidth"] / 60e6 - 1) < 0.10, probed
    assert probed["link_latency"] > 0 and probed["link_host_cost"] > 0, probed
    program = compile_tiny(tmp_path / "dp2", "--dp", 2, "--micro-batches", 2)
    manifest = read_manifest(program)
    # each rank a node of its own on the probed link, its TCP collectives moving while it
    # computes (harness.link_fields)
    expected = simulate(recompile(manifest), node_per_rank(with_link(
        manifest["hw"], probed["link_bandwidth"], probed["link_latency"],
        probed["link_host_cost"])) | {"collective_progress_share": 1.0})
    sim = ratrain("simulate", program, "--json", "--cluster", made.name, env=env)
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["step_time_s"] == expected.step_time
