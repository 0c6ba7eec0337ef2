"""Placement in a compiled program (NOTE [placement]): program.json and runtime.json
record it and read it back, a format-7 program reads as pipeline-major, and DP-major
ranks train to the same losses and weights as pipeline-major ones under mpiexec."""
import json

import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from ratrain.program_format.codec import read_runtime, write_runtime
from rt_reference import HYPER, mpirun, random_workdir, read_metrics

T, M, B, STEPS = 16, 2, 2, 3


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return random_workdir(tmp_path_factory.mktemp("place"), T)


def compile_placed(workdir, placement: str):
    out = workdir / f"pp2dp2-{placement}"
    if not out.exists():
        assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                             "--pp", "2", "--dp", "2", "--micro-batches", str(M),
                             "--micro-batch-size", str(B), "--recompute", "none",
                             "--zero", "1", "--placement", placement, "-o", str(out)]) == 0
    return out


def test_the_program_records_its_placement(workdir):
    program = compile_placed(workdir, "dp")
    manifest = json.loads((program / "program.json").read_text())
    assert manifest["ranks"] == {"0": {"stage": 0, "replica": 0}, "1": {"stage": 0, "replica": 1},
                                 "2": {"stage": 1, "replica": 0}, "3": {"stage": 1, "replica": 1}}
    text = (program / "runtime.json").read_text()
    runtime = read_runtime(text, "runtime.json")
    assert runtime.options.placement == "dp" and runtime.coords(1) == (0, 1)
    assert write_runtime(runtime) == text


def test_a_format_7_program_reads_as_pipeline_major(workdir):
    record = json.loads((compile_placed(workdir, "dp") / "runtime.json").read_text())
    del record["options"]["placement"]  # format 7 wrote none
    record["format"] = "ratrain-program/7"
    runtime = read_runtime(json.dumps(record), "runtime.json")
    assert runtime.options.placement == "pipeline"
    assert [runtime.coords(r) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.mpi
@pytest.mark.slow
def test_dp_major_trains_as_pipeline_major(workdir):
    """The DP groups and pipeline peers are the same (stage, replica) pairs on other
    ranks: the same sums in the same order, so the same losses and weights, bit for bit."""
    losses, weights = {}, {}
    for placement in ("pipeline", "dp"):
        program = compile_placed(workdir, placement)
        metrics, saved = workdir / f"m-{placement}.jsonl", workdir / f"saved-{placement}"
        run = mpirun(4, program, "--steps", STEPS, "--data", workdir / "tokens.npy",
                     "--no-shuffle", "--metrics", metrics, "--save-dir", saved, *HYPER,
                     timeout=300)
        assert run.returncode == 0, run.stderr
        losses[placement] = [r["loss"] for r in read_metrics(metrics)]
        weights[placement] = models.load_pretrained(saved / f"step-{STEPS:06d}")[1]
    assert len(losses["dp"]) == STEPS and losses["dp"] == losses["pipeline"]
    assert all(np.array_equal(weights["dp"][k], weights["pipeline"][k]) for k in weights["dp"])
