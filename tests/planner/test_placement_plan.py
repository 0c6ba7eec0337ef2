"""The planner chooses the placement (NOTE [placement]): on nodes of two ranks joined by
a slow link it keeps DP groups within nodes, and the simulator agrees that the placement
it chose is faster than pipeline-major; the machine flags and file reach the profile."""
import json
from dataclasses import replace

import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.hw.topology import dp_group_nodes
from ratrain.planner import Planner, Search
from ratrain.sim import simulate

CPU = load_profile("cpu")
# two ranks a node, 1 MB/s between nodes: a DP group across nodes waits on the port
SLOW_PORT = CPU | {"ranks_per_node": 2, "inter_node_bandwidth": 1e6, "inter_node_latency": 1e-4}


def tiny_search(profile: dict) -> Search:
    return Search(models.get_config("tiny"), "tiny", 8, 32, profile, 10**9)


def test_a_slow_inter_node_link_keeps_dp_groups_within_nodes():
    search = tiny_search(SLOW_PORT)
    best = Planner(search).plan(4).best
    options = best.candidate.options(search)
    assert (best.pp, best.dp, best.placement, best.bound) == (2, 2, "dp", "port")
    assert [dp_group_nodes(options.rank_placement, s, 2) for s in range(2)] == [(2,), (2,)]
    pipeline = replace(options, placement="pipeline")
    program = compile_graph(trace_for(models.get_config("tiny"), "tiny", pipeline), pipeline)[0]
    other = simulate(program, SLOW_PORT).step_time
    assert [dp_group_nodes(pipeline.rank_placement, s, 2) for s in range(2)] == [(1, 1)] * 2
    assert best.step_time_s < 0.8 * other, (best.step_time_s, other)


def test_one_rank_a_node_leaves_one_placement():
    """Every rank its own node: no order of ranks keeps anything within a node."""
    plan = Planner(tiny_search(CPU | {"ranks_per_node": 1})).plan(4)
    assert {r.placement for r in plan.rows} == {"pipeline"}


def test_the_machine_file_and_flags_give_the_nodes(tmp_path, capsys):
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"profile": "cpu", "nodes": 2, "ranks_per_node": 2,
                                   "inter_node_bandwidth": 1e6, "inter_node_latency": 1e-4}))
    assert ratrain_main(["plan", "tiny", "--machine", str(machine), "--global-batch", "8",
                         "--seq-len", "32", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["clusters"] == 4
    assert ratrain_main(["plan", "tiny", "--machine", str(machine), "--global-batch", "8",
                         "--seq-len", "32", "--top", "1"]) == 0
    assert capsys.readouterr().out.startswith(
        "plan tiny on 4 cpu ranks (2 nodes of 2 ranks, each node's port 0.001 GB/s): ")
    best = record["rows"][0]
    assert (best["pp"], best["dp"], best["placement"], best["bound"]) == (2, 2, "dp", "port")
    assert ratrain_main(["plan", "tiny", "--nodes", "2", "--ranks-per-node", "2",
                         "--inter-node-bandwidth", "1MB/s", "--inter-node-latency", "100us",
                         "--global-batch", "8", "--seq-len", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0] == best


@pytest.mark.parametrize("flags, says", [
    (["--nodes", "2", "--ranks-per-node", "2", "--clusters", "8"],
     "--clusters 8 differs from the machine's 2 nodes x 2 ranks"),
    (["--machine", "{bad}"], "unknown field(s) racks"),
    (["--machine", "{bad}", "--hw", "mt3000"], "unknown field(s) racks")])
def test_machine_errors_are_one_line(tmp_path, capsys, flags, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"racks": 2}))
    flags = [f.replace("{bad}", str(bad)) for f in flags]
    assert ratrain_main(["plan", "tiny", "--global-batch", "8", "--seq-len", "32",
                         *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ratrain: error:") and says in err[0], err


def test_compile_plan_records_the_chosen_placement(tmp_path, capsys):
    out = tmp_path / "prog"
    assert ratrain_main(["compile", "tiny", "--plan", "--nodes", "2", "--ranks-per-node", "2",
                         "--inter-node-bandwidth", "1MB/s", "--inter-node-latency", "100us",
                         "--global-batch", "8", "--seq-len", "32", "-o", str(out)]) == 0
    assert "pp 2 x dp 2 (dp-major)" in capsys.readouterr().out
    manifest = json.loads((out / "program.json").read_text())
    assert manifest["options"]["placement"] == "dp"
    assert manifest["ranks"]["1"] == {"stage": 0, "replica": 1}
