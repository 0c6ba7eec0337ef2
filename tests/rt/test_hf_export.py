"""Checkpoints a user can hand to transformers: `ratrain train --init-from DIR` writes
checkpoints whose config.json is DIR's (5.x-shaped, dtype float32), with DIR's tokenizer
files, and whose weights transformers loads and scores like ratrain.models.loss_fn does;
`ratrain run --resume RUN` continues from the run directory's newest checkpoint."""
import json
import subprocess
import sys

import numpy as np
import pytest

from ratrain import models

pytestmark = pytest.mark.mpi

T, VOCAB = 16, 256


def user_config(tied: bool) -> dict:
    """A transformers 5.x-shaped config.json: `dtype`, no fields ratrain fills in."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
            "tie_word_embeddings": tied, "dtype": "bfloat16", "transformers_version": "5.0.0"}


def write_init_dir(root, tied: bool):
    """A checkpoint directory as a user has it: config.json, weights, a tiny BPE."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    config = user_config(tied)
    filled = models.fill_defaults(config)
    models.save_pretrained(root, filled, models.init_params(filled, seed=3))
    (root / "config.json").write_text(json.dumps(config))
    bpe = Tokenizer(tok_models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(["def f(x): return x + 1"] * 20,
                            trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>"]))
    PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>").save_pretrained(root)
    return config


def ratrain(*args):
    return subprocess.run([sys.executable, "-m", "ratrain.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def transformers_loss(checkpoint, tokens: np.ndarray) -> float:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager")
    assert model.dtype == torch.float32
    ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def ratrain_loss(checkpoint, tokens: np.ndarray) -> float:
    config, params = models.load_pretrained(checkpoint)
    return float(models.loss_fn(config)(params, tokens.astype(np.int32)))


@pytest.mark.parametrize("tied", [pytest.param(False, id="untied"),
                                  pytest.param(True, id="tied", marks=pytest.mark.slow)])
def test_final_checkpoint_loads_in_transformers_with_the_same_loss(tmp_path, tied):
    from transformers import AutoTokenizer
    init, run = tmp_path / "init", tmp_path / "run"
    config = write_init_dir(init, tied)
    result = ratrain("train", "--init-from", init, "--steps", 3, "--seq-len", T,
                     "--global-batch", 4, "--out", run)
    assert result.returncode == 0, result.stderr
    final = run / "checkpoints" / "step-000003"
    assert json.loads((final / "config.json").read_text()) == config | {"dtype": "float32"}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (final / name).read_bytes() == (init / name).read_bytes()
    assert AutoTokenizer.from_pretrained(final)("x + 1")["input_ids"]
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, T + 1))
    ours, theirs = ratrain_loss(final, tokens), transformers_loss(final, tokens)
    assert theirs == pytest.approx(ours, rel=1e-5)
    trained, initial = (models.load_pretrained(d)[1] for d in (final, init))
    assert not np.array_equal(trained["model.norm.weight"], initial["model.norm.weight"])


@pytest.mark.slow
def test_resume_from_a_run_directory(tmp_path):
    init, run = tmp_path / "init", tmp_path / "run"
    write_init_dir(init, tied=False)
    first = ratrain("train", "--init-from", init, "--steps", 4, "--save-every", 1,
                    "--keep-last", 2, "--seq-len", T, "--global-batch", 4, "--out", run)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        ["step-000003", "step-000004"]
    more = ratrain("run", run / "program", "--resume", run, "--steps", 6,
                   "--save-dir", tmp_path / "more")
    assert more.returncode == 0, more.stderr
    assert [l.split()[1] for l in more.stdout.splitlines() if l.startswith("step ")] == \
        ["5/6", "6/6"]
    final = tmp_path / "more" / "step-000006"
    assert json.loads((final / "trainer_state.json").read_text())["step"] == 6
    assert (final / "tokenizer.json").read_bytes() == (init / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_unwritable_save_dir_stops_the_runtime_at_set_up(tmp_path):
    from rt_reference import mpirun
    init, run = tmp_path / "init", tmp_path / "run"
    write_init_dir(init, tied=False)
    assert ratrain("train", "--init-from", init, "--steps", 1, "--seq-len", T,
                   "--global-batch", 4, "--out", run).returncode == 0
    bad = mpirun(2, run / "program", "--steps", 2, "--save-dir", "/proc/ratrain-ckpt")
    assert bad.returncode != 0 and "step 1/2" not in bad.stdout
    assert bad.stderr.strip().splitlines() == [
        "ratrain: error: cannot write checkpoints to --save-dir /proc/ratrain-ckpt: "
        "No such file or directory"]
    lone = mpirun(2, run / "program", "--steps", 2, "--save-every", 1)
    assert lone.returncode != 0 and "needs --save-dir" in lone.stderr
