"""Held-out evaluation under mpiexec: the loss of --eval-data (pp 2 and dp 2, fp32) equals
the single-process reference loss of the same weights on the same rows, and training with
evaluations is bit-identical to training without (fp32 and fp16); text --data is tokenized
by rank 0 when started directly, and bad text is one `ratrain: error:` line."""
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers

from ratrain import models
from ratrain.cli import main as ratrain_main
from ratrain.optim import AdamW
from rt_reference import CONFIG, mpirun, progression_rows, read_metrics, reference

pytestmark = pytest.mark.mpi

T, M, G, STEPS, SEED, K = 16, 4, 8, 3, 5, 2
OPTIMIZER = AdamW(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1)
HYPER = ["--lr", "3e-3", "--lr-schedule", "constant", "--eps", "1e-6", "--weight-decay", "0.1",
         "--seed", SEED, "--no-shuffle", "--quiet"]
WORDS = "the cat sat on a mat and the dog ran to the cat then a bird sang".split()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    (root / "config.json").write_text(json.dumps(CONFIG))
    np.save(root / "train.npy", progression_rows(64, T, CONFIG["vocab_size"]))
    rng = np.random.default_rng(7)  # other progressions than the training rows'
    start, stride = rng.integers(0, 64, (20, 1)), rng.choice([1, 3, 5, 7], (20, 1))
    np.save(root / "held.npy", (start + stride * np.arange(T + 1)) % CONFIG["vocab_size"])
    return root


