"""What each op computes, against plain numpy written independently of the references
(head loops, complex rotations, log-softmax), plus the rule-table facts passes read."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ratrain import ops
from ratrain.ir.rules import lookup_rule

R = np.random.default_rng(7)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def test_alibi_slopes_power_of_two_and_not():
    assert ops.alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    assert ops.alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    slopes40 = ops.alibi_slopes(40)
    # 32 geometric slopes 2^(-8k/32), then the odd-indexed ones of the 64-head series
    want = [2.0 ** (-(i + 1) / 4) for i in range(32)] + [2.0 ** (-(2 * j + 1) / 8) for j in range(8)]
    np.testing.assert_allclose(slopes40, want, rtol=1e-12)   # float pow rounding only


def naive_attention(q, k, v, causal, alibi):
    B, T, Hq, D = q.shape
    group = Hq // k.shape[2]
    slopes = ops.alibi_slopes(Hq) if alibi else [0.0] * Hq
    out = np.zeros_like(q, dtype=np.float64)
    for b in range(B):
        for h in range(Hq):
            kh, vh = k[b, :, h // group].astype(np.float64), v[b, :, h // group]
            s = q[b, :, h].astype(np.float64) @ kh.T / math.sqrt(D)
            s += slopes[h] * (np.arange(T)[None, :] - np.arange(T)[:, None])
            if causal:
                s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[b, :, h] = (p / p.sum(-1, keepdims=True)) @ vh
    return out


@pytest.mark.parametrize("hq,hkv,causal,alibi", [(6, 2, True, False), (6, 6, True, True),
                                                 (4, 1, False, False), (40, 8, True, True)])
def test_attention_matches_head_by_head_softmax(hq, hkv, causal, alibi):
    q, k, v = f32(2, 7, hq, 16), f32(2, 7, hkv, 16), f32(2, 7, hkv, 16)
    got = np.asarray(ops.attention(q, k, v, causal=causal, alibi=alibi))
    # float32 op vs float64 naive loop
    np.testing.assert_allclose(got, naive_attention(q, k, v, causal, alibi), rtol=1e-4, atol=1e-5)


def test_attention_lse_is_the_row_logsumexp():
    q, k, v = f32(1, 5, 2, 8), f32(1, 5, 2, 8), f32(1, 5, 2, 8)
    _, lse = lookup_rule("attention").fwd(np, q, k, v, causal=True, alibi=False)
    s = np.einsum("ihd,jhd->hij", q[0], k[0]) / math.sqrt(8)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    want = np.log(np.sum(np.exp(s), axis=-1))
    assert lse.shape == (1, 2, 5)
    np.testing.assert_allclose(lse[0], want, rtol=1e-5)   # float32 exp/log


def test_rope_rotates_half_pairs_by_position():
    x, theta = f32(1, 6, 2, 16), 10000.0
    got = np.asarray(ops.rope(x, theta=theta))
    half = 8
    z = x[..., :half] + 1j * x[..., half:]
    freq = theta ** (-np.arange(half) * 2.0 / 16)
    z = z * np.exp(1j * np.arange(6)[:, None, None] * freq)[None]
    want = np.concatenate([z.real, z.imag], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)   # float32 cos/sin
    np.testing.assert_array_equal(got[:, 0], x[:, 0])             # position 0 untouched


def test_rms_norm_swiglu_matmul_embedding_formulas():
    x, w, b, g = f32(2, 3, 8), f32(5, 8), f32(5), f32(8)
    rms = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * g
    # float32, different reduction order
    np.testing.assert_allclose(ops.rms_norm(x, g, eps=1e-6), rms, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.matmul(x, w, b), x @ w.T + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.swiglu(x, 2 * x), x / (1 + np.exp(-x)) * 2 * x,
                               rtol=1e-5, atol=1e-6)
    ids = np.array([[4, 0, 4]], np.int32)
    np.testing.assert_array_equal(ops.embedding(w, ids), w[ids])


def test_cross_entropy_is_mean_negative_log_softmax():
    h, w = f32(2, 3, 8), f32(11, 8)
    targets = np.array([[0, 10, 3], [3, 3, 7]], np.int32)
    logits = h @ w.T
    logp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
    want = -np.mean(np.take_along_axis(logp, targets[..., None], -1))
    assert float(ops.cross_entropy(h, w, targets)) == pytest.approx(want, rel=1e-5)


def test_rules_name_kernels_hidden_outputs_and_flops():
    kernels = {n: lookup_rule(n).kernel for n in
               ("matmul", "matmul_bias", "attention", "rms_norm", "rope", "swiglu",
                "embedding", "cross_entropy")}
    assert kernels["matmul"] == kernels["matmul_bias"] == "gemm"
    assert kernels["attention"] == "attention" and kernels["cross_entropy"] == "cross_entropy"
    assert lookup_rule("embedding").nondiff == (1,) and lookup_rule("cross_entropy").nondiff == (2,)
    mm = lookup_rule("matmul")
    assert mm.flops([(2, 7, 96), (40, 96)], [(2, 7, 40)]) == 2 * 14 * 96 * 40
    assert mm.bwd_flops([(2, 7, 96), (40, 96)], [(2, 7, 40)]) == 4 * 14 * 96 * 40
    att = lookup_rule("attention")
    # causal: 4 * B * Hq * D per visible (i, j) pair, T(T+1)/2 pairs
    assert att.flops([(1, 4, 2, 8)] * 3, [], causal=True, alibi=False) == 4 * 2 * 8 * 10
