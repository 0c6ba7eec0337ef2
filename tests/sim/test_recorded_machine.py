"""One configuration, one number (NOTE [recorded machine]): a program compiled with --plan
records the machine it was planned for, so `ratrain simulate DIR` with no flags and
`compile --report` print the plan row's step; the machine flags override the record."""
import contextlib
import io
import json
import re

import pytest

from ratrain.cli import main
from ratrain.hw.machine import Machine, profile_identity, profile_sha256
from ratrain.hw.profiles import load_profile

# two nodes of two ranks joined by a 1 MB/s port: a plan whose step the port dominates, so
# a program simulated without its machine (each rank its own node on the profile's links,
# as before programs recorded one) is 4.6x faster than its plan row
MACHINE = ["--nodes", "2", "--ranks-per-node", "2", "--inter-node-bandwidth", "1MB/s"]
PLAN = ["tiny", *MACHINE, "--global-batch", "8", "--seq-len", "32", "--simulate", "1"]


def printed_step(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.M)
    assert match, text
    return float(match[1])


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(program directory, compile --plan --report's stdout)."""
    out = tmp_path_factory.mktemp("machine") / "prog"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["compile", *PLAN, "--plan", "--report", "-o", str(out)]) == 0
    return out, printed.getvalue()


def simulate_json(directory, *flags) -> dict:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["simulate", str(directory), "--json", *flags]) == 0
    return json.loads(printed.getvalue())


def test_simulate_and_report_print_the_plan_rows_step(planned):
    directory, text = planned
    row = printed_step(r"^planned for 4 ranks: .*\(simulated step ([\d.]+) s", text)
    report = printed_step(r"^simulated step ([\d.]+) s on cpu \(sha256 \w{12}\), 2 nodes of "
                          r"2 ranks, each node's port 0.001 GB/s", text)
    simulated = simulate_json(directory)
    assert report == pytest.approx(row, rel=1e-3)
    assert simulated["step_time_s"] == pytest.approx(row, rel=1e-3)
    assert re.search(r"^dry run \(ordering check, not the step time\) on cpu .*: dry-run "
                     r"step [\d.e-]+ s", text, re.M)
    assert simulated["machine"] == json.loads((directory / "program.json").read_text())[
        "machine"] == {"profile": "cpu", "nodes": 2, "ranks_per_node": 2,
                       "inter_node_bandwidth": 1e6,
                       "profile_sha256": profile_sha256(load_profile("cpu"))}


def test_machine_flags_override_the_recorded_machine(planned):
    directory, _ = planned
    recorded = simulate_json(directory)["step_time_s"]
    faster = simulate_json(directory, "--inter-node-bandwidth", "1GB/s")
    one_node = simulate_json(directory, "--nodes", "1")
    assert faster["machine"]["inter_node_bandwidth"] == 1e9
    assert one_node["machine"]["ranks_per_node"] == 4
    assert faster["step_time_s"] < recorded / 2 and one_node["step_time_s"] < recorded / 2
    swapped = simulate_json(directory, "--hw", "mt3000")["machine"]  # the nodes stay
    assert (swapped["profile"], swapped["nodes"], swapped["profile_sha256"]) == \
        ("mt3000", 2, profile_sha256(load_profile("mt3000")))


@pytest.mark.parametrize("flags, says", [
    (["--nodes", "3"], "--nodes 3 does not divide the program's 4 ranks"),
    (["--nodes", "2", "--ranks-per-node", "4"], "the machine's 2 nodes x 4 ranks differ "
                                                "from the program's 4 ranks")])
def test_a_machine_that_does_not_hold_the_program_is_one_line(planned, capsys, flags, says):
    directory, _ = planned
    assert main(["simulate", str(directory), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ratrain: error: ") and says in err, err


def test_the_record_reads_back_and_names_files_absolutely(tmp_path, monkeypatch):
    machine = Machine(profile="mt3000", nodes=4, ranks_per_node=8, link_latency=0.0)
    record = machine.record(load_profile("mt3000"))
    assert Machine.of_record(record) == machine and Machine.of_record({}) == Machine()
    (tmp_path / "mine.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert profile_identity("mine.json") == str(tmp_path / "mine.json")
    assert profile_identity("cpu") == "cpu"
