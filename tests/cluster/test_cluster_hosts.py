"""The multi-host path on one machine: a cluster of nodes (a node's ranks share its
namespace and link) runs a compiled program through `ratrain run --hosts/--hostfile`, hydra
starting each node's proxy in its namespace with the cluster's launcher, and the losses are
bit-identical to the same program on one host. Without root: the launcher script, the
job's command line and the checks of hosts against a cluster."""
import json
import os

import pytest

from cluster_helpers import compile_tiny, needs_root, ratrain, unique_name
from ratrain.cluster import harness
from ratrain.cluster.harness import Cluster, ClusterError, launcher_script, shared_core_env
from ratrain.cluster.volume import planned_volume

STEPS = 3


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CLUSTER_STATE", str(tmp_path / "state"))
    return dict(os.environ, RATRAIN_CLUSTER_STATE=str(tmp_path / "state"))


def losses(metrics) -> list[float]:
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]


def run_losses(program, out, *flags, env=None) -> list[float]:
    """Losses of a STEPS-step run of `program` with `flags` (metrics in out)."""
    done = ratrain("run", program, "--steps", STEPS, "--metrics", out, *flags, env=env)
    assert done.returncode == 0, done.stderr
    return losses(out)


@pytest.fixture(scope="module")
def pp2_program(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("hosts") / "pp2", "--pp", 2,
                        "--micro-batches", 2)


@pytest.mark.mpi
def test_hosts_of_this_machine_run_without_root(pp2_program, tmp_path):
    """`--hosts localhost` (hydra starts a local host's proxy itself, no ssh) gives the
    losses of a plain run; bad host lists stop before MPI starts, in one line."""
    one_host = run_losses(pp2_program, tmp_path / "one.jsonl")
    assert run_losses(pp2_program, tmp_path / "local.jsonl", "--hosts", "localhost") == \
        one_host
    for flags, says in [(("--hosts", "a,b,c"), "3 hosts do not divide the program's 2 ranks"),
                        (("--hosts", "a,,b"), "--hosts 'a,,b': host 2 is empty"),
                        (("--hostfile", tmp_path / "none"), "cannot read --hostfile")]:
        done = ratrain("run", pp2_program, "--steps", 1, *flags)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"ratrain: error: {says}"), done.stderr


@needs_root
@pytest.mark.mpi
def test_two_nodes_through_hosts_and_hostfile_match_one_host(state, pp2_program, tmp_path):
    """2 nodes x 1 rank, pp 2: `--hosts` and `--hostfile` runs give the one-host losses bit
    for bit, and the pipeline's activations crossed the shaped links."""
    program = pp2_program
    one_host = run_losses(program, tmp_path / "one.jsonl", env=state)
    name = unique_name("m")
    up = ratrain("cluster", "up", name, "--nodes", 2, "--ranks-per-node", 1,
                 "--link-bandwidth", "60MB/s", env=state)
    assert up.returncode == 0, up.stderr
    try:
        cluster = harness.read_cluster(name)
        hostfile = tmp_path / "hosts"
        hostfile.write_text("# one line per node\n10.213.0.1\n10.213.0.2:1\n")
        before = harness.link_counters(cluster)
        by_list = run_losses(program, tmp_path / "list.jsonl", "--cluster", name, "--hosts",
                             "10.213.0.1,10.213.0.2", env=state)
        by_file = run_losses(program, tmp_path / "file.jsonl", "--cluster", name,
                             "--hostfile", hostfile, env=state)
        after = harness.link_counters(cluster)
    finally:
        assert ratrain("cluster", "down", name, env=state).returncode == 0
    assert len(one_host) == STEPS
    assert by_list == one_host and by_file == one_host  # float equality: bit-identical
    activations = STEPS * planned_volume(program)[0]  # per run and direction, as planned
    for node in (0, 1):  # a qdisc counts payload and headers: at least both runs' payload
        sent = after[node][0] - before[node][0]
        assert sent >= 2 * activations, (node, sent, activations)


@needs_root
@pytest.mark.mpi
@pytest.mark.slow
def test_a_node_of_two_ranks_keeps_its_pipeline_off_the_link(state, tmp_path):
    """2 nodes x 2 ranks, pp 2 x dp 2: each node holds one replica's pipeline (ranks 2k,
    2k+1), so its link carries the gradient all-reduce alone (within 10% per step, start-up
    differenced away), and the losses equal one host's."""
    program = compile_tiny(tmp_path / "pp2dp2", "--pp", 2, "--dp", 2, "--micro-batches", 2)
    one_host = run_losses(program, tmp_path / "one.jsonl", "--lr-schedule", "constant",
                          env=state)
    name = unique_name("q")
    cluster = harness.bring_up(name, 2, 60e6, 0.0, ranks_per_node=2)
    sent = []
    try:
        for steps in (2, 4):
            before = harness.link_counters(cluster)
            done = ratrain("run", program, "--cluster", name, "--steps", steps, "--metrics",
                           tmp_path / f"c{steps}.jsonl", "--lr-schedule", "constant",
                           env=state)  # constant: a cosine's lr depends on --steps
            assert done.returncode == 0, done.stderr
            after = harness.link_counters(cluster)
            sent.append([after[n][0] - before[n][0] for n in (0, 1)])
    finally:
        harness.bring_down(name)
    assert losses(tmp_path / "c4.jsonl")[:2] == losses(tmp_path / "c2.jsonl") == one_host[:2]
    planned = planned_volume(program)  # rank -> bytes per step; all of it is the all-reduce
    for node in (0, 1):
        per_step = (sent[1][node] - sent[0][node]) / 2
        gradients = planned[2 * node] + planned[2 * node + 1]
        assert per_step == pytest.approx(gradients, rel=0.10), (node, per_step, gradients)