def compile_program(workdir, pp: int, dp: int, precision: str = "fp32", *extra):
    out = workdir / f"pp{pp}-dp{dp}-{precision}{''.join(extra)}"
    if not out.exists():
        assert ratrain_main(["compile", str(workdir / "config.json"), "--seq-len", str(T),
                             "--pp", str(pp), "--dp", str(dp), "--micro-batches", str(M),
                             "--micro-batch-size", str(G // (M * dp)), "--recompute", "none",
                             "--precision", precision, *extra, "-o", str(out)]) == 0
    return out


def train(workdir, program, name: str, *args):
    metrics, save = workdir / f"{name}.jsonl", workdir / f"{name}-ckpt"
    run = mpirun(2, program, "--steps", STEPS, "--data", workdir / "train.npy", "--metrics",
                 metrics, "--save-dir", save, *HYPER, *map(str, args))
    assert run.returncode == 0, run.stderr
    weights = sorted(save.glob("**/*.safetensors"))
    assert weights
    return read_metrics(metrics), [w.read_bytes() for w in weights]


@pytest.fixture(scope="module")
def reference_eval(workdir):
    """Per step k, the reference loss of the weights after k steps on the K*G first
    held-out rows (wrapping: 20 rows)."""
    rows, held = np.load(workdir / "train.npy"), np.load(workdir / "held.npy")
    batch = held[np.arange(K * G) % len(held)].astype(np.int32)
    loss = jax.jit(models.loss_fn(CONFIG))
    return [float(loss(reference(CONFIG, SEED, rows, G, k, OPTIMIZER)[1], batch))
            for k in range(1, STEPS + 1)]


@pytest.mark.parametrize("pp,dp,extra", [
    (2, 1, ()), pytest.param(1, 2, (), marks=pytest.mark.slow),
    # ZeRO-3, views gathered at use: F1's embedding view is the one B0 gathered, and the
    # gathers of F's views start inside B's (NOTE [held-out loss])
    (1, 2, ("--zero", "3", "--zero3-prefetch", "0"))])
def test_eval_loss_matches_reference_and_leaves_training_bit_identical(workdir, reference_eval,
                                                                       pp, dp, extra):
    program = compile_program(workdir, pp, dp, "fp32", *extra)
    name = f"{pp}{dp}{''.join(extra)}"
    plain, plain_weights = train(workdir, program, f"plain-{name}")
    evaluated, weights = train(workdir, program, f"eval-{name}", "--eval-data",
                               workdir / "held.npy", "--eval-every", 1, "--eval-batches", K)
    assert [r["loss"] for r in evaluated] == [r["loss"] for r in plain]
    assert weights == plain_weights
    assert all("eval_loss" not in r for r in plain)
    assert [r["eval_loss"] for r in evaluated] == pytest.approx(reference_eval, rel=1e-4)
    assert reference_eval[-1] < reference_eval[0]  # the weights moved between evaluations


@pytest.mark.slow
def test_fp16_eval_leaves_training_bit_identical(workdir, reference_eval):
    program = compile_program(workdir, 2, 1, "fp16")
    scale = ["--initial-loss-scale", 1024]
    plain, plain_weights = train(workdir, program, "plain-fp16", *scale)
    evaluated, weights = train(workdir, program, "eval-fp16", *scale, "--eval-data",
                               workdir / "held.npy", "--eval-every", 2, "--eval-batches", K)
    assert [r["loss"] for r in evaluated] == [r["loss"] for r in plain]
    assert [r["loss_scale"] for r in evaluated] == [r["loss_scale"] for r in plain]
    assert weights == plain_weights
    # after steps 2 and 3 (the last); fp16 activations against the fp32 reference
    assert [r.get("eval_loss") is not None for r in evaluated] == [False, True, True]
    assert evaluated[-1]["eval_loss"] == pytest.approx(reference_eval[-1], rel=2e-2)


@pytest.fixture(scope="module")
def tokenizer_dir(workdir):
    """A BPE of 60 ids trained on the words (<unk> 0, </s> 1), as a model's tokenizer.json."""
    folder = workdir / "tok"
    tokenizer = Tokenizer(tok_models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([words(100, 0)], trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<unk>", "</s>"]))
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def words(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(n)) + "\n"


def test_text_data_tokenized_by_rank0_under_mpiexec(workdir, tokenizer_dir):
    program = compile_program(workdir, 2, 1)
    (workdir / "corpus.txt").write_text(words(200, 1))
    (workdir / "held.jsonl").write_text("".join(json.dumps({"text": words(20, s)}) + "\n"
                                                for s in (2, 3)))
    metrics = workdir / "text.jsonl"
    run = mpirun(2, program, "--steps", 2, "--data", workdir / "corpus.txt", "--tokenizer",
                 tokenizer_dir, "--eval-data", workdir / "held.jsonl", "--metrics", metrics)
    assert run.returncode == 0, run.stderr
    assert len(list(workdir.glob("corpus.txt.*.tokens.bin"))) == 1
    assert len(list(workdir.glob("held.jsonl.*.tokens.bin"))) == 1
    assert run.stderr.count("tokenizing") == 2  # once each, by rank 0
    records = read_metrics(metrics)
    assert "eval_loss" not in records[0] and 3.0 < records[1]["eval_loss"] < 5.0
    assert f"eval loss {records[1]['eval_loss']:.4f}" in run.stdout


def test_bad_text_is_one_error_line(workdir, tokenizer_dir):
    program = compile_program(workdir, 2, 1)
    (workdir / "empty.txt").write_text("")
    (workdir / "short.txt").write_text("the cat sat")
    run = mpirun(2, program, "--steps", 1, "--data", workdir / "empty.txt")
    assert run.returncode == 2
    assert run.stderr.strip() == f"ratrain: error: --data {workdir / 'empty.txt'} is empty; " \
        "it needs text to train on"
    cli = subprocess.run([sys.executable, "-m", "ratrain.cli", "run", str(program), "--steps",
                          "1", "--data", str(workdir / "short.txt"), "--tokenizer",
                          str(tokenizer_dir)], capture_output=True,
                         text=True, timeout=60)
    lines = cli.stderr.strip().splitlines()  # the tokenizing summary, then the error
    assert cli.returncode == 2 and len(lines) == 2 and lines[0].startswith("tokenizing")
    assert lines[1].startswith("ratrain: error: --data") and \
        "has 4 tokens, fewer than one row of seq-len + 1 = 17" in lines[1]
    evals = mpirun(2, program, "--steps", 1, "--data", workdir / "train.npy", "--eval-every", 2)
    assert evals.returncode == 2 and "--eval-every 2 needs --eval-data" in evals.stderr
