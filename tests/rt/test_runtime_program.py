"""What a rank runs from: the program directory alone (no JAX, no passes, no CLI imported,
no recompile, no pickle), format checks with a one-line error, a program of this format
checked into tests/fixtures, and the arena peak measured while running equal to
plan_memory's peak on every rank."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratrain.cli import main as ratrain_main
from tiny_model import tiny_config

pytestmark = pytest.mark.mpi

FIXTURES = Path(__file__).parent.parent / "fixtures"
FIXTURE_LOSSES = [5.518395304679871, 5.516389846801758]  # as it ran when checked in

CONFIG = tiny_config(filled=False, num_hidden_layers=4, vocab_size=256,
                     initializer_range=None)

PROBE = """
import runpy, sys
sys.argv = ["ratrain.rt", *sys.argv[1:]]
try:
    runpy.run_module("ratrain.rt", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
heavy = sorted(m for m in sys.modules if m == "jax" or m.startswith(
    ("jax.", "ratrain.passes", "ratrain.cli", "ratrain.ir.trace")))
import os  # one file per rank: two ranks' prints interleave on mpiexec's stdout
with open(os.path.join(os.environ["PROBE_DIR"], "rank" + os.environ["PMI_RANK"]), "w") as f:
    f.write(f"imported: {heavy}")
"""


def compile_program(tmp_path, name, *flags):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    out = tmp_path / name
    assert ratrain_main(["compile", str(tmp_path / "config.json"), "--seq-len", "16",
                         "--micro-batches", "4", "--micro-batch-size", "2", *flags,
                         "-o", str(out)]) == 0
    return out, json.loads((out / "program.json").read_text())["world_size"]


def mpirun(ranks, *args):
    return subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_a_rank_imports_neither_jax_nor_the_compiler(tmp_path, monkeypatch):
    program, ranks = compile_program(tmp_path, "p", "--pp", "2", "--precision", "fp32")
    monkeypatch.setenv("PROBE_DIR", str(tmp_path))
    run = mpirun(ranks, "-c", PROBE, program, "--steps", "2", "--quiet")
    assert run.returncode == 0, run.stderr
    found = [(tmp_path / f"rank{r}").read_text() for r in range(ranks)]
    assert found == ["imported: []"] * ranks, found


def test_a_program_of_another_ratrain_version_runs_if_it_knows_the_format(tmp_path):
    """See NOTE [program format]: the format, not the version, decides."""
    program, ranks = compile_program(tmp_path, "p", "--precision", "fp32")
    manifest = json.loads((program / "program.json").read_text())
    manifest["ratrain_version"] = "0.0.0-other"
    (program / "program.json").write_text(json.dumps(manifest))
    run = mpirun(ranks, "-m", "ratrain.rt", program, "--steps", "1", "--quiet")
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("found, says", [
    ("ratrain-program/5", "older ratrain in ratrain-program/5 (pickled tables), which this "
                          "ratrain (ratrain-program/10) no longer reads: recompile it"),
    ("ratrain-program/99", "written in ratrain-program/99, which this ratrain does not know "
                           "(it reads ratrain-program/10, ratrain-program/9, ratrain-program/8, "
                           "ratrain-program/7, ratrain-program/6)")])
def test_a_format_this_runtime_does_not_read_is_one_line_error(tmp_path, found, says):
    program, ranks = compile_program(tmp_path, "p", "--precision", "fp32")
    manifest = json.loads((program / "program.json").read_text())
    manifest["format"] = found
    (program / "program.json").write_text(json.dumps(manifest))
    run = mpirun(ranks, "-m", "ratrain.rt", program, "--steps", "1")
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("ratrain: error:")]
    assert len(errors) == 1 and says in errors[0], run.stderr


def test_the_checked_in_program_of_format_6_still_runs(tmp_path):
    """tests/fixtures/program-format-6: a program written in format 6 (tiny model, pp 2,
    4 micro-batches), before calls named their layer (format 7): this runtime reads it,
    converting as it reads (program_format/codec.py), with the losses it had then. It
    predates format 10's function tables, so its own .pyx runs, with --trust-program-code
    only (NOTE [a program directory is data])."""
    fixture = tmp_path / "program"  # a copy: the test edits nothing, the run writes nothing
    shutil.copytree(FIXTURES / "program-format-6", fixture)
    manifest = json.loads((fixture / "program.json").read_text())
    assert manifest["format"] == "ratrain-program/6"
    metrics = tmp_path / "m.jsonl"
    # the losses were recorded at a constant lr
    run = mpirun(manifest["world_size"], "-m", "ratrain.rt", fixture, "--steps", "2",
                 "--quiet", "--metrics", metrics, "--seed", "0",
                 "--lr-schedule", "constant", "--trust-program-code")
    assert run.returncode == 0, run.stderr
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    assert losses == pytest.approx(FIXTURE_LOSSES, rel=1e-6)


def test_no_pickle_in_the_load_path():
    """The runtime and the program format read JSON and Cython only."""
    import ratrain.program_format as fmt
    import ratrain.rt as rt
    for package in (fmt, rt):
        for path in Path(package.__file__).parent.glob("*.py"):
            assert "import pickle" not in path.read_text(), path


@pytest.mark.parametrize("flags", [
    pytest.param(("--pp", "2", "--dp", "2", "--zero", "2", "--recompute", "selective"),
                 id="pp2dp2-zero2-selective", marks=pytest.mark.slow),
    pytest.param(("--pp", "4", "--recompute", "full", "--schedule", "baseline"),
                 id="pp4-baseline-full", marks=pytest.mark.slow),
    pytest.param(("--pp", "2", "--precision", "fp16", "--recompute", "auto"), id="pp2-fp16-auto",
                 marks=pytest.mark.slow),
])
def test_measured_arena_peak_equals_planned_peak(tmp_path, flags):
    flags = flags if "--precision" in flags else (*flags, "--precision", "fp32")
    program, ranks = compile_program(tmp_path, "p", *flags)
    metrics = tmp_path / "m.jsonl"
    run = mpirun(ranks, "-m", "ratrain.rt", program, "--steps", "2", "--quiet",
                 "--metrics", metrics)
    assert run.returncode == 0, run.stderr
    last = json.loads(metrics.read_text().splitlines()[-1])
    planned = [s["peak_bytes"] for s in json.loads((program / "program.json").read_text())
               ["stages"]]
    assert last["planned_peak_bytes"] == [planned[r % len(planned)] for r in range(ranks)]
    assert last["arena_peak_bytes"] == last["planned_peak_bytes"]


@pytest.mark.slow
def test_resume_with_other_data_is_one_line_error(tmp_path):
    import numpy as np
    program, ranks = compile_program(tmp_path, "p", "--precision", "fp32")
    np.save(tmp_path / "rows.npy", np.random.default_rng(0).integers(0, 256, (40, 17)))
    first = mpirun(ranks, "-m", "ratrain.rt", program, "--steps", "1", "--quiet",
                   "--data", tmp_path / "rows.npy", "--save-dir", tmp_path / "ckpt")
    assert first.returncode == 0, first.stderr
    again = mpirun(ranks, "-m", "ratrain.rt", program, "--steps", "2", "--quiet",
                   "--resume", tmp_path / "ckpt" / "step-000001")
    errors = [line for line in again.stderr.splitlines() if line.startswith("ratrain: error:")]
    assert again.returncode == 2 and len(errors) == 1 and "rows.npy" in errors[0], again.stderr