def test_hosts_of_a_run_on_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CLUSTER_STATE", str(tmp_path))
    cluster = Cluster("c", 3, 60e6, 0.0, ranks_per_node=2)
    assert cluster.addresses == ("10.213.0.1", "10.213.0.2", "10.213.0.3")
    assert cluster.hosts_for(4) == ("10.213.0.1", "10.213.0.2")
    assert cluster.hosts_for(2, ("10.213.0.3", "10.213.0.1")) == ("10.213.0.3", "10.213.0.1")
    with pytest.raises(ClusterError, match="host 10.213.0.9 is not a node of cluster c: its "
                       "nodes are 10.213.0.1, 10.213.0.2, 10.213.0.3"):
        cluster.hosts_for(2, ("10.213.0.1", "10.213.0.9"))
    with pytest.raises(ClusterError, match="4 ranks on 1 nodes of cluster c are more than "
                       "its 2 ranks per node"):
        cluster.hosts_for(4, ("10.213.0.1",))
    for ranks in (3, 8):
        with pytest.raises(ClusterError, match=f"a job of {ranks} ranks does not fill whole "
                           "nodes"):
            cluster.hosts_for(ranks)


def test_job_command_enters_rank_0s_node_and_names_every_node(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CLUSTER_STATE", str(tmp_path))
    cluster = Cluster("c", 2, 60e6, 0.0, ranks_per_node=2)
    environ = {"OMP_NUM_THREADS": "3"}  # the user's choice is kept: not passed again
    threads = str(max(1, (os.cpu_count() or 1) // 4))
    assert shared_core_env(4, environ) == {"OPENBLAS_NUM_THREADS": threads,
                                           "MKL_NUM_THREADS": threads}
    command = cluster.job_command("mpiexec", 4, ["python", "-m", "ratrain.rt", "D"],
                                  ("10.213.0.2", "10.213.0.1"), environ)
    assert command == [
        "ip", "netns", "exec", "rtc-c-n1", "mpiexec",
        "-genv", "MPIR_CVAR_CH4_NETMOD", "ofi", "-genv", "FI_PROVIDER", "tcp",
        "-genv", "FI_TCP_IFACE", "rtc0", "-genv", "OPENBLAS_NUM_THREADS", threads,
        "-genv", "MKL_NUM_THREADS", threads,
        "-launcher", "rsh", "-launcher-exec", str(tmp_path / "cluster-c.launcher"),
        "-hosts", "10.213.0.2:2,10.213.0.1:2", "-n", "4", "python", "-m", "ratrain.rt", "D"]


def test_launcher_runs_the_proxy_in_the_nodes_namespace():
    assert launcher_script(Cluster("c", 2, 60e6, 0.0)) == (
        "#!/bin/sh\n"
        "# hydra's launcher for the nodes of ratrain test cluster c\n"
        "host=$1\n"
        "shift\n"
        "case $host in\n"
        '    10.213.0.1) exec ip netns exec rtc-c-n0 /bin/sh -c "exec $*" ;;\n'
        '    10.213.0.2) exec ip netns exec rtc-c-n1 /bin/sh -c "exec $*" ;;\n'
        '    *) echo "ratrain: error: $host is not a node of cluster c" >&2\n'
        "       exit 1 ;;\n"
        "esac\n")


def test_cluster_up_sizes(capsys):
    from ratrain.cli.cluster import node_count
    from ratrain.errors import UserError
    assert node_count(None, 3, 2) == 3 and node_count(4, None, 2) == 2
    assert node_count(2, None, 1) == 2
    with pytest.raises(UserError, match="-n 3 ranks do not fill nodes of --ranks-per-node 2"):
        node_count(3, None, 2)


def test_a_cluster_is_described_by_its_nodes():
    from ratrain.cluster.harness import describe
    assert describe(Cluster("c", 2, 50e6, 0.0)) == \
        "2 nodes x 1 rank, 50.00 MB/s and 0.0 us per node link"
    assert describe(Cluster("c", 1, 50e6, 0.0, ranks_per_node=4)).startswith(
        "1 node x 4 ranks, 50.00 MB/s")
