"""Tied input/output embeddings under MPI (NOTE [tied weights]): with the embedding on the
first stage and the head on the last, 30 steps follow the single-process JAX reference at
every step, and the checkpoint holds the matrix once and loads in transformers with the
same loss."""
import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from ratrain.optim import AdamW
from rt_reference import (CONFIG, mpirun, progression_rows, read_metrics, reference,
                          write_workdir)

pytestmark = pytest.mark.mpi

TIED = models.fill_defaults(dict(CONFIG, tie_word_embeddings=True))
T, M, G, STEPS, SEED, ROWS = 16, 4, 8, 30, 3, 400
OPTIMIZER = AdamW(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1)
HYPER = ["--lr", "3e-3", "--lr-schedule", "constant", "--eps", "1e-6", "--weight-decay", "0.1",
         "--seed", str(SEED)]
CASES = [(2, 1, 0), (2, 2, 2)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return write_workdir(tmp_path_factory.mktemp("tied"), TIED, ROWS, T)


@pytest.fixture(scope="module")
def expected(workdir):
    return reference(TIED, SEED, np.load(workdir / "tokens.npy"), G, STEPS, OPTIMIZER)


def _train(workdir, pp, dp, zero):
    program = workdir / f"pp{pp}-dp{dp}-zero{zero}"
    assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                         "--pp", str(pp), "--dp", str(dp), "--zero", str(zero),
                         "--micro-batches", str(M), "--micro-batch-size", str(G // (M * dp)),
                         "--recompute", "none", "-o", str(program)]) == 0
    metrics, saved = workdir / f"{program.name}.jsonl", workdir / f"{program.name}-ckpt"
    run = mpirun(pp * dp, program, "--steps", STEPS, "--no-shuffle", "--data",
                 workdir / "tokens.npy", "--metrics", metrics, "--quiet",
                 "--save-dir", saved, *HYPER)
    assert run.returncode == 0, run.stderr
    return read_metrics(metrics), saved / f"step-{STEPS:06d}"


@pytest.mark.parametrize("pp,dp,zero", [
    pytest.param(*case, id="pp{}-dp{}-zero{}".format(*case),
                 marks=() if case == CASES[0] else pytest.mark.slow) for case in CASES])
def test_tied_training_matches_reference_and_loads_in_transformers(workdir, expected, pp, dp,
                                                                  zero):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    records, checkpoint = _train(workdir, pp, dp, zero)
    losses, params = expected
    assert [r["loss"] for r in records] == pytest.approx(losses, rel=1e-4)
    config, saved = models.load_pretrained(checkpoint)
    assert "lm_head.weight" not in saved and config["tie_word_embeddings"] is True
    for name, value in params.items():
        assert np.linalg.norm(saved[name] - value) <= 1e-4 * np.linalg.norm(value), name
    held_out = progression_rows(ROWS + 4, T, TIED["vocab_size"])[-4:].astype(np.int64)
    ours = float(models.loss_fn(config)(saved, held_out.astype(np.int32)))
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint,
                                                              dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        theirs = model(torch.from_numpy(held_out), labels=torch.from_numpy(held_out)).loss
    assert float(theirs) == pytest.approx(ours, rel=1e-5)
