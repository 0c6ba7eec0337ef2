"""Resume: a run stopped after step 50 and resumed from its checkpoint reaches step 100
with the same bits as an uninterrupted run: every loss and learning rate of steps 51-100
and the final checkpoint's files (weights, AdamW moments, trainer state)."""
import json

import numpy as np
import pytest

from ratrain.cli import main as ratrain_main
from rt_reference import CONFIG, assert_same_checkpoint, mpirun, progression_rows, read_metrics

pytestmark = pytest.mark.mpi

T, STEPS, HALF = 16, 100, 50
# rows shuffled; a constant lr after the warm-up, as the first half runs with --steps 50 and
# a cosine's rates depend on --steps (NOTE [default learning-rate schedule])
HYPER = ["--lr", "3e-3", "--warmup", "10", "--lr-schedule", "constant", "--eps", "1e-6",
         "--seed", "7"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    (root / "config.json").write_text(json.dumps(CONFIG))
    np.save(root / "tokens.npy", progression_rows(200, T, CONFIG["vocab_size"]))
    out = root / "pp2-dp2-zero2"
    assert ratrain_main(["compile", str(root / "config.json"), "--seq-len", str(T), "--pp", "2",
                         "--dp", "2", "--zero", "2", "--micro-batches", "2",
                         "--micro-batch-size", "2", "--precision", "fp32", "-o", str(out)]) == 0
    return out


def train(program, name: str, *args):
    """(metrics records, checkpoint root) of a 4-rank run writing under program/../name."""
    root = program.parent
    run = mpirun(4, program, "--data", root / "tokens.npy", "--metrics", root / f"{name}.jsonl",
                 "--save-dir", root / name, "--quiet", *HYPER, *args)
    assert run.returncode == 0, run.stderr
    return read_metrics(root / f"{name}.jsonl"), root / name


def test_resumed_run_is_bit_identical_to_uninterrupted(program):
    whole, whole_dir = train(program, "whole", "--steps", STEPS)
    first, first_dir = train(program, "first", "--steps", HALF)
    state = json.loads((first_dir / "step-000050" / "trainer_state.json").read_text())
    assert state["step"] == HALF and state["shuffle"] is True and state["seed"] == 7
    resumed, resumed_dir = train(program, "resumed", "--steps", STEPS,
                                 "--resume", first_dir / "step-000050")
    assert [r["step"] for r in whole] == list(range(1, STEPS + 1))
    assert [r["step"] for r in resumed] == list(range(HALF + 1, STEPS + 1))
    assert [(r["loss"], r["lr"]) for r in first] == [(r["loss"], r["lr"]) for r in whole[:HALF]]
    assert [(r["loss"], r["lr"]) for r in resumed] == [(r["loss"], r["lr"]) for r in whole[HALF:]]
    assert whole[-1]["loss"] < whole[0]["loss"] / 2  # the steps after the resume still learn
    final = [d / "step-000100" for d in (whole_dir, resumed_dir)]
    files = sorted(f.name for f in final[0].iterdir())
    assert files == ["config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                     "optimizer-00001-of-00002.safetensors",
                     "optimizer-00002-of-00002.safetensors", "trainer_state.json"]
    assert_same_checkpoint(*final)
