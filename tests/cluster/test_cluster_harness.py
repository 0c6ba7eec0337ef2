"""The cluster harness: up makes the namespaces, shaped links and addresses it records;
down (and a run that fails or is interrupted) leaves nothing of them; without root or
iproute2 the command says so in one line. The scaling rule and link overrides."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cluster_helpers import (REASON, compile_tiny, harness_leftovers, needs_root, ratrain,
                             unique_name)
from ratrain.cluster import harness, netns
from ratrain.hw.topology import node_of
from ratrain.cluster.scaling import rank_compute_rate, scaled_link, with_link
from ratrain.units import parse_bandwidth, parse_latency
from ratrain.hw.profiles import load_profile


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RATRAIN_CLUSTER_STATE", str(tmp_path / "state"))
    return dict(os.environ, RATRAIN_CLUSTER_STATE=str(tmp_path / "state"))


@pytest.fixture(scope="module")
def pp2_program(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("cluster") / "pp2", "--pp", 2,
                        "--micro-batches", 2)


@needs_root
def test_up_makes_recorded_shaped_links_and_down_removes_them(state):
    name = unique_name("h")
    up = ratrain("cluster", "up", name, "-n", 2, "--link-bandwidth", "50MB/s", env=state)
    assert up.returncode == 0, up.stderr
    try:
        cluster = harness.read_cluster(name)
        assert (cluster.nodes, cluster.ranks_per_node, cluster.bandwidth) == (2, 1, 50e6)
        assert cluster.launcher.is_file() and os.access(cluster.launcher, os.X_OK)
        assert set(cluster.namespaces) <= set(netns.namespaces())
        for node in (0, 1):
            addresses = subprocess.run(["ip", "-n", cluster.node_namespace(node), "-j", "addr"],
                                       capture_output=True, text=True).stdout
            inet = [a["local"] for l in json.loads(addresses) for a in l["addr_info"]
                    if a["family"] == "inet"]
            assert inet == ["127.0.0.1", f"10.213.0.{node + 1}"]
            for where, device in ((cluster.node_namespace(node), "rtc0"),
                                  (cluster.switch, f"p{node}")):
                shown = json.loads(subprocess.run(
                    ["tc", "-j", "-n", where, "qdisc", "show", "dev", device],
                    capture_output=True, text=True).stdout)
                tbf = [q for q in shown if q["kind"] == "tbf"]
                assert tbf and tbf[0]["options"]["rate"] == 50e6
        in_root = [t for t in harness_leftovers(name) if not t.startswith("netns ")]
        assert in_root == []  # no link, qdisc or address in the root namespace
        status = ratrain("cluster", "status", name, env=state)
        assert "10.213.0.2" in status.stdout and "50.00 MB/s" in status.stdout
    finally:
        down = ratrain("cluster", "down", name, env=state)
    assert down.returncode == 0, down.stderr
    assert not any(n.startswith(f"rtc-{name}-") for n in netns.namespaces())
    assert harness_leftovers(name) == [] and not cluster.launcher.exists()
    again = ratrain("cluster", "down", name, env=state)
    assert again.returncode == 0 and "nothing of it was left" in again.stdout


@needs_root
def test_down_removes_namespaces_without_a_state_file(state):
    name = unique_name("s")
    harness.bring_up(name, 2, 40e6, 0.0)
    harness.state_path(name).unlink()  # e.g. /run was cleared
    assert ratrain("cluster", "down", name, env=state).returncode == 0
    assert not any(n.startswith(f"rtc-{name}-") for n in netns.namespaces())


@needs_root
def test_failed_runs_leave_nothing(state, pp2_program):
    name = unique_name("f")
    wrong = ratrain("run", pp2_program, "-n", 3, "--cluster", name, env=state)
    assert wrong.returncode == 2 and "ratrain: error:" in wrong.stderr
    bad_data = ratrain("run", pp2_program, "--cluster", name, "--steps", 2, "--data",
                       pp2_program / "missing.npy", env=state)
    # refused before the cluster comes up (its data is checked before anything is made)
    assert bad_data.returncode != 0 and "missing.npy" in bad_data.stderr
    assert f"cluster {name} up" not in bad_data.stderr
    assert harness_leftovers(name) == []
    assert not harness.state_path(name).exists()


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_nothing(state, pp2_program, stop):
    name = unique_name("i" + stop.name[3:].lower()[:3])
    job = subprocess.Popen([sys.executable, "-m", "ratrain.cli", "run", pp2_program,
                            "--cluster", name, "--steps", "100000"], env=state,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # a step ran: the ranks are inside the namespaces (phase lines come first)
        lines = iter(job.stdout.readline, "")
        assert any(line.startswith("step 1/") for line in lines), "no step ran"
        assert len([n for n in netns.namespaces() if n.startswith(f"rtc-{name}-")]) == 3
        job.send_signal(stop)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            harness.bring_down(name)
    assert job.returncode == 128 + stop  # the ranks stopped after a step (rt/stop.py)
    time.sleep(0.2)
    assert harness_leftovers(name) == []
    assert not harness.state_path(name).exists()


def test_without_root_one_error_line(monkeypatch, capsys):
    from ratrain.cli import main
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["cluster", "up", "x", "-n", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["ratrain: error: the cluster harness needs root (network namespaces and "
                   "tc): run as root"]


def test_without_iproute2_one_error_line(monkeypatch, capsys):
    from ratrain.cli import main
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    assert main(["cluster", "down", "x"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "ratrain: error: the cluster harness needs iproute2 (`ip` and `tc`), which is not "
        "installed"]


def test_skip_reason_is_one_line():
    assert REASON is None or "\n" not in REASON


def test_scaled_link_keeps_the_mt3000_bytes_per_flop():
    cpu, mt3000 = load_profile("cpu"), load_profile("mt3000")
    rate = cpu["threads"]["1"]["fp32_flops"] * cpu["gemm_efficiency"]
    assert rank_compute_rate(cpu) == rate
    bandwidth, latency = scaled_link()
    assert bandwidth / rate == pytest.approx(3.7e9 / (0.70 * 8.1e12))
    assert bandwidth == pytest.approx(mt3000["inter_node_bandwidth"] * rate / (0.70 * 8.1e12))
    assert latency == mt3000["inter_node_latency"] == 5e-6  # the node's port: a rank each


def test_link_overrides_and_units():
    profile = load_profile("cpu")
    assert with_link(profile, 62e6)["link_bandwidth"] == 62e6
    assert with_link(profile, 62e6)["link_latency"] == profile["link_latency"]
    assert with_link(profile, latency=1e-5)["link_latency"] == 1e-5
    assert profile["link_bandwidth"] == load_profile("cpu")["link_bandwidth"]  # a copy
    assert parse_bandwidth("62MB/s") == 62e6 and parse_bandwidth("500Mbit") == 62.5e6
    assert parse_bandwidth("61.7e6") == 61.7e6
    assert parse_latency("5us") == pytest.approx(5e-6) and parse_latency("0.1ms") == 1e-4
    for bad in ("fast", "-3MB", "0"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)


def test_bad_cluster_names_are_refused(capsys):
    from ratrain.cli import main
    assert main(["cluster", "status", "Bad-Name"]) == 2
    assert "cluster name 'Bad-Name'" in capsys.readouterr().err


def test_a_cluster_rank_is_a_node_whose_collectives_move_while_it_computes():
    """Each namespace has its own shaped link (its port) and TCP collectives progress
    through the runtime's helper thread: the simulator must not share a node between them
    nor stall their transfers (NOTE [manual progress])."""
    fields = harness.link_fields(harness.Cluster("t", 2, 61.67e6, 1e-4))
    node = node_of(load_profile("cpu") | fields | {"rank_threads": 1})
    assert (node.ranks, node.port_bandwidth, node.port_latency, node.progress_share) == \
        (1, 61.67e6, 1e-4, 1.0)
