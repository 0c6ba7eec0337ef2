"""The model families against transformers 5.x: tiny random Qwen2, Qwen3, Mistral and
tied LLaMA/Qwen2 models saved by transformers load with load_pretrained, and loss_fn's
loss and every jax.grad gradient equal torch's (fp32, mean next-token cross-entropy).
Also: the new presets' exact parameter counts, tied-embedding bookkeeping, one-line
config errors naming the field, and a compiled Qwen3 run against the reference."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from ratrain import models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)
# rope_theta is given explicitly as each family's default in ratrain's fill_defaults
# (transformers 5 defaults every family to 10000 inside rope_parameters)
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
FAMILIES = {
    "qwen2": ("Qwen2Config", dict(rope_parameters=dict(ROPE, rope_theta=1e6))),
    "qwen2-tied": ("Qwen2Config", dict(rope_parameters=dict(ROPE, rope_theta=1e6),
                                       tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=16, rope_parameters=ROPE)),  # 4*16 != 32
    "qwen3-bias-tied": ("Qwen3Config", dict(head_dim=8, attention_bias=True,
                                            tie_word_embeddings=True, rope_parameters=ROPE)),
    "mistral": ("MistralConfig", dict(sliding_window=4096, rope_parameters=ROPE)),
    "llama-tied": ("LlamaConfig", dict(tie_word_embeddings=True, rope_parameters=ROPE)),
    "llama-bias": ("LlamaConfig", dict(attention_bias=True, rope_parameters=ROPE)),
}
B, T = 2, 11


def hf_checkpoint(path: Path, name: str):
    """A random fp32 transformers model of family `name`, saved to `path`; every
    parameter is perturbed so unit norms and zero biases carry gradient information."""
    cls, extra = FAMILIES[name]
    config = getattr(transformers, cls)(**SMALL, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():    # tied: the shared tensor is listed (and moved) once
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def torch_loss_and_grads(model, tokens: np.ndarray):
    ids = torch.from_numpy(tokens.astype(np.int64))
    logits = model(input_ids=ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}


def _relative(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("name", [
    name if name in ("qwen2-tied", "qwen3") else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(FAMILIES)])
def test_loss_and_gradients_match_transformers(tmp_path, name):
    model = hf_checkpoint(tmp_path, name)
    config, params = models.load_pretrained(tmp_path)
    tokens = np.random.default_rng(1).integers(0, SMALL["vocab_size"], (B, T + 1)).astype(np.int32)
    want_loss, want_grads = torch_loss_and_grads(model, tokens)
    loss, grads = jax.value_and_grad(models.loss_fn(config))(params, tokens)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    # the same tensors by name: a tied model has no lm_head.weight on either side
    assert set(grads) == set(want_grads) == set(models.param_shapes(config))
    worst = {k: _relative(grads[k], want_grads[k]) for k in want_grads}
    # fp32 on both sides, different summation orders: ~1e-6; any math error is O(1)
    assert max(worst.values()) < 1e-4, sorted(worst.items(), key=lambda kv: -kv[1])[:3]


def test_tied_embedding_gradient_is_the_sum_of_both_uses(tmp_path):
    """The tied gradient equals the untied model's embed + lm_head gradients."""
    config, params = models.load_pretrained(_saved(tmp_path, "llama-tied"))
    untied = dict(config, tie_word_embeddings=False)
    tokens = np.random.default_rng(2).integers(0, 64, (B, T + 1)).astype(np.int32)
    tied_grads = jax.grad(models.loss_fn(config))(params, tokens)
    split = dict(params, **{"lm_head.weight": params["model.embed_tokens.weight"]})
    g = jax.grad(models.loss_fn(untied))(split, tokens)
    total = np.asarray(g["model.embed_tokens.weight"]) + np.asarray(g["lm_head.weight"])
    assert _relative(tied_grads["model.embed_tokens.weight"], total) < 1e-6
    assert _relative(g["lm_head.weight"], total) > 0.1     # both uses contribute


def _saved(path: Path, name: str) -> Path:
    hf_checkpoint(path, name)
    return path


