"""Flash-style attention forward/backward against the C reference and against jax.vjp of the
jnp reference: T=333 (not a tile multiple), GQA ratios 1/4/8, ALiBi, causal and not, head
dims 64/128 and odd ones, both dtypes, each ISA path."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from native_refs import assert_close, call, each_isa, f32  # noqa: F401

from ratrain import kernels


def jnp_attention(q, k, v, causal, slopes):
    """Project convention: scale 1/sqrt(D), key j visible iff j <= i, ALiBi slope*(j-i)."""
    B, T, Hq, D = q.shape
    group = Hq // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(D)
    i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    if slopes is not None:
        s = s + jnp.asarray(slopes)[None, :, None, None] * (j - i)
    if causal:
        s = jnp.where(j <= i, s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    return jnp.einsum("bhij,bjhd->bihd", jnp.exp(s - lse[..., None]), v), lse


def inputs(seed, B, T, Hq, Hkv, D, dtype):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, Hq, D)).astype(dtype)
    k = rng.standard_normal((B, T, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, T, Hkv, D)).astype(dtype)
    do = rng.standard_normal((B, T, Hq, D)).astype(dtype)
    return q, k, v, do


def alibi(Hq):
    return (2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)).astype(np.float32)


# fp32 storage: the kernel's exp polynomial (~1e-7 rel) and fp32 sums over T keys, vs double
# references -> 2e-5 of the largest value. fp16 storage: outputs are rounded to fp16
# (2^-11 = 4.9e-4 relative), plus fp32 error -> 2e-3.
REL = {np.float32: 2e-5, np.float16: 2e-3}
CASES = [  # B, T, Hq, Hkv, D, causal, alibi
    (1, 333, 4, 4, 64, True, False),
    (2, 333, 8, 2, 64, True, True),
    (1, 333, 8, 1, 128, True, False),
    (1, 97, 4, 1, 40, False, True),
    (2, 70, 2, 2, 72, False, False),
    (1, 50, 2, 1, 256, True, False),      # wide head: AM forces smaller tiles
    (1, 17, 3, 1, 1, True, True),         # degenerate head dim, GQA ratio 3
]


@pytest.mark.parametrize("B,T,Hq,Hkv,D,causal,use_alibi", CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_attention_matches_c_reference(B, T, Hq, Hkv, D, causal, use_alibi, dtype):
    q, k, v, do = inputs(0, B, T, Hq, Hkv, D, dtype)
    slopes = alibi(Hq) if use_alibi else None
    o, lse = kernels.attention_fwd(q, k, v, causal=causal, alibi_slopes=slopes, threads=2)
    ro, rlse = np.empty(q.shape, np.float32), np.empty((B, Hq, T), np.float32)
    call("ref_attention_fwd", ro, rlse, f32(q), f32(k), f32(v), slopes, B, T, Hq, Hkv, D, int(causal))
    assert o.dtype == dtype and lse.dtype == np.float32
    assert_close(o, ro, REL[dtype], "o")
    assert_close(lse, rlse, 1e-5, "lse")      # lse is kept in fp32 in both dtypes
    dq, dk, dv = kernels.attention_bwd(q, k, v, o, lse, do, causal=causal, alibi_slopes=slopes, threads=2)
    rdq, rdk, rdv = (np.empty(x.shape, np.float32) for x in (q, k, v))
    call("ref_attention_bwd", rdq, rdk, rdv, f32(q), f32(k), f32(v), f32(do), slopes,
         B, T, Hq, Hkv, D, int(causal))
    # backward also consumes the fp16-rounded o (through rowsum(dO*o)), hence 2x the forward
    rel = 2 * REL[dtype]
    for name, got, want in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert_close(got, want, rel, name)


@pytest.mark.parametrize("Hkv", [pytest.param(8, marks=pytest.mark.slow), 2,  # GQA ratios 1, 4, 8
                                 pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("use_alibi", [False, True])
def test_attention_matches_jax(Hkv, use_alibi):
    B, T, Hq, D = 1, 333, 8, 64
    q, k, v, do = inputs(1, B, T, Hq, Hkv, D, np.float32)
    slopes = alibi(Hq) if use_alibi else None
    o, lse = kernels.attention_fwd(q, k, v, alibi_slopes=slopes, threads=2)
    dq, dk, dv = kernels.attention_bwd(q, k, v, o, lse, do, alibi_slopes=slopes, threads=2)
    (jo, jlse), vjp = jax.vjp(lambda *x: jnp_attention(*x, True, slopes), q, k, v)
    jdq, jdk, jdv = vjp((jnp.asarray(do), jnp.zeros_like(jlse)))
    # JAX computes in fp32 too (different summation order): same budget as fp32 vs double
    for name, got, want in (("o", o, jo), ("lse", lse, jlse), ("dq", dq, jdq), ("dk", dk, jdk), ("dv", dv, jdv)):
        assert_close(got, np.asarray(want), 4 * REL[np.float32], name)


def test_attention_each_isa(each_isa):
    B, T, Hq, Hkv, D = 1, 150, 4, 2, 80
    q, k, v, do = inputs(2, B, T, Hq, Hkv, D, np.float16)
    slopes = alibi(Hq)
    o, lse = kernels.attention_fwd(q, k, v, alibi_slopes=slopes, threads=2)
    dq, dk, dv = kernels.attention_bwd(q, k, v, o, lse, do, alibi_slopes=slopes, threads=2)
    (jo, _), vjp = jax.vjp(lambda *x: jnp_attention(*x, True, slopes), *(f32(x) for x in (q, k, v)))
    grads = vjp((jnp.asarray(f32(do)), jnp.zeros((B, Hq, T), jnp.float32)))
    assert_close(o, np.asarray(jo), REL[np.float16], f"{each_isa} o")
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert_close(got, np.asarray(want), 2 * REL[np.float16], f"{each_isa} {name}")


def test_attention_threads_give_same_result():
    q, k, v, do = inputs(3, 2, 200, 4, 2, 64, np.float32)
    one = kernels.attention_fwd(q, k, v, threads=1)
    two = kernels.attention_fwd(q, k, v, threads=2)
    # forward tasks are independent, so the thread count must not change a single bit
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
