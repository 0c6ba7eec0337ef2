"""`ratrain simulate DIR --against TRACE` (sim/against.py): a run's traced seconds per stage
and task kind beside the simulated ones, checked on traces written from a replay whose
every task took a known multiple of its simulated time."""
import json

import pytest

from ratrain.cli import main
from ratrain.compiler import recompile
from ratrain.hw import load_profile
from ratrain.programs import read_manifest
from ratrain.sim import simulate
from ratrain.sim.against import against


@pytest.fixture(scope="module")
def pp2dp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("against") / "pp2dp2"
    assert main(["compile", "tiny", "--seq-len", "32", "--pp", "2", "--dp", "2",
                 "--micro-batches", "4", "-o", str(out)]) == 0
    program = recompile(read_manifest(out))
    return out, simulate(program, load_profile("cpu"))


def write_traces(sim, directory, factor, steps=4, gap=0.0):
    """trace-rank<R>.json of every rank of the job, as `ratrain run --trace` writes them:
    rank r of stage s ran each of its stage's tasks in factor(r, step) x its simulated time,
    back to back, with `gap` microseconds between steps."""
    program, replay = sim.program, sim.replay
    directory.mkdir(parents=True, exist_ok=True)
    for stage in range(program.options.pp):
        spans = replay.spans[program.rank(stage, 0)]
        for replica in range(program.options.dp):
            rank, events, now = program.rank(stage, replica), [], 0.0
            for step in range(1, steps + 1):
                for span in spans:
                    dur = (span.end - span.reached) * factor(rank, step) * 1e6
                    events.append({"name": str(span.task), "ph": "X", "pid": rank, "tid": 0,
                                   "ts": now, "dur": dur, "args": {"step": step}})
                    now += dur
                now += gap
            (directory / f"trace-rank{rank}.json").write_text(json.dumps(
                {"traceEvents": [{"name": "process_name", "ph": "M", "pid": rank}] + events}))


def rows_of(text):
    """(stage, kind) -> (measured, simulated, fewest, most) ms from the printed table, each
    rounded to 0.01 ms (so a multiple of one is within 0.02 of the other)."""
    rows = {}
    for line in text.splitlines()[2:-1]:
        stage, kind, measured, simulated, _, replicas = line.split()
        fewest, most = replicas.split("-")
        rows[int(stage), kind] = tuple(map(float, (measured, simulated, fewest, most)))
    return rows


def test_every_kind_of_every_stage_at_the_factor_it_ran(pp2dp2, tmp_path):
    """Replica 0 ran 1.25x its simulated times from step 3 on (steps 1-2, left out, ran
    3x); replica 1 of stage 1 ran 1.5x: the rows show 1.25x and the range 1.25-1.5."""
    directory, sim = pp2dp2
    slow = sim.program.rank(1, 1)
    write_traces(sim, tmp_path / "trace",
                 lambda rank, step: 3.0 if step <= 2 else 1.5 if rank == slow else 1.25)
    rows = rows_of(against(sim, tmp_path / "trace", skip=2).text())
    kinds = {(s, str(span.task.kind)) for s in (0, 1)
             for span in sim.replay.spans[sim.program.rank(s, 0)]}
    assert set(rows) == kinds | {(0, "all"), (1, "all")}
    for (stage, kind), (measured, simulated, fewest, most) in rows.items():
        assert measured == pytest.approx(1.25 * simulated, abs=0.02)
        assert fewest == pytest.approx(measured, abs=0.02)
        assert most == pytest.approx((1.5 if stage == 1 else 1.25) * simulated, abs=0.02)
    assert rows[0, "F"][1] > 0 and rows[1, "B"][1] > 0


