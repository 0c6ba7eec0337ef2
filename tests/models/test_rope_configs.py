"""RoPE as transformers 4.x and 5.x configs describe it: tiny LLaMA checkpoints written by
transformers 5.x (rope_theta 5e5, linear, llama3, yarn) load and give transformers' own
loss and gradients; inv_freq equals transformers' to 1 ulp, the attention factor exactly;
4.x forms parse to the same spec; what ratrain cannot reproduce is refused by name."""
from __future__ import annotations

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from ratrain import models  # noqa: E402
from ratrain.models.trace import trace_model  # noqa: E402
from ratrain.models.rope import attention_scaling, inv_freq, rope_spec  # noqa: E402

B, T = 2, 24
# 5.x rope_parameters; original context 16 puts head_dim 16's wavelengths (6.3, 32, 167,
# ...) in all three llama3 bands and on both sides of yarn's ramp within T = 24 positions
ROPE = {
    "theta5e5": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
}
YARN_KNOBS = {"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0, "beta_fast": 16,
              "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False,
              "original_max_position_embeddings": 16}


def hf_config(rope_parameters, head_dim=16, **extra):
    """A tiny LLaMA in transformers 5.x. initializer_range 0.2 makes q.k ~ 1, so the
    attention pattern (and with it the loss) depends on every rotation frequency."""
    heads = 4
    return transformers.LlamaConfig(
        vocab_size=97, hidden_size=heads * head_dim, intermediate_size=96, head_dim=head_dim,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=2,
        max_position_embeddings=64, initializer_range=0.2, rope_parameters=dict(rope_parameters),
        attn_implementation="eager", **extra)


def hf_loss_and_grads(model, tokens):
    """transformers' labels-style loss: logits[:, :-1] predict tokens[:, 1:], mean."""
    model.zero_grad()
    ids = torch.from_numpy(tokens.astype(np.int64))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.numpy() for n, p in model.named_parameters()}


def relative(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 97, (B, T + 1)).astype(np.int32)


@pytest.mark.parametrize("name", [
    name if name == "llama3" else pytest.param(name, marks=pytest.mark.slow) for name in sorted(ROPE)])
def test_checkpoint_written_by_transformers_gives_its_loss_and_grads(tmp_path, tokens, name):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config(ROPE[name])).float()
    model.save_pretrained(tmp_path)
    want_loss, want_grads = hf_loss_and_grads(model, tokens)

    config, params = models.load_pretrained(tmp_path)
    assert models.model_dims(config).rope == rope_spec({**config, **model.config.to_dict()})
    loss, grads = jax.value_and_grad(models.loss_fn(config))(params, tokens)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want_grads)
    errors = {k: relative(grads[k], want_grads[k]) for k in want_grads}
    assert max(errors.values()) < 1e-4, errors

    # the check can fail: what ratrain made of these configs before (theta 10000 for 5e5,
    # the scaling dropped) is off by far more than the tolerance (measured 0.5% to 5%)
    plain = {"rope_theta": 10000.0 if name == "theta5e5" else ROPE[name]["rope_theta"]}
    wrong = float(models.loss_fn(dict(config, rope_parameters=plain, **plain))(params, tokens))
    assert abs(wrong - want_loss) > 1e-3 * want_loss


@pytest.mark.parametrize("rope_parameters", [*ROPE.values(), YARN_KNOBS],
                         ids=[*ROPE, "yarn_knobs"])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_tables_equal_transformers_to_the_ulp(rope_parameters, head_dim):
    config = hf_config(rope_parameters, head_dim=head_dim)
    hf = LlamaRotaryEmbedding(config)
    spec = rope_spec(config.to_dict())
    # See NOTE [RoPE tables in float32]: torch's float32 pow is 1 ulp off the correctly rounded
    # power for ~1% of exponents; everything after it is the same float32 arithmetic
    np.testing.assert_array_max_ulp(inv_freq(spec, head_dim), hf.inv_freq.numpy(), maxulp=1)
    assert attention_scaling(spec) == hf.attention_scaling
    assert (attention_scaling(spec) != 1.0) == (spec.rope_type == "yarn")


