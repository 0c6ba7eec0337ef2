"""Every coarse op: VJP dot-product test, numpy == jax.numpy reference, jax.grad through
the custom_vjp == jax.grad of the reference, on awkward shapes (hidden 96, 6 query heads
over 2 kv heads, head_dim 16, T = 7, vocab 257, ALiBi with 6 and 40 heads)."""
from __future__ import annotations

import numpy as np
import pytest

from ratrain import ops
from ratrain.models.rope import RopeSpec, op_params
from op_checks import grads_vs_reference, numpy_vs_jax, vjp_dot_gap

R = np.random.default_rng(42)
# llama3 with original context 16: head_dim 16's wavelengths fall in all three bands;
# yarn's attention factor (1.25, not 1) makes the map a rotation times a scale
LLAMA3 = RopeSpec(500000.0, "llama3", (("factor", 8.0), ("high_freq_factor", 4.0),
                                        ("low_freq_factor", 1.0),
                                        ("original_max_position_embeddings", 16)))
YARN = RopeSpec(10000.0, "yarn", (("attention_factor", 1.25), ("beta_fast", 32.0),
                                  ("beta_slow", 1.0), ("factor", 4.0),
                                  ("original_max_position_embeddings", 16), ("truncate", True)))


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def ids(shape, vocab):
    return R.integers(0, vocab, size=shape).astype(np.int32)


# (case id, IR op name, user function, inputs, rule params)
CASES = [
    ("matmul", "matmul", ops.matmul, [f32(2, 7, 96), f32(40, 96)], {}),
    ("matmul_bias", "matmul_bias", ops.matmul,
     [f32(2, 7, 96), f32(40, 96), f32(40)], {}),
    ("rms_norm", "rms_norm", lambda x, w: ops.rms_norm(x, w, eps=1e-5),
     [f32(2, 7, 96), 1 + 0.1 * f32(96)], {"eps": 1e-5}),
    ("rope", "rope", lambda x: ops.rope(x, theta=10000.0), [f32(2, 7, 6, 16)],
     {"theta": 10000.0}),
    ("rope_1e6", "rope", lambda x: ops.rope(x, theta=1e6), [f32(1, 9, 2, 16)],
     {"theta": 1e6}),
    ("rope_llama3", "rope", lambda x: ops.rope(x, LLAMA3), [f32(2, 7, 6, 16)],
     op_params(LLAMA3)),
    ("rope_yarn", "rope", lambda x: ops.rope(x, YARN), [f32(1, 9, 2, 16)], op_params(YARN)),
    ("swiglu", "swiglu", ops.swiglu, [f32(2, 7, 40), f32(2, 7, 40)], {}),
    ("embedding", "embedding", ops.embedding, [f32(257, 96), ids((2, 7), 257)],
     {"vocab": 257}),
    ("attention_gqa", "attention", ops.attention,
     [f32(2, 7, 6, 16), f32(2, 7, 2, 16), f32(2, 7, 2, 16)],
     {"causal": True, "alibi": False}),
    ("attention_mha_full", "attention", lambda q, k, v: ops.attention(q, k, v, causal=False),
     [f32(1, 5, 4, 16), f32(1, 5, 4, 16), f32(1, 5, 4, 16)],
     {"causal": False, "alibi": False}),
    ("attention_alibi6", "attention", lambda q, k, v: ops.attention(q, k, v, alibi=True),
     [f32(2, 7, 6, 16), f32(2, 7, 6, 16), f32(2, 7, 6, 16)],
     {"causal": True, "alibi": True}),
    ("attention_alibi40_gqa", "attention",
     lambda q, k, v: ops.attention(q, k, v, alibi=True),
     [f32(1, 5, 40, 8), f32(1, 5, 8, 8), f32(1, 5, 8, 8)],
     {"causal": True, "alibi": True}),
    ("cross_entropy", "cross_entropy", ops.cross_entropy,
     [f32(2, 7, 96), 0.2 * f32(257, 96), ids((2, 7), 257)], {}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vjp_dot_product(case):
    _, name, _, inputs, params = case
    lhs, rhs = vjp_dot_gap(name, inputs, params)
    # float64 throughout: only summation-order rounding separates the two sides
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numpy_and_jax_references_agree(case):
    _, name, _, inputs, params = case
    out_np, out_jx = numpy_vs_jax(name, inputs, params)
    for a, b in zip(out_np, out_jx):
        assert a.shape == b.shape and a.dtype == b.dtype
        # float32 with different reduction orders in numpy and XLA
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_through_custom_vjp_matches_reference(case):
    _, name, user_fn, inputs, params = case
    got, want = grads_vs_reference(name, user_fn, inputs, params)
    for g, w in zip(got, want):
        # float32; the hand-written backward reassociates sums differently from autodiff
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
