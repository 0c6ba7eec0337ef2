"""End to end: `mpiexec -n W python -m ratrain.rt DIR` trains a tiny model with the loss
curve of a single-process JAX reference (whole global batch, same AdamW), for pipeline
and data parallelism; set-up errors are one line and a non-zero exit, whether the job
is started by mpiexec or by `ratrain run`."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from rt_reference import (CONFIG, HYPER, OPTIMIZER, SEED, mpirun, random_workdir,
                          read_metrics, reference)

pytestmark = pytest.mark.mpi

T, M, B, STEPS = 16, 2, 2, 3


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return random_workdir(tmp_path_factory.mktemp("rt"), T)


def compile_program(workdir, pp, dp, *extra):
    out = workdir / f"pp{pp}dp{dp}{''.join(extra)}"
    if not out.exists():
        assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                             "--pp", str(pp), "--dp", str(dp), "--micro-batches", str(M),
                             "--micro-batch-size", str(B), "--recompute", "none",
                             *extra, "-o", str(out)]) == 0
    return out


def _relative(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("pp,dp,extra", [
    (1, 1, ()), pytest.param(2, 1, (), marks=pytest.mark.slow),
    pytest.param(1, 2, (), marks=pytest.mark.slow),
    pytest.param(1, 2, ("--zero", "2", "--clip", "0.5"), marks=pytest.mark.slow),
    pytest.param(2, 2, ("--zero", "1", "--recompute", "selective"), marks=pytest.mark.slow),
    pytest.param(2, 2, ("--zero", "2", "--grad-accum", "scatter", "--schedule", "baseline"),
                 marks=pytest.mark.slow),
    pytest.param(1, 3, ("--zero", "2", "--grad-accum", "scatter"),  # uneven shards
                 marks=pytest.mark.slow)])
def test_loss_curve_matches_single_process_reference(workdir, pp, dp, extra):
    program = compile_program(workdir, pp, dp, *extra)
    metrics = workdir / f"metrics-{program.name}.jsonl"
    saved = workdir / f"saved-{program.name}"
    run = mpirun(pp * dp, program, "--steps", STEPS, "--data", workdir / "tokens.npy",
                 "--no-shuffle", "--metrics", metrics, "--save-dir", saved, *HYPER)
    assert run.returncode == 0, run.stderr
    records = read_metrics(metrics)
    clip = float(extra[-1]) if "--clip" in extra else None
    expected, params = reference(CONFIG, SEED, np.load(workdir / "tokens.npy"), dp * M * B,
                                 STEPS, OPTIMIZER, clip)
    assert [r["loss"] for r in records] == pytest.approx(expected, rel=1e-4)
    _, trained = models.load_pretrained(saved / f"step-{STEPS:06d}")
    assert trained.keys() == params.keys()
    assert max(_relative(trained[k], params[k]) for k in params) < 1e-4
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    manifest = json.loads((program / "program.json").read_text())
    planned = [manifest["stages"][manifest["ranks"][str(r)]["stage"]]["arena_bytes"]
               for r in range(pp * dp)]
    for r in records:
        assert r["arena_bytes"] == planned and len(r["rss_bytes"]) == pp * dp
        assert r["tokens_per_s"] > 0 and min(r["rss_bytes"]) > 0
    assert "done: 3 steps" in run.stdout


def launch(launcher: str, ranks: int, program, *args):
    """The job started by mpiexec directly or by `ratrain run -n ranks`."""
    if launcher == "mpiexec":
        return mpirun(ranks, program, *args)
    return subprocess.run([sys.executable, "-m", "ratrain.cli", "run", str(program),
                           "-n", str(ranks), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def one_error_line(run) -> str:
    assert run.returncode != 0
    lines = [l for l in run.stderr.splitlines() if l.startswith("ratrain:")]
    assert len(lines) == 1 and lines[0].startswith("ratrain: error: "), run.stderr
    return lines[0]


LAUNCHERS = pytest.mark.parametrize("launcher", ["mpiexec", "ratrain run"])


@LAUNCHERS
def test_wrong_world_size_is_one_line_error(workdir, launcher):
    line = one_error_line(launch(launcher, 1, compile_program(workdir, 2, 1), "--steps", 1,
                                 "--data", workdir / "tokens.npy"))
    assert "compiled for 2 ranks" in line and "but this job has 1" in line
    assert "mpiexec -n 2" in line and "-n 2`" in line


@LAUNCHERS
def test_missing_data_file_is_one_line_error(workdir, launcher):
    line = one_error_line(launch(launcher, 2, compile_program(workdir, 2, 1), "--steps", 1,
                                 "--data", workdir / "no-such.npy"))
    assert f"cannot read --data {workdir / 'no-such.npy'}" in line


@LAUNCHERS
@pytest.mark.parametrize("file, says", [("rank0.txt", "corrupted: rank0.txt does not match"),
                                        ("program.json", "program.json is corrupted")])
def test_corrupted_program_is_one_line_error(workdir, tmp_path, launcher, file, says):
    program = tmp_path / "corrupt"
    shutil.copytree(compile_program(workdir, 1, 1), program)
    (program / file).write_text("tampered\n")
    line = one_error_line(launch(launcher, 1, program, "--steps", 1,
                                 "--data", workdir / "tokens.npy"))
    assert says in line and line.endswith("recompile it")


FAILING_RANK = """
import os, sys
import ratrain.rt.calls as calls
def broken_update(transport, st, call):
    if st.rank == 1:
        raise RuntimeError("injected failure")
    return adamw(transport, st, call)
adamw, calls.CALLS["adamw"] = calls.CALLS["adamw"], broken_update
from ratrain.rt.run import main
sys.exit(main(sys.argv[1:]))
"""


def test_failure_on_one_rank_aborts_the_job_with_one_line(workdir):
    program = compile_program(workdir, 2, 1)
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", FAILING_RANK,
                          str(program), "--steps", "2", "--data", str(workdir / "tokens.npy")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    lines = [l for l in run.stderr.splitlines() if l.startswith("ratrain:")]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("ratrain: rank 1 failed at task 1UPD[")
    assert "(call adamw, L" in lines[0] and "injected failure" in lines[0]


def test_init_from_checkpoint_equals_seeded_start(workdir):
    checkpoint = workdir / "checkpoint"
    models.save_pretrained(checkpoint, CONFIG, models.init_params(CONFIG, SEED))
    program, data = compile_program(workdir, 2, 1), workdir / "tokens.npy"
    runs = {}
    for name, start in (("seed", ["--seed", SEED]), ("ckpt", ["--init-from", checkpoint])):
        metrics = workdir / f"init-{name}.jsonl"
        run = mpirun(2, program, "--steps", 1, "--data", data, "--no-shuffle",
                     "--metrics", metrics, *start)
        assert run.returncode == 0, run.stderr
        runs[name] = read_metrics(metrics)[0]["loss"]
    assert runs["seed"] == runs["ckpt"]
