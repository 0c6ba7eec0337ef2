"""Model families: exact parameter counts of the big presets from shapes only, layer
shapes checked by jax.eval_shape, loss_fn == composition of layer_fn's, init determinism,
get_config errors, and the primitives the tracer will see."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from ratrain import models

EXPECTED_COUNTS = {"llama2-7b": 6738415616, "llama2-13b": 13015864320,
                   "llama2-70b": 68976648192, "qwen2.5-32b": 32763876352,
                   "baichuan2-13b": 13896668160}
TINY = ["tiny", "tiny-gqa", "tiny-qwen", "tiny-baichuan", "tiny-tied"]
# the fields every config must give (ratrain.models.config.REQUIRED)
SMALL = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 1, "num_attention_heads": 4}
# primitives the tracer maps (ratrain/ir/lax_rules.py) plus our coarse ops
ALLOWED = {"add", "sub", "mul", "neg", "reshape", "transpose", "convert_element_type",
           "slice", "concatenate", "broadcast_in_dim", "squeeze", "reduce_sum", "div",
           "integer_pow", "sqrt", "rsqrt", "max", "custom_vjp_call", "matmul",
           "matmul_bias", "attention", "rms_norm", "rope", "swiglu", "embedding",
           "cross_entropy"}


def tokens_for(config, batch=2, seq=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config["vocab_size"], (batch, seq + 1)).astype(np.int32)


def layer_weights(spec, params):
    return {l: params[p] for l, p in zip(spec.local_names, spec.param_names)}


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_big_preset_parameter_counts_are_exact(name):
    assert models.count_params(models.get_config(name)) == EXPECTED_COUNTS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_big_preset_layers_accept_their_shapes(name):
    """Abstract evaluation only: every layer kind type-checks on the preset's shapes."""
    config, shapes = models.get_config(name), models.param_shapes(models.get_config(name))
    specs = models.layer_specs(config)
    assert sum(len(s.param_names) for s in specs) == len(shapes)
    aval = lambda shape, dtype=np.float32: jax.ShapeDtypeStruct(shape, dtype)
    ids, h = aval((1, 16), np.int32), aval((1, 16, config["hidden_size"]))
    inputs = {"embed": (ids,), "decoder": (h,), "head": (h, ids)}
    for spec in (specs[0], specs[1], specs[-1]):
        w = {l: aval(shapes[p]) for l, p in zip(spec.local_names, spec.param_names)}
        out = jax.eval_shape(models.layer_fn(config, spec.kind), w, *inputs[spec.kind])
        assert out.shape == ((1, 16, config["hidden_size"]) if spec.kind != "head" else ())


def test_layer_specs_cover_all_params_in_order():
    config = models.get_config("tiny-qwen")
    specs = models.layer_specs(config)
    assert [s.kind for s in specs] == ["embed", "decoder", "decoder", "head"]
    assert [s.index for s in specs] == [0, 1, 2, 3]
    names = [n for s in specs for n in s.param_names]
    assert names == list(models.param_shapes(config))
    assert "self_attn.q_proj.bias" in specs[1].local_names
    assert specs[1].local_names == specs[2].local_names
    assert specs[-1].param_names == ("model.norm.weight", "lm_head.weight")


def test_baichuan_packs_qkv_and_has_no_rope_params():
    specs = models.layer_specs(models.get_config("baichuan2-13b"))
    assert "model.layers.0.self_attn.W_pack.weight" in specs[1].param_names
    assert models.param_shapes(models.get_config("baichuan2-13b"))[
        "model.layers.39.self_attn.W_pack.weight"] == (15360, 5120)


@pytest.mark.parametrize("name", [
    name if name == "tiny-gqa" else pytest.param(name, marks=pytest.mark.slow) for name in TINY])
def test_loss_is_the_composition_of_layer_functions(name):
    config = models.get_config(name)
    params, tokens = models.init_params(config, seed=3), tokens_for(config)
    fns = {k: jax.jit(models.layer_fn(config, k)) for k in ("embed", "decoder", "head")}
    specs = models.layer_specs(config)
    h = fns["embed"](layer_weights(specs[0], params), tokens[:, :-1])
    for spec in specs[1:-1]:
        h = fns["decoder"](layer_weights(spec, params), h)
    by_layers = fns["head"](layer_weights(specs[-1], params), h, tokens[:, 1:])
    whole = jax.jit(models.loss_fn(config))(params, tokens)
    # same ops in the same order; only XLA fusion differences in float32 remain
    assert float(by_layers) == pytest.approx(float(whole), rel=1e-6)
    # a random model predicts roughly uniformly: loss near log(vocab)
    assert abs(float(whole) - np.log(config["vocab_size"])) < 1.5


