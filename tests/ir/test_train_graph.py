"""The traced forward+backward IR, interpreted with numpy, computes what jax.value_and_grad
of the model's loss_fn computes: loss and every parameter gradient (fp32, 1e-5 relative)."""
import jax
import numpy as np
import pytest

from ratrain import models
from ratrain.ir.interp import run_train_graph
from ratrain.models.trace import trace_model
from ratrain.ir.verify import verify_graph

BASE = {"hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 6, "vocab_size": 257, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "initializer_range": 0.2}

AWKWARD = {
    "llama-mha": {"model_type": "llama", **BASE},
    "llama-gqa": {"model_type": "llama", **BASE, "num_key_value_heads": 2},
    "llama-gqa-6": {"model_type": "llama", **BASE, "num_key_value_heads": 1},
    "qwen2-bias": {"model_type": "qwen2", **BASE, "num_key_value_heads": 2,
                   "rope_theta": 1e6},
    "baichuan-alibi": {"model_type": "baichuan", **BASE},
}


def _relative(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) /
                 max(np.linalg.norm(np.asarray(b)), 1e-30))


@pytest.mark.parametrize("name", [
    name if name in ("llama-gqa", "tiny-gqa") else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(AWKWARD) + ["tiny-qwen", "tiny-baichuan", "tiny-gqa"]])
def test_interpreted_ir_matches_jax_grad(name):
    config = models.get_config(name) if name.startswith("tiny") else \
        models.fill_defaults(dict(AWKWARD[name]))
    if name.startswith("tiny"):
        config = {**config, "num_hidden_layers": 1, "initializer_range": 0.2}
    batch, seq = 2, 21
    tg = trace_model(config, micro_batch_size=batch, seq_len=seq)
    for kind in tg.kinds.values():
        verify_graph(kind.fwd), verify_graph(kind.bwd)
    params = models.init_params(config, seed=3)
    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], (batch, seq + 1),
                                               dtype=np.int32)
    loss, grads = run_train_graph(tg, params, tokens)
    ref_loss, ref_grads = jax.value_and_grad(models.loss_fn(config))(params, tokens)
    # fp32 throughout; the two sides sum in different orders, so equal to ~1e-6.
    assert loss == pytest.approx(float(ref_loss), rel=1e-5)
    assert set(grads) == set(ref_grads) == set(params)
    worst = max((_relative(grads[k], ref_grads[k]), k) for k in params)
    assert worst[0] < 1e-5, worst


def test_parameter_counts_are_exact():
    expected = {"llama2-7b": 6738415616, "llama2-13b": 13015864320,
                "llama2-70b": 68976648192, "qwen2.5-32b": 32763876352,
                "baichuan2-13b": 13896668160}
    counted = {name: trace_model(models.get_config(name), seq_len=16).num_params()
               for name in expected}
    assert counted == expected
