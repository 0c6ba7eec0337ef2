"""`ratrain eval` and `ratrain generate` on a checkpoint (cli/evaluate.py): eval of a run's
final checkpoint equals the run's own --eval-data loss after its last step (NOTE [eval is
the run's held-out pass]); generate's greedy tokens equal transformers' greedy generate on
the same checkpoint for 32 tokens; bad inputs get one `ratrain: error:` line and exit 2."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ratrain import models
from ratrain.cli import main as ratrain_main
from run_dir_fixtures import CONFIG, text, write_model_dir

PROMPT = "the quick brown fox"


def ratrain(cwd, *args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalgen")
    write_model_dir(root / "model", weights=True)   # ratrain-saved weights, BPE tokenizer
    (root / "train.txt").write_text(text(300, 1))
    (root / "held.txt").write_text(text(40, 2))
    return root


@pytest.mark.mpi
def test_eval_equals_the_runs_held_out_loss(workdir):
    """The run evaluates after its last step, the step its final checkpoint saves; eval of
    the run (its newest checkpoint) reports that loss, on the run's program and rows."""
    run = ratrain(workdir, "train", "--model", "model", "--data", "train.txt", "--steps", 3,
                  "--seq-len", 16, "--global-batch", 4, "--precision", "fp32",
                  "--eval-data", "held.txt", "--eval-batches", 3, "--out", "run")
    assert run.returncode == 0, run.stderr
    last = json.loads((workdir / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 3 and (workdir / "run/checkpoints/step-000003").is_dir()
    result = ratrain(workdir, "eval", "run", "--data", "held.txt")
    assert result.returncode == 0, result.stderr
    line, = result.stdout.splitlines()
    assert "(3 batches of 4)" in line and "step-000003" in line
    loss = float(line.split()[1].rstrip(","))
    assert loss == pytest.approx(last["eval_loss"], rel=1e-6)
    # the same checkpoint moved out of its run: a program compiled here for one rank
    shutil.copytree(workdir / "run/checkpoints/step-000003", workdir / "moved")
    alone = ratrain(workdir, "eval", "moved", "--data", "held.txt", "--seq-len", 16,
                    "--global-batch", 4, "--eval-batches", 3)
    assert alone.returncode == 0, alone.stderr
    line = alone.stdout.splitlines()[-1]
    assert "(3 batches of 4)" in line
    assert float(line.split()[1].rstrip(",")) == pytest.approx(loss, rel=1e-5)


def test_generate_greedy_equals_transformers(workdir, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM
    from ratrain.models import sample
    made, generate_ids = [], sample.generate_ids
    monkeypatch.setattr(sample, "generate_ids", lambda *a, **k: made.append(
        generate_ids(*a, **k)) or made[-1])
    assert ratrain_main(["generate", str(workdir / "model"), "--prompt", PROMPT, "--greedy",
                         "--max-new-tokens", "32"]) == 0
    tokenizer = Tokenizer.from_file(str(workdir / "model" / "tokenizer.json"))
    prompt = tokenizer.encode(PROMPT).ids
    model = LlamaForCausalLM.from_pretrained(workdir / "model").eval()
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                eos_token_id=CONFIG["eos_token_id"])[0, len(prompt):].tolist()
    assert len(theirs) == 32 and made == [theirs]
    assert capsys.readouterr().out == PROMPT + tokenizer.decode(theirs) + "\n"


def test_sampling_is_seeded_and_stays_in_the_top_k():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50)
    top = set(np.argsort(logits)[-3:])
    draws = [sample_token(logits, seed) for seed in range(20)]
    assert set(draws) <= top and len(set(draws)) > 1
    assert draws == [sample_token(logits, seed) for seed in range(20)]


def sample_token(logits, seed):
    from ratrain.models.sample import Sampling, next_token
    return next_token(logits, Sampling(1, temperature=2.0, top_k=3),
                      np.random.default_rng(seed))


def one_error(capsys, *argv) -> str:
    assert ratrain_main(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ratrain: error: "), err
    return err


def test_bad_inputs_are_one_line(workdir, tmp_path, capsys):
    missing = tmp_path / "nothing"
    assert "does not exist" in one_error(capsys, "eval", missing, "--data", "x.txt")
    assert "does not exist" in one_error(capsys, "generate", missing, "--prompt", "hi")
    assert "holds no checkpoint" in one_error(capsys, "eval", tmp_path, "--data", "x.txt")
    (tmp_path / "empty.txt").write_text("")
    assert "empty" in one_error(capsys, "eval", workdir / "model", "--data",
                                tmp_path / "empty.txt", "--seq-len", 16)
    small = dict(CONFIG, vocab_size=200)  # too few ids for bytes, and no tokenizer.json
    filled = models.fill_defaults(small)
    models.save_pretrained(tmp_path / "small", filled, models.init_params(filled, seed=1))
    (tmp_path / "small" / "config.json").write_text(json.dumps(small))
    error = one_error(capsys, "generate", tmp_path / "small", "--prompt", "hi")
    assert "--tokenizer DIR" in error and "no tokenizer.json" in error
    assert "context" in one_error(capsys, "generate", workdir / "model", "--prompt", PROMPT,
                                  "--max-new-tokens", 1000)
