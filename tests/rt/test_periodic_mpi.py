"""A periodic program (NOTE [periodic programs]) under mpiexec: the rows the runtime expands
from each stage's instance train exactly as the whole step compiled with --expand (same
losses, same weights bit for bit), and the arena peak the runtime measures is the plan's."""
import json

import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from rt_reference import HYPER, mpirun, random_workdir, read_metrics

pytestmark = pytest.mark.mpi

T, M, STEPS = 16, 40, 2
ZB1_M = 64   # zb1 repeats every 6 micro-batches on stage 0 of 2 (NOTE [zb1 periods]): worth_it


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return random_workdir(tmp_path_factory.mktemp("periodic"), T)


def _train(workdir, name: str, ranks: int, *flags):
    program = workdir / name
    micro_batches = ZB1_M if "zb1" in flags else M
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--micro-batches", str(micro_batches), "--precision", "fp32", *flags,
                         "-o", str(program)]) == 0
    metrics, saved = workdir / f"metrics-{name}.jsonl", workdir / f"saved-{name}"
    run = mpirun(ranks, program, "--steps", STEPS, "--data", workdir / "tokens.npy",
                 "--no-shuffle", "--metrics", metrics, "--save-dir", saved, *HYPER,
                 timeout=300)
    assert run.returncode == 0, run.stderr
    _, params = models.load_pretrained(saved / f"step-{STEPS:06d}")
    manifest = json.loads((program / "program.json").read_text())
    return read_metrics(metrics), params, manifest


@pytest.mark.parametrize("ranks,flags", [
    (2, ("--pp", "2")),
    pytest.param(2, ("--pp", "2", "--pipeline-schedule", "zb1"), marks=pytest.mark.slow),
    pytest.param(4, ("--pp", "2", "--dp", "2", "--zero", "3"), marks=pytest.mark.slow),
    pytest.param(4, ("--pp", "2", "--dp", "2", "--zero", "2", "--grad-accum", "scatter"),
                 marks=pytest.mark.slow)])
def test_periodic_program_trains_as_the_whole_step(workdir, ranks, flags):
    name = "-".join(flags).replace("--", "")
    periodic, params, manifest = _train(workdir, name, ranks, *flags)
    whole, whole_params, whole_manifest = _train(workdir, name + "-expand", ranks, *flags,
                                                 "--expand")
    assert [p["count"] > 1 for p in manifest["periods"].values()] == [True, True]
    assert whole_manifest["periods"] == {}
    assert [r["loss"] for r in periodic] == [r["loss"] for r in whole]
    assert all(np.array_equal(params[k], whole_params[k]) for k in params)
    planned = [s["peak_bytes"] for s in manifest["stages"]]
    assert planned == [s["peak_bytes"] for s in whole_manifest["stages"]]
    for record in periodic:  # the runtime counts live buffers by their arena bytes
        assert record["arena_peak_bytes"] == record["planned_peak_bytes"]
        assert sorted(set(record["planned_peak_bytes"])) == sorted(set(planned))