def test_tied_checkpoint_with_redundant_lm_head(tmp_path):
    from safetensors.numpy import load_file, save_file
    path = _saved(tmp_path, "qwen2-tied")
    tensors = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in tensors          # transformers stores the tensor once
    embed = tensors["model.embed_tokens.weight"]
    save_file(dict(tensors, **{"lm_head.weight": embed.copy()}), str(path / "model.safetensors"))
    _, params = models.load_pretrained(path)
    assert "lm_head.weight" not in params and np.array_equal(params["model.embed_tokens.weight"], embed)
    save_file(dict(tensors, **{"lm_head.weight": embed + 1}), str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens"):
        models.load_pretrained(path)


def test_tied_model_holds_the_matrix_once():
    tied, untied = models.get_config("tiny-tied"), models.get_config("tiny")
    assert "lm_head.weight" not in models.param_shapes(tied)
    assert models.count_params(untied) - models.count_params(tied) == 256 * 256
    assert "lm_head.weight" not in models.init_params(tied, seed=0)
    head = models.layer_specs(tied)[-1]
    assert head.param_names == ("model.norm.weight", "model.embed_tokens.weight")
    assert head.local_names == ("norm.weight", "lm_head.weight")


# --- presets ------------------------------------------------------------------------------

PRESET_COUNTS = {"llama3.2-1b": 1235814400, "llama3.1-8b": 8030261248,
                 "qwen2.5-0.5b": 494032768, "qwen3-0.6b": 596049920, "tiny-tied": 3229952}


def preset_without_rope_scaling(name: str) -> dict:
    """The preset's config.json minus rope_scaling (llama3), which this branch's RoPE
    still refuses; parameter shapes do not depend on it."""
    raw = json.loads((Path(models.__file__).parent / "presets" / f"{name}.json").read_text())
    raw.pop("rope_scaling", None)
    return models.fill_defaults(raw, source=name)


@pytest.mark.parametrize("name", sorted(PRESET_COUNTS))
def test_new_preset_parameter_counts_are_exact(name):
    assert models.count_params(preset_without_rope_scaling(name)) == PRESET_COUNTS[name]


@pytest.mark.parametrize("name", sorted(PRESET_COUNTS))
def test_traced_graph_counts_the_same(name):
    from ratrain.models.trace import trace_model
    tg = trace_model(preset_without_rope_scaling(name), micro_batch_size=1, seq_len=8)
    assert tg.num_params() == PRESET_COUNTS[name]


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-0.6b", "tiny-tied"])
def test_info_prints_the_preset_count(name, capsys):
    from ratrain.cli import main
    assert main(["info", name, "--seq-len", "8"]) == 0
    assert re.search(rf"^parameters: {PRESET_COUNTS[name]}$", capsys.readouterr().out, re.M)


# --- config validation --------------------------------------------------------------------

BASE = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4}
BAD = {  # case: (change to BASE (None deletes), regex the one-line message must match)
    "missing heads": ({"num_attention_heads": None}, r"num_attention_heads is missing"),
    "missing vocab": ({"vocab_size": None}, r"vocab_size is missing"),
    "string width": ({"hidden_size": "256"}, r"hidden_size must be an integer.*'256' \(str\)"),
    "float layers": ({"num_hidden_layers": 2.0}, r"num_hidden_layers must be an integer"),
    "bool heads": ({"num_attention_heads": True}, r"num_attention_heads must be an integer"),
    "zero vocab": ({"vocab_size": 0}, r"vocab_size must be an integer >= 1"),
    "heads split width": ({"num_attention_heads": 6},
                          r"num_attention_heads=6 does not divide hidden_size=64.*head_dim"),
    "kv split heads": ({"num_key_value_heads": 3},
                       r"num_key_value_heads=3 does not divide num_attention_heads=4"),
    "odd derived head_dim": ({"hidden_size": 60}, r"head_dim=15 is odd"),
    "odd head_dim": ({"head_dim": 7}, r"head_dim=7 is odd"),
    "negative eps": ({"rms_norm_eps": -1e-5}, r"rms_norm_eps must be a positive number"),
    "string tie": ({"tie_word_embeddings": "yes"}, r"tie_word_embeddings must be true or false"),
    "gelu": ({"hidden_act": "gelu"}, r"unsupported config fields \['hidden_act'\].*'silu'"),
    "rope scaling": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, r"rope_scaling"),
    "mlp bias": ({"mlp_bias": True}, r"mlp_bias"),
    "qwen2 window": ({"model_type": "qwen2", "use_sliding_window": True}, r"use_sliding_window"),
    "sliding layers": ({"model_type": "qwen3", "head_dim": 16,
                        "layer_types": ["full_attention", "sliding_attention"]}, r"layer_types"),
    "baichuan tied": ({"model_type": "baichuan", "tie_word_embeddings": True},
                      r"tie_word_embeddings"),
    "baichuan bias": ({"model_type": "baichuan", "attention_bias": True}, r"attention_bias"),
    "family": ({"model_type": "gpt2"}, r"model_type 'gpt2' not supported"),
}


