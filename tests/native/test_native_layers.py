"""Layer, loss and optimizer kernels (RMSNorm, RoPE, SwiGLU, embedding, LM-head
cross-entropy, AdamW, casts, finite check) against the C references and numpy/JAX."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from native_refs import assert_close, call, each_isa, f32  # noqa: F401

from ratrain import kernels, ops  # noqa: F401  (ops registers the rope rule)
from ratrain.ir.rules import lookup_rule
from ratrain.models.rope import RopeSpec, attention_scaling, inv_freq, op_params, rope_spec

# fp32 storage: single-pass fp32 arithmetic vs double references -> 1e-5 relative.
# fp16 storage: one rounding of the output to fp16 (2^-11 = 4.9e-4) dominates -> 2e-3.
REL = {np.float32: 1e-5, np.float16: 2e-3}
DTYPES = [np.float16, np.float32]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm(dtype):
    rng = np.random.default_rng(0)
    N, C, eps = 37, 515, 1e-5
    x, w, dy = randn(rng, (N, C), dtype), randn(rng, C, dtype), randn(rng, (N, C), dtype)
    y, rstd = kernels.rmsnorm_fwd(x, w, eps=eps, threads=2)
    ry, rr = np.empty((N, C), np.float32), np.empty(N, np.float32)
    call("ref_rmsnorm_fwd", ry, rr, f32(x), f32(w), N, C, eps)
    assert_close(y, ry, REL[dtype], "y")
    assert_close(rstd, rr, 1e-6, "rstd")      # fp32 statistics in both dtypes
    dw0 = randn(rng, C, np.float32)
    dx, dw = kernels.rmsnorm_bwd(dy, x, w, rstd, dw=dw0.copy(), threads=2)
    rdx, rdw = np.empty((N, C), np.float32), dw0.copy()
    call("ref_rmsnorm_bwd", rdx, rdw, f32(dy), f32(x), f32(w), N, C, eps)
    assert_close(dx, rdx, REL[dtype], "dx")
    assert_close(dw, rdw, 1e-5, "dw")          # fp32 accumulator over N rows, any dtype


def hf_rope(x, theta):
    """Hugging Face LLaMA rotate_half convention, in float64."""
    B, T, H, D = x.shape
    inv_freq = (1.0 / theta ** (np.arange(0, D, 2) / D)).astype(np.float32)
    ang = np.arange(T)[:, None] * inv_freq.astype(np.float64)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x = x.astype(np.float64)
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


def plain_rope_freqs(D, theta=10000.0):
    return inv_freq(RopeSpec(theta), D)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_hf_and_reference(dtype):
    rng = np.random.default_rng(1)
    x = randn(rng, (2, 333, 3, 64), dtype)
    freqs = plain_rope_freqs(64)
    y = kernels.rope_fwd(x, freqs, threads=2)
    ref = np.empty(x.shape, np.float32)
    call("ref_rope", ref, f32(x), *x.shape, freqs, 1.0, 0)
    assert_close(y, ref, REL[dtype], "rope vs C")
    # angles up to 332 rad: fp32 inv_freq is shared, cos/sin computed in double on both sides
    assert_close(y, hf_rope(x, 10000.0), REL[dtype], "rope vs HF")
    dy = randn(rng, x.shape, dtype)
    _, vjp = jax.vjp(rope_jnp, f32(x))
    assert_close(kernels.rope_bwd(dy, freqs, threads=2), vjp(f32(dy))[0], REL[dtype],
                 "rope bwd vs jax")


ROPE_SCALINGS = {
    "theta5e5": {"rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "factor": 2.0},
    # original 64 puts head_dim 64's wavelengths in all three llama3 bands
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    # attention factor 0.1 ln 4 + 1 = 1.139 scales cos and sin
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ROPE_SCALINGS))
def test_rope_scaling_matches_reference_and_numpy_op(name, dtype):
    """Every RoPE type through the kernel's (inv_freq, scale) contract: == the C reference,
    == the op's numpy reference, and the backward is the forward's transpose."""
    spec = rope_spec({"model_type": "llama", "max_position_embeddings": 256,
                      "rope_parameters": ROPE_SCALINGS[name]})
    rng = np.random.default_rng(2)
    x, dy = randn(rng, (2, 61, 3, 64), dtype), randn(rng, (2, 61, 3, 64), dtype)
    freqs, scale = inv_freq(spec, 64), attention_scaling(spec)
    assert (scale != 1.0) == (name == "yarn")
    rule, params = lookup_rule("rope"), op_params(spec)
    for inverse, kernel, op in ((0, kernels.rope_fwd, rule.fwd),
                                (1, kernels.rope_bwd, lambda xp, a, **p: rule.bwd(xp, a, **p)[0])):
        a = dy if inverse else x
        got = kernel(a, freqs, scale=scale, threads=2)
        ref = np.empty(a.shape, np.float32)
        call("ref_rope", ref, f32(a), *a.shape, freqs, scale, inverse)
        assert_close(got, ref, REL[dtype], f"{name} {inverse=} vs C")
        # the op rounds the angle t * inv_freq to fp32 as transformers does, the kernel keeps
        # it in double: at t <= 60 that is <= 1.9e-6 rad, under the fp32 tolerance
        assert_close(got, op(np, f32(a), **params), REL[dtype], f"{name} {inverse=} vs op")
    u, v = f32(x), f32(dy)
    lhs = np.vdot(kernels.rope_fwd(u, freqs, scale=scale).astype(np.float64), v)
    rhs = np.vdot(u.astype(np.float64), kernels.rope_bwd(v, freqs, scale=scale))
    assert lhs == pytest.approx(rhs, rel=1e-5)   # fp32 outputs, 23k-term sums


def rope_jnp(x):
    B, T, H, D = x.shape
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    ang = np.arange(T)[:, None] * inv_freq.astype(np.float64)[None, :]
    cos = jnp.asarray(np.cos(np.concatenate([ang, ang], -1)), jnp.float32)[None, :, None, :]
    sin = jnp.asarray(np.sin(np.concatenate([ang, ang], -1)), jnp.float32)[None, :, None, :]
    rot = jnp.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype):
    rng = np.random.default_rng(2)
    n = 5001                                    # not a multiple of the 2048-element chunks
    g, u, dy = randn(rng, n, dtype), randn(rng, n, dtype), randn(rng, n, dtype)
    ref = np.empty(n, np.float32)
    call("ref_swiglu_fwd", ref, f32(g), f32(u), n)
    assert_close(kernels.swiglu_fwd(g, u, threads=2), ref, REL[dtype], "swiglu")
    dg, du = kernels.swiglu_bwd(dy, g, u, threads=2)
    _, vjp = jax.vjp(lambda a, b: jax.nn.silu(a) * b, f32(g), f32(u))
    jdg, jdu = vjp(f32(dy))
    assert_close(dg, jdg, REL[dtype], "dgate")
    assert_close(du, jdu, REL[dtype], "dup")


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(dtype):
    rng = np.random.default_rng(3)
    V, C = 50, 72
    table = randn(rng, (V, C), dtype)
    ids = rng.integers(0, V, size=(3, 41)).astype(np.int32)   # repeated ids exercise scatter-add
    assert np.array_equal(kernels.embedding_fwd(ids, table, threads=2), table[ids])
    dy = randn(rng, (3, 41, C), dtype)
    start = randn(rng, (V, C), np.float32)
    got = kernels.embedding_bwd(dy, ids, V, dtable=start.copy(), threads=2)
    ref = start.copy()
    call("ref_embedding_bwd", ref, f32(dy).reshape(-1, C), ids.reshape(-1), ids.size, C)
    assert_close(got, ref, 1e-6, "dtable")       # same fp32 additions, possibly reordered
    with pytest.raises(RuntimeError):
        kernels.embedding_fwd(np.array([V], np.int32), table)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 4096])       # many vocabulary chunks, and one
def test_cross_entropy(dtype, chunk):
    rng = np.random.default_rng(4)
    N, V, C = 45, 301, 70
    h, w = randn(rng, (N, C), dtype), (0.3 * rng.standard_normal((V, C))).astype(dtype)
    targets = rng.integers(0, V, size=N).astype(np.int32)
    targets[3] = -1                                                   # ignored token
    losses, lse = kernels.cross_entropy_fwd(h, w, targets, chunk=chunk, threads=2)
    rl, rlse = np.empty(N, np.float32), np.empty(N, np.float32)
    call("ref_crossentropy_fwd", rl, rlse, f32(h), f32(w), targets, N, V, C)
    # logits come from the fp32-accumulating GEMM (fp16 inputs are exact in fp32): 1e-5
    assert_close(losses, rl, 1e-5, "losses")
    assert_close(lse, rlse, 1e-5, "lse")
    dl = np.full(N, 1.0 / N, np.float32)
    dw0 = randn(rng, (V, C), np.float32) * 0.01
    dh, dw = kernels.cross_entropy_bwd(h, w, targets, lse, dl, dw=dw0.copy(), chunk=chunk, threads=2)
    rdh, rdw = np.empty((N, C), np.float32), dw0.copy()
    call("ref_crossentropy_bwd", rdh, rdw, f32(h), f32(w), targets, dl, N, V, C)
    assert_close(dh, rdh, REL[dtype], "dh")
    assert_close(dw, rdw, 1e-5, "dw")            # fp32 accumulator in both dtypes


@pytest.mark.parametrize("dtype", [np.float16, np.float32, "bf16"])
@pytest.mark.parametrize("chunk", [64, 4096])
def test_cross_entropy_halves_compute_the_fused_bits(dtype, chunk):
    """See NOTE [split logits gradient]: zb1's B (_input) then W (_weight) give the fused
    backward's dh and dw bit for bit, and B keeps G chunk by chunk as the kernel held it."""
    rng = np.random.default_rng(6)
    N, V, C = 45, 301, 70
    h, w = randn(rng, (N, C), np.float32), 0.3 * randn(rng, (V, C), np.float32)
    if dtype == "bf16":
        h, w = kernels.cast(h, kernels.BF16), kernels.cast(w, kernels.BF16)
    else:
        h, w = h.astype(dtype), w.astype(dtype)
    targets = rng.integers(-1, V, size=N).astype(np.int32)           # some ignored
    _, lse = kernels.cross_entropy_fwd(h, w, targets, chunk=chunk, threads=2)
    dl, dw0 = np.full(N, 1.0 / N, np.float32), randn(rng, (V, C), np.float32)
    dh, dw = kernels.cross_entropy_bwd(h, w, targets, lse, dl, dw=dw0.copy(), chunk=chunk,
                                       threads=2)
    dh_b, g = kernels.cross_entropy_bwd_input(h, w, targets, lse, dl, chunk=chunk, threads=2)
    dw_w = kernels.cross_entropy_bwd_weight(g, h, V, dw=dw0.copy(), chunk=chunk, threads=2)
    assert np.array_equal(dh_b.view(np.uint8), dh.view(np.uint8))
    assert np.array_equal(dw_w, dw)
    assert g.dtype == (kernels.BF16 if dtype == "bf16" else np.float32)
    # G's chunk at v0 is its [N, vc] block at N * v0: (softmax - onehot) / N, rows of
    # ignored targets zero
    widen = (lambda a: kernels.cast(a, np.float32)) if dtype == "bf16" else f32
    dense = np.concatenate([widen(g[N * v0:N * min(v0 + chunk, V)]).reshape(N, -1)
                            for v0 in range(0, V, chunk)], axis=1)
    z = widen(h) @ widen(w).T
    p = np.exp(z - lse[:, None])
    p[np.arange(N), np.maximum(targets, 0)] -= (targets >= 0)
    p[targets < 0] = 0
    assert_close(dense, p / N, 1e-2 if dtype == "bf16" else 1e-4, "G")


