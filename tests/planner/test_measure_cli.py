"""`ratrain plan --measure K` (NOTE [choosing by measuring]): refused in one line where the
plan is for another machine, nothing run; the measured row is the program the printed
compile command writes; and under mpiexec the acceptance run measures 3 rows and picks
the one that measured fastest."""
import json
import re
from pathlib import Path

import pytest

import ratrain.cli.measure as cli_measure
import ratrain.planner.measure as measure
from ratrain.cli import main

PLAN = ["plan", "tiny", "--clusters", "2", "--global-batch", "8"]


@pytest.mark.parametrize("flags, why", [
    (["--hw", "mt3000"], "the plan is for mt3000 ranks"),
    (["--nodes", "2"], "--nodes describes another machine"),
    (["--link-bandwidth", "1GB/s"], "--link-bandwidth describes another machine"),
    (["--json"], "drop --json")])
def test_another_machine_is_refused_in_one_line(flags, why, tmp_path, capsys):
    kept = tmp_path / "kept"
    assert main(PLAN + ["--measure", "2", "--measure-dir", str(kept), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and why in err
    assert not kept.exists()


def test_more_ranks_than_cores_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(cli_measure, "this_machine_cores", lambda: 1)
    assert main(PLAN + ["--measure", "1"]) == 2
    assert "this machine has 1 core for the plan's 2 ranks" in capsys.readouterr().err


def test_a_used_measure_dir_is_refused(tmp_path, capsys):
    (tmp_path / "old").write_text("")
    assert main(PLAN + ["--measure", "1", "--measure-dir", str(tmp_path)]) == 2
    assert "is not an empty directory" in capsys.readouterr().err


class CompileOnly(cli_measure.MpiRunner):
    """The real compile, a fake run of 50 ms steps."""

    def run(self, program, steps, trace, metrics, log):
        trace.mkdir()
        return [0.05] * steps


def test_the_measured_program_is_the_one_the_printed_command_compiles(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr(cli_measure, "MpiRunner", CompileOnly)
    kept = tmp_path / "kept"
    assert main(PLAN + ["--seq-len", "32", "--measure", "1", "--measure-dir", str(kept)]) == 0
    out = capsys.readouterr().out
    assert "row 1 of 1: measured step 0.05 s" in out
    assert "picked row 1, the fastest measured (0.05 s a step; the plan's best too)" in out
    command = re.search(r"compile it: ratrain (compile .*) -o DIR", out).group(1).split()
    assert main([*command, "-o", str(tmp_path / "again")]) == 0
    measured, again = (json.loads((d / "program.json").read_text())
                       for d in (kept / "row1" / "program", tmp_path / "again"))
    assert measured == again
    assert f"ratrain calibrate --from {kept}/row1/trace -o {kept}/traced.json" in out


@pytest.mark.mpi
def test_measure_3_runs_the_rows_and_picks_the_fastest_measured(tmp_path, capsys,
                                                                  monkeypatch):
    """The acceptance command (ratrain plan tiny --clusters 2 --global-batch 8 --measure
    3), with shorter runs: sequences of 32 tokens, 2 warm-up steps and about 1 s of steps
    a row."""
    monkeypatch.setattr(measure, "MEASURE_SECONDS", 1.0)
    kept = tmp_path / "kept"
    assert main(PLAN + ["--seq-len", "32", "--measure", "3", "--measure-dir", str(kept)]) == 0
    out = capsys.readouterr().out
    progress = [line.strip() for line in out.splitlines() if line.startswith("  row ")]
    assert [line[:11] for line in progress] == [f"row {i} of 3:" for i in (1, 1, 2, 2, 3, 3)]
    records = [json.loads((kept / f"row{i}" / measure.RECORD).read_text()) for i in (1, 2, 3)]
    fastest = min(records, key=lambda r: r["measured_step_s"])
    assert f"picked row {fastest['row']}, the fastest measured " \
           f"({fastest['measured_step_s']:.4g} s a step" in out
    for r in records:
        assert len(r["step_seconds"]) >= measure.WARMUP_STEPS + measure.MIN_MEASURED
        assert sorted(p.name for p in (kept / f"row{r['row']}" / "trace").iterdir()) == \
            ["trace-rank0.json", "trace-rank1.json"]
    assert f"--from {kept}/row1/trace --from {kept}/row2/trace --from {kept}/row3/trace" in out
    assert not [p for p in Path(kept).iterdir() if p.name not in ("row1", "row2", "row3")]