def test_loss_is_mean_next_token_cross_entropy_without_layers():
    """A zero-layer LLaMA is embed -> RMSNorm -> head: check against plain numpy."""
    config = dict(models.get_config("tiny"), num_hidden_layers=0)
    params, tokens = models.init_params(config, seed=0), tokens_for(config)
    x = params["model.embed_tokens.weight"][tokens[:, :-1]]
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config["rms_norm_eps"])
    logits = (x * params["model.norm.weight"]) @ params["lm_head.weight"].T
    logp = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    want = -np.mean(np.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
    # float32 logits with different reduction orders
    assert float(models.loss_fn(config)(params, tokens)) == pytest.approx(want, rel=1e-5)


def test_normhead_uses_unit_rows():
    """Scaling an lm_head row leaves the Baichuan loss unchanged (rows are normalised)."""
    config = models.get_config("tiny-baichuan")
    params, tokens = models.init_params(config, seed=1), tokens_for(config)
    scaled = dict(params, **{"lm_head.weight": params["lm_head.weight"] * 3.0})
    loss = jax.jit(models.loss_fn(config))
    # float32 rounding of the rescaled rows only
    assert float(loss(scaled, tokens)) == pytest.approx(float(loss(params, tokens)), rel=1e-6)


@pytest.mark.parametrize("name", TINY)
def test_layers_use_only_traceable_primitives(name):
    config = models.get_config(name)
    params, tokens = models.init_params(config, seed=0), tokens_for(config)
    h = np.zeros((2, 8, config["hidden_size"]), np.float32)
    inputs = {"embed": (tokens[:, :-1],), "decoder": (h,), "head": (h, tokens[:, 1:])}
    for spec in models.layer_specs(config)[:2] + models.layer_specs(config)[-1:]:
        jaxpr = jax.make_jaxpr(models.layer_fn(config, spec.kind))(
            layer_weights(spec, params), *inputs[spec.kind])
        used = {e.primitive.name for e in jaxpr.jaxpr.eqns}
        assert used <= ALLOWED, (spec.kind, used - ALLOWED)


def test_init_is_deterministic_and_follows_hf_conventions():
    config = models.get_config("tiny-qwen")
    a, b, c = (models.init_params(config, s) for s in (7, 7, 8))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["lm_head.weight"], c["lm_head.weight"])
    assert all(v.dtype == np.float32 for v in a.values())
    assert np.all(a["model.norm.weight"] == 1) and np.all(a["model.layers.0.self_attn.q_proj.bias"] == 0)
    # 257*192 draws: the sample std is within a few percent of initializer_range
    assert np.std(a["model.embed_tokens.weight"]) == pytest.approx(0.02, rel=0.05)


def test_get_config_defaults_and_sources(tmp_path):
    config = models.get_config("baichuan2-13b")
    assert config["num_key_value_heads"] == 40 and config["max_position_embeddings"] == 4096
    assert models.get_config("qwen2.5-32b")["rope_theta"] == 1e6
    assert models.get_config("llama2-7b")["rope_theta"] == 10000.0
    (tmp_path / "config.json").write_text(json.dumps(dict(SMALL, num_attention_heads=2)))
    assert models.get_config(tmp_path)["num_key_value_heads"] == 2
    assert models.get_config(tmp_path / "config.json")["hidden_size"] == 64


def test_get_config_errors_name_the_input_and_the_presets(tmp_path):
    with pytest.raises(ValueError, match=r"'llama3-8b'.*presets: .*llama2-7b"):
        models.get_config("llama3-8b")
    with pytest.raises(ValueError, match=str(tmp_path)):
        models.get_config(tmp_path)             # a directory without config.json
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="gpt2"):
        models.get_config(tmp_path)


def test_get_config_refuses_features_the_layers_would_ignore(tmp_path):
    base = dict(SMALL, num_attention_heads=2)
    for field, value in (("hidden_act", "gelu"), ("mlp_bias", True),
                         ("rope_scaling", {"type": "dynamic", "factor": 2.0})):
        (tmp_path / "config.json").write_text(json.dumps(dict(base, **{field: value})))
        with pytest.raises(ValueError, match=field):
            models.get_config(tmp_path)
