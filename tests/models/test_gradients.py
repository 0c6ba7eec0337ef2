"""Whole-model gradients through the ops' custom VJPs: the directional derivative of
loss_fn along a random direction equals <grad, direction> (central difference, float64)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from ratrain import models


@pytest.mark.parametrize("name", ["tiny-qwen", pytest.param("tiny-baichuan", marks=pytest.mark.slow)])
def test_grad_matches_central_difference_float64(name):
    config = dict(models.get_config(name), num_hidden_layers=1)
    rng = np.random.default_rng(0)
    params = {k: v.astype(np.float64) for k, v in models.init_params(config, 11).items()}
    params = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in params.items()}
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    tokens = rng.integers(0, config["vocab_size"], (2, 7)).astype(np.int32)
    eps = 1e-6
    with jax.enable_x64(True):
        loss = jax.jit(models.loss_fn(config))
        grads = jax.jit(jax.grad(models.loss_fn(config)))(params, tokens)
        shifted = lambda s: float(loss({k: v + s * direction[k] for k, v in params.items()},
                                       tokens))
        numeric = (shifted(eps) - shifted(-eps)) / (2 * eps)
    analytic = sum(float(np.sum(np.asarray(grads[k]) * direction[k])) for k in params)
    # truncation O(eps^2) (measured ~1e-7 rel at eps=1e-5, falls 100x per 10x eps) plus
    # float64 round-off ~1e-16/eps: both well under 1e-6
    assert analytic == pytest.approx(numeric, rel=1e-6)