def test_cross_entropy_matches_jax_grad():
    rng = np.random.default_rng(5)
    N, V, C = 30, 257, 40
    h, w = randn(rng, (N, C), np.float32), randn(rng, (V, C), np.float32)
    t = rng.integers(0, V, size=N).astype(np.int32)

    def mean_loss(h, w):
        z = h @ w.T
        return jnp.mean(jax.nn.logsumexp(z, -1) - z[jnp.arange(N), t])

    loss, (jdh, jdw) = jax.value_and_grad(mean_loss, argnums=(0, 1))(h, w)
    losses, lse = kernels.cross_entropy_fwd(h, w, t, chunk=100)
    dh, dw = kernels.cross_entropy_bwd(h, w, t, lse, np.full(N, 1.0 / N, np.float32), chunk=100)
    assert abs(float(losses.mean()) - float(loss)) <= 1e-5 * abs(float(loss))   # fp32 both
    assert_close(dh, jdh, 1e-4, "dh")            # JAX's fp32 softmax differs by a few ulp
    assert_close(dw, jdw, 1e-4, "dw")


def test_adamw_matches_reference_and_torch_formula():
    rng = np.random.default_rng(6)
    n = 10007
    p, g = randn(rng, n, np.float32), randn(rng, n, np.float32)
    m, v = randn(rng, n, np.float32) * 0.1, np.abs(randn(rng, n, np.float32)) * 0.01
    args = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=7)
    rp, rm, rv = p.copy(), m.copy(), v.copy()
    call("ref_adamw_step", rp, rm, rv, g, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 7)
    view = np.empty(n, np.float16)
    kernels.adamw_step(p, m, v, g, param_f16=view, **args)
    # fp32 update arithmetic vs double reference: a few ulp of |p| ~ 1
    assert_close(p, rp, 1e-6, "master")
    assert_close(m, rm, 1e-6, "m")
    assert_close(v, rv, 1e-6, "v")
    assert np.array_equal(view, p.astype(np.float16))    # the fp16 view is exactly the cast


