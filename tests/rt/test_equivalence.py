"""FP32 equivalence: every pipeline x data-parallel layout, ZeRO stage and schedule trains
the tiny model for 100 steps with the loss of the single-process JAX reference at every
step (1e-4 relative). All layouts share one global batch, hence one reference."""
import numpy as np
import pytest

from ratrain.cli import main as ratrain_main
from ratrain.optim import AdamW
from rt_reference import CONFIG, mpirun, read_metrics, reference, write_workdir

pytestmark = pytest.mark.mpi

T, M, G, STEPS, SEED, ROWS = 16, 4, 8, 100, 5, 400  # ROWS < STEPS * G: the data wraps
OPTIMIZER = AdamW(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1)
HYPER = ["--lr", "3e-3", "--lr-schedule", "constant", "--eps", "1e-6", "--weight-decay", "0.1",
         "--seed", str(SEED)]
CASES = [(pp, dp, zero, schedule) for pp, dp in ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1))
         for zero in (0, 2) for schedule in ("ratrain", "baseline")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return write_workdir(tmp_path_factory.mktemp("equivalence"), CONFIG, ROWS, T)


@pytest.fixture(scope="module")
def expected(workdir):
    return reference(CONFIG, SEED, np.load(workdir / "tokens.npy"), G, STEPS, OPTIMIZER)[0]


def test_reference_loss_falls_far_enough_to_tell_runs_apart(expected):
    assert expected[0] > 4.0 and expected[-1] < expected[0] / 4


QUICK = {(2, 1, 0, "ratrain")}                        # a pipeline run


@pytest.mark.parametrize("pp,dp,zero,schedule", [
    pytest.param(*case, id="pp{}-dp{}-zero{}-{}".format(*case),
                 marks=() if case in QUICK else pytest.mark.slow) for case in CASES])
def test_every_step_loss_matches_reference(workdir, expected, pp, dp, zero, schedule):
    program = workdir / f"pp{pp}-dp{dp}-zero{zero}-{schedule}"
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--pp", str(pp), "--dp", str(dp), "--zero", str(zero),
                         "--schedule", schedule, "--micro-batches", str(M),
                         "--micro-batch-size", str(G // (M * dp)), "--recompute", "none",
                         "--precision", "fp32", "-o", str(program)]) == 0
    metrics = workdir / f"{program.name}.jsonl"
    run = mpirun(pp * dp, program, "--steps", STEPS, "--no-shuffle", "--data",
                 workdir / "tokens.npy", "--metrics", metrics, "--quiet", *HYPER)
    assert run.returncode == 0, run.stderr
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in records] == pytest.approx(expected, rel=1e-4)
