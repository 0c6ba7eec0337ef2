"""`ratrain simulate DIR`: summary, JSON record, Chrome trace, picture and errors."""
import json

import pytest

from ratrain.cli import main


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "pp2dp2"
    assert main(["compile", "tiny", "--seq-len", "32", "--pp", "2", "--dp", "2",
                 "--micro-batches", "4", "-o", str(out)]) == 0
    return out


def test_json_record_and_trace(program_dir, tmp_path, capsys):
    trace = tmp_path / "step.json"
    capsys.readouterr()
    assert main(["simulate", str(program_dir), "--json", "--trace", str(trace)]) == 0
    out = capsys.readouterr()
    record = json.loads(out.out)
    manifest = json.loads((program_dir / "program.json").read_text())
    assert (record["pp"], record["dp"], record["hw"]) == (2, 2, "cpu")
    assert record["tokens_per_step"] == 2 * 4 * 1 * 32
    assert record["tokens_per_s"] == pytest.approx(256 / record["step_time_s"])
    assert [r["peak_bytes"] for r in record["ranks"]] == \
        [s["peak_bytes"] for s in manifest["stages"]]
    assert f"wrote {trace}" in out.err
    events = json.loads(trace.read_text())["traceEvents"]
    computed = {(e["pid"], e["name"]) for e in events if e["ph"] == "X"}
    # the step's last B is traced as its per-layer pieces (NOTE [sync issue point])
    assert {(0, "0F0"), (0, "0B2"), (0, "0B[L2]3"), (0, "0B[L0]3"), (1, "1F3"),
            (1, "1B0")} <= computed
    assert {e["pid"] for e in events if e["ph"] == "C"} == {0, 1}


def test_summary_on_another_profile_with_picture(program_dir, tmp_path, capsys):
    picture = tmp_path / "schedule.png"
    assert main(["simulate", str(program_dir), "--hw", "mt3000", "--algorithm", "tree",
                 "--schedule-png", str(picture)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("simulated tiny on mt3000 (uncalibrated profile): pp 2 x dp 2")
    assert "tokens/s" in out and "exposed tail" in out
    assert picture.stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["simulate", "{tmp}"], "is not a program directory"),
    (["simulate", "{program}", "--hw", "nosuch"], "unknown hardware profile 'nosuch'")])
def test_errors_are_one_line(program_dir, tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path, program=program_dir) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_periodic_program_simulates_as_its_whole_step(tmp_path, capsys):
    """See NOTE [periodic programs]: a long step is written as instances with periods; its
    simulation extends replays of instances and must equal the whole step's replay (the
    --trace path replays the whole step)."""
    out = tmp_path / "periodic"
    assert main(["compile", "tiny", "--seq-len", "32", "--pp", "2", "--micro-batches", "48",
                 "--hw", "mt3000", "-o", str(out)]) == 0
    assert json.loads((out / "program.json").read_text())["periods"]
    capsys.readouterr()
    assert main(["simulate", str(out), "--json"]) == 0
    periodic = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(out), "--json", "--trace", str(tmp_path / "t.json")]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert periodic["extended_from"] < 48
    assert periodic["step_time_s"] == pytest.approx(whole["step_time_s"], rel=1e-9)
    assert periodic["exposed_tail_s"] == pytest.approx(whole["exposed_tail_s"], rel=1e-9)
    assert [r["peak_bytes"] for r in periodic["ranks"]] == \
        [r["peak_bytes"] for r in whole["ranks"]]