def test_casts_are_bit_exact(each_isa):
    every_half = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    up = kernels.cast(every_half, np.float32)
    ref = every_half.astype(np.float32)
    assert np.array_equal(up.view(np.uint32)[~np.isnan(ref)], ref.view(np.uint32)[~np.isnan(ref)])
    assert np.isnan(up[np.isnan(ref)]).all()
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000),
                        up[~np.isnan(up)] * (1 + 2.0 ** -11),            # exact ties
                        [65504, 65519.99, 65520, -65520, np.inf, -np.inf, 0.0, -0.0, 5.96e-8]])
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):                     # numpy warns when rounding to inf
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(kernels.cast(x, np.float16).view(np.uint16), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_finite_sumsq(dtype):
    rng = np.random.default_rng(8)
    x = randn(rng, 100003, dtype)
    finite, ss = kernels.finite_sumsq(x, threads=2)
    assert finite
    assert abs(ss - float(np.sum(x.astype(np.float64) ** 2))) <= 1e-9 * ss   # double accumulation
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[77777] = bad
        assert not kernels.finite_sumsq(y, threads=2)[0]


def test_layers_each_isa(each_isa):
    """One small case of every row kernel on each SIMD path (they share the primitives)."""
    rng = np.random.default_rng(9)
    x, w = randn(rng, (9, 100), np.float16), randn(rng, 100, np.float16)
    y, rstd = kernels.rmsnorm_fwd(x, w)
    ref_y, ref_r = np.empty((9, 100), np.float32), np.empty(9, np.float32)
    call("ref_rmsnorm_fwd", ref_y, ref_r, f32(x), f32(w), 9, 100, 1e-5)
    assert_close(y, ref_y, REL[np.float16], f"{each_isa} rmsnorm")
    r = randn(rng, (1, 33, 2, 16), np.float16)
    assert_close(kernels.rope_fwd(r, plain_rope_freqs(16)), hf_rope(r, 10000.0), REL[np.float16],
                 f"{each_isa} rope")
    g, u = randn(rng, 3000, np.float16), randn(rng, 3000, np.float16)
    ref_s = np.empty(3000, np.float32)
    call("ref_swiglu_fwd", ref_s, f32(g), f32(u), 3000)
    assert_close(kernels.swiglu_fwd(g, u), ref_s, REL[np.float16], f"{each_isa} swiglu")
    h, lm = randn(rng, (20, 48), np.float16), randn(rng, (130, 48), np.float16)
    t = rng.integers(0, 130, 20).astype(np.int32)
    losses, lse = kernels.cross_entropy_fwd(h, lm, t, chunk=50)
    ref_l, ref_lse = np.empty(20, np.float32), np.empty(20, np.float32)
    call("ref_crossentropy_fwd", ref_l, ref_lse, f32(h), f32(lm), t, 20, 130, 48)
    assert_close(losses, ref_l, 1e-5, f"{each_isa} cross-entropy")   # fp32 logits and lse