def _write(tmp_path: Path, change: dict) -> Path:
    config = {k: v for k, v in {**BASE, **change}.items() if not (k in change and v is None)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_gives_one_line_naming_file_and_field(tmp_path, case):
    change, pattern = BAD[case]
    path = _write(tmp_path, change)
    with pytest.raises(ValueError) as e:
        models.get_config(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert re.search(pattern, message), message


def test_validation_accepts_what_transformers_accepts(tmp_path):
    ok = [{"model_type": "qwen3", "head_dim": 32},                 # 4*32 != 64: explicit
          {"model_type": "qwen3"},                                 # HF default head_dim 128
          {"model_type": "mistral", "sliding_window": None, "head_dim": None},
          {"model_type": "baichuan", "hidden_size": 60},          # ALiBi: odd head_dim fine
          {"num_hidden_layers": 0, "rms_norm_eps": 1}]             # ints are numbers
    for change in ok:
        models.get_config(_write(tmp_path, change))
    assert models.model_dims(models.get_config(_write(tmp_path, ok[1]))).head_dim == 128


# --- sliding window -----------------------------------------------------------------------

def test_sequence_longer_than_the_sliding_window_is_refused():
    mistral = models.fill_defaults(dict(BASE, model_type="mistral", sliding_window=8))
    models.check_sequence_length(mistral, 8)
    with pytest.raises(ValueError, match=r"sliding_window=8.*<= 8"):
        models.check_sequence_length(models.model_dims(mistral), 9)
    tokens = np.zeros((1, 10), np.int32)
    params = models.init_params(mistral, seed=0)
    with pytest.raises(ValueError, match="sliding_window"):
        models.loss_fn(mistral)(params, tokens)     # traced layers refuse it too
    default = models.fill_defaults(dict(BASE, model_type="mistral"))
    assert models.model_dims(default).sliding_window == 4096      # MistralConfig default
    # Qwen2 keeps a sliding_window field that is inert without use_sliding_window
    qwen2 = models.fill_defaults(dict(BASE, model_type="qwen2", sliding_window=4))
    models.check_sequence_length(qwen2, 4096)


# --- compiled ------------------------------------------------------------------------------

QWEN3 = models.fill_defaults({
    "model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48, "head_dim": 16,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 64, "max_position_embeddings": 16, "initializer_range": 0.1})


@pytest.fixture
def semantics_on_qwen3(monkeypatch):
    """tests/passes/test_compiled_semantics with QWEN3 among its models."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "passes"))
    import test_compiled_semantics as semantics
    monkeypatch.setitem(semantics.CONFIGS, "qwen3", QWEN3)
    yield semantics
    for f in (semantics.graph, semantics.reference):
        f.cache_clear()


@pytest.mark.parametrize("pp,dp,m", [(2, 1, 3), (3, 2, 2)])
def test_compiled_qwen3_matches_reference(semantics_on_qwen3, pp, dp, m):
    s = semantics_on_qwen3
    assert "self_attn.q_norm.weight" in s.graph("qwen3").kinds["decoder"].fwd.param_names
    program = s.compile_program(pp, dp, m, "ratrain", 1, "selective", model="qwen3")
    s.assert_matches_reference(program, dp, m, model="qwen3")


@pytest.mark.mpi
@pytest.mark.slow
def test_native_qwen3_run_matches_reference(tmp_path, monkeypatch):
    """The same config compiled to native kernels (rms_norm over q/k [B,T,H,D] rows) and
    trained under mpiexec on 2 pipeline stages: every step's loss is the reference's."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "rt"))
    from rt_reference import mpirun, progression_rows, read_metrics, reference
    from ratrain.cli import main
    from ratrain.optim import AdamW
    seq, steps, rows = 16, 20, 64
    (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    np.save(tmp_path / "tokens.npy", progression_rows(rows, seq, QWEN3["vocab_size"]))
    assert main(["compile", str(tmp_path / "config.json"), "--seq-len", str(seq), "--pp", "2",
                 "--micro-batches", "2", "--micro-batch-size", "2", "--recompute", "none",
                 "--precision", "fp32", "-o", str(tmp_path / "program")]) == 0
    run = mpirun(2, tmp_path / "program", "--steps", steps, "--no-shuffle", "--data",
                 tmp_path / "tokens.npy", "--metrics", tmp_path / "m.jsonl", "--quiet",
                 "--lr", "3e-3", "--eps", "1e-6", "--weight-decay", "0.1", "--seed", "5",
                 "--lr-schedule", "constant")  # the reference's AdamW has one lr
    assert run.returncode == 0, run.stderr
    expected, _ = reference(QWEN3, 5, np.load(tmp_path / "tokens.npy"), 4, steps,
                            AdamW(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1))
    assert expected[-1] < expected[0] * 0.9          # it learns: the comparison can fail
    assert [r["loss"] for r in read_metrics(tmp_path / "m.jsonl")] == pytest.approx(expected, rel=1e-4)