BASE = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


def test_4x_forms_parse_to_the_5x_spec():
    v4 = models.fill_defaults({**BASE, "rope_theta": 10000.0,
                               "rope_scaling": {"type": "linear", "factor": 2.0}})
    v5 = models.fill_defaults({**BASE, "rope_parameters": ROPE["linear"]})
    assert models.model_dims(v4).rope == models.model_dims(v5).rope
    assert models.model_dims(v5).rope.params == (("factor", 2.0),)
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    v4 = {**BASE, "rope_theta": 500000.0, "rope_scaling": llama31}
    assert rope_spec(v4) == rope_spec({**BASE, "rope_parameters": ROPE["llama3"]})
    # transformers 5.x reads a 4.x config the same way
    assert rope_spec(transformers.LlamaConfig(**v4).to_dict()) == rope_spec(v4)


def test_theta_comes_from_wherever_the_config_gives_it():
    v5 = models.fill_defaults({**BASE, "rope_parameters": ROPE["theta5e5"]})
    assert v5["rope_theta"] == 500000.0 and models.model_dims(v5).rope_theta == 500000.0
    assert models.model_dims({**BASE, "rope_theta": 5e5}).rope == models.model_dims(v5).rope
    assert models.model_dims(BASE).rope_theta == 10000.0
    qwen = {**BASE, "model_type": "qwen2"}
    assert models.model_dims(qwen).rope_theta == 10000.0  # transformers 5's Qwen2Config default
    assert models.model_dims({**qwen, "rope_parameters": {"rope_theta": 1e4}}).rope_theta == 1e4
    yarn = rope_spec({**BASE, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert yarn.param("original_max_position_embeddings") == 64    # HF: max_position_embeddings


@pytest.mark.parametrize("extra,field", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.*dynamic"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                          "long_factor": [2.0] * 8, "original_max_position_embeddings": 16}},
     "longrope"),
    ({"rope_parameters": {"rope_type": "ntk-by-parts"}}, "ntk-by-parts"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"rope_parameters": {**ROPE["llama3"], "mrope_section": [2, 3, 3]}}, "mrope_section"),
    ({"rope_parameters": {k: v for k, v in ROPE["llama3"].items() if k != "low_freq_factor"}},
     "low_freq_factor"),
    ({"rope_parameters": {"rope_type": "linear", "factor": "2"}}, "factor='2'"),
    ({"rope_theta": 10000.0, "rope_parameters": ROPE["theta5e5"]}, "rope_theta"),
    ({"rope_parameters": {"full_attention": ROPE["theta5e5"]}}, "full_attention"),
])
def test_refusals_name_the_field(tmp_path, extra, field):
    (tmp_path / "config.json").write_text(__import__("json").dumps({**BASE, **extra}))
    with pytest.raises(ValueError, match=field):
        models.get_config(tmp_path)


def test_ir_prints_the_scaling():
    config = models.fill_defaults({**BASE, "rope_parameters": ROPE["llama3"]})
    decoder = trace_model(config, micro_batch_size=1, seq_len=4).kinds["decoder"]
    params = ("[scaling=((factor,8.0),(high_freq_factor,4.0),(low_freq_factor,1.0),"
              "(original_max_position_embeddings,16)) theta=500000.0 type=llama3]")
    assert str(decoder.fwd).count(f"rope{params}") == 2          # q and k
    assert str(decoder.bwd).count(f"rope_bwd{params}") == 2
    plain = trace_model(models.fill_defaults(BASE), micro_batch_size=1, seq_len=4)
    assert str(plain.kinds["decoder"].fwd).count("rope[theta=10000.0]") == 2