def test_the_step_runs_from_a_step_s_first_task_to_the_next_s(pp2dp2, tmp_path):
    """The traced tasks run back to back with 1 ms between steps, so rank 0's step is its
    tasks' sum, 1.25x its simulated sum, and 1 ms (the last step, with no next one, has
    no gap, and the median of 3 leaves it out); the slow replica's rank is the most."""
    directory, sim = pp2dp2
    slow = sim.program.rank(1, 1)
    write_traces(sim, tmp_path / "trace", lambda rank, step: 1.5 if rank == slow else 1.25,
                 steps=5, gap=1000.0)
    text = against(sim, tmp_path / "trace", skip=2).text()
    step = text.splitlines()[-1]
    measured = float(step.split("measured ")[1].split(" ms")[0])
    fewest, most = map(float, step.split("every rank ")[1].split(")")[0].split("-"))
    spans = sim.replay.spans
    total = {r: sum(s.end - s.reached for s in spans[sim.program.rank(r, 0)]) for r in (0, 1)}
    assert measured == pytest.approx(1.25e3 * total[0] + 1, abs=0.01)
    assert most == pytest.approx(1.5e3 * total[1] + 1, abs=0.01)
    assert fewest == pytest.approx(1.25e3 * min(total.values()) + 1, abs=0.01)
    assert f"simulated {1e3 * sim.step_time:.2f} ms" in step
    assert f"error {sim.step_time / (measured / 1e3) - 1:+.1%}" in step


def test_json_record_holds_the_comparison_in_seconds(pp2dp2, tmp_path, capsys):
    directory, sim = pp2dp2
    write_traces(sim, tmp_path / "trace", lambda rank, step: 2.0, steps=3)
    capsys.readouterr()
    assert main(["simulate", str(directory), "--json", "--against", str(tmp_path / "trace"),
                 "--skip-steps", "1"]) == 0
    out = capsys.readouterr()
    record = json.loads(out.out)["against"]
    assert record["steps"] == [2, 3] and not out.err
    assert record["step_s"]["simulated"] == pytest.approx(sim.step_time)
    f0 = next(r for r in record["rows"] if (r["stage"], r["kind"]) == (0, "F"))
    assert f0["simulated_s"] > 0 and f0["measured_s"] == pytest.approx(2 * f0["simulated_s"])
    assert f0["fewest_s"] == f0["most_s"] == pytest.approx(f0["measured_s"])


def test_cli_prints_the_table_under_the_summary(pp2dp2, tmp_path, capsys):
    directory, sim = pp2dp2
    write_traces(sim, tmp_path / "trace", lambda rank, step: 1.0, steps=3)
    capsys.readouterr()
    assert main(["simulate", str(directory), "--against", str(tmp_path / "trace"),
                 "--skip-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.index("step ") < out.index("median of steps 2-3")
    assert "    1  B " in out and "1.00x" in out


@pytest.mark.parametrize("case, message", [
    ("empty", "holds no trace-rank<R>.json; write them with `ratrain run DIR --trace"),
    ("few steps", "has no task after its first 2 steps; trace more steps"),
    ("one rank", "the trace has no file of rank 3 (stage 1)"),
    ("other program", "holds task 0F9, which stage 0 of this program does not run"),
    ("not a trace", "is not a trace of `ratrain run --trace`"),
])
def test_a_trace_that_does_not_fit_is_one_line_naming_it(pp2dp2, tmp_path, capsys, case,
                                                         message):
    directory, sim = pp2dp2
    trace = tmp_path / "trace"
    trace.mkdir()
    if case != "empty":
        write_traces(sim, trace, lambda rank, step: 1.0, steps=2 if case == "few steps" else 3)
    if case == "one rank":
        (trace / "trace-rank3.json").unlink()
    if case == "other program":
        path = trace / "trace-rank0.json"
        path.write_text(path.read_text().replace('"0F0"', '"0F9"'))
    if case == "not a trace":
        (trace / "trace-rank0.json").write_text("[1, 2]")
    capsys.readouterr()
    assert main(["simulate", str(directory), "--against", str(trace)]) == 2
    out = capsys.readouterr()
    assert message in out.err and out.err.count("\n") == 1 and not out.out, out
