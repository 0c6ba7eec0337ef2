"""bf16 layer, loss and optimizer kernels (AdamW's bf16 view, RMSNorm, SwiGLU, RoPE,
cross-entropy, embedding) against the C references and float64 numpy, on awkward shapes, each
path in-process and forced with RATRAIN_ISA in a subprocess. bf16 arrays are uint16 bits; the
references see the same values widened (exactly) to fp32."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from native_refs import AVAILABLE_PATHS, PATHS, assert_close, call, each_path  # noqa: F401

from ratrain import kernels


# One rounding of each output to bf16 (8 significant bits: half an ulp is 2^-9 = 1.95e-3 of
# the value) dominates the fp32 math (~1e-6) -> 4e-3 of the largest value.
REL_BF16 = 4e-3
# Outputs kept in fp32 (rstd, losses, lse, dw, dtable) from exactly widened inputs: only fp32
# arithmetic (and summation order) against double -> 1e-5.
REL_F32 = 1e-5


def bf16(x):
    """float -> bf16 bits with ml_dtypes (round to nearest even), independent of ratrain."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def widen(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def randbf(rng, shape, scale=1.0):
    return bf16(scale * rng.standard_normal(shape))






# ---- AdamW writing the bf16 view ----
def test_adamw_bf16_view_is_the_rne_cast_of_the_master(each_path):
    rng = np.random.default_rng(0)
    n = 10007                                        # past two 4096-element chunks, odd tail
    p, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    m = (0.1 * rng.standard_normal(n)).astype(np.float32)
    v = np.abs(0.01 * rng.standard_normal(n)).astype(np.float32)
    rp, rm, rv = p.copy(), m.copy(), v.copy()
    call("ref_adamw_step", rp, rm, rv, g, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 7)
    view = np.zeros(n, np.uint16)
    kernels.adamw_step(p, m, v, g, param_bf16=view, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                       weight_decay=0.1, step=7)
    # fp32 update arithmetic vs the double reference: a few ulp of |p| ~ 1
    assert_close(p, rp, 1e-6, "master")
    assert_close(m, rm, 1e-6, "m")
    assert_close(v, rv, 1e-6, "v")
    ref_view = np.empty(n, np.uint16)
    call("ref_f32_to_bf16", ref_view, p, n)
    assert np.array_equal(view, ref_view)             # the view is exactly the RNE cast
    assert np.array_equal(view, bf16(p))


def test_adamw_bf16_view_rounds_ties_to_even():
    # zero grad, m, v and no decay leave the master unchanged: the view is the cast of it
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80FFFF], np.uint32).view(np.float32)
    zero = np.zeros(4, np.float32)
    view = np.zeros(4, np.uint16)
    kernels.adamw_step(ties.copy(), zero.copy(), zero.copy(), zero, param_bf16=view, lr=0.0, step=1)
    assert view.tolist() == [0x3F80, 0x3F82, 0xBF80, 0x3F81]


def test_adamw_rejects_bad_views():
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError):                   # a bf16 view must be uint16 bits
        kernels.adamw_step(x, x.copy(), x.copy(), x, param_bf16=np.zeros(8, np.float16), lr=1.0, step=1)
    with pytest.raises(ValueError):                   # one view per step
        kernels.adamw_step(x, x.copy(), x.copy(), x, param_f16=np.zeros(8, np.float16),
                           param_bf16=np.zeros(8, np.uint16), lr=1.0, step=1)


# ---- RMSNorm ----
def np_rmsnorm(x, w, eps):
    x, w = x.astype(np.float64), w.astype(np.float64)
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * r * w, r[:, 0]


def test_rmsnorm_bf16(each_path):
    rng = np.random.default_rng(1)
    N, C, eps = 37, 515, 1e-5                         # C not a multiple of any vector width
    x, w, dy = randbf(rng, (N, C)), randbf(rng, C), randbf(rng, (N, C))
    y, rstd = kernels.rmsnorm_fwd(x, w, eps=eps, threads=2)
    assert y.dtype == np.uint16 and rstd.dtype == np.float32
    ry, rr = np.empty((N, C), np.float32), np.empty(N, np.float32)
    call("ref_rmsnorm_fwd", ry, rr, widen(x), widen(w), N, C, eps)
    ny, nr = np_rmsnorm(widen(x), widen(w), eps)
    assert_close(widen(y), ry, REL_BF16, "y vs C")
    assert_close(widen(y), ny, REL_BF16, "y vs numpy")
    assert_close(rstd, nr, REL_F32, "rstd")
    dw0 = rng.standard_normal(C).astype(np.float32)
    dx, dw = kernels.rmsnorm_bwd(dy, x, w, rstd, dw=dw0.copy(), threads=2)
    rdx, rdw = np.empty((N, C), np.float32), dw0.copy()
    call("ref_rmsnorm_bwd", rdx, rdw, widen(dy), widen(x), widen(w), N, C, eps)
    assert dx.dtype == np.uint16
    assert_close(widen(dx), rdx, REL_BF16, "dx")
    assert_close(dw, rdw, REL_F32, "dw")              # fp32 accumulator (+=)
    xd, gd, wd = (widen(a).astype(np.float64) for a in (x, dy, w))
    r = nr[:, None]
    proj = (gd * wd * xd * r).sum(-1, keepdims=True)
    assert_close(widen(dx), r * (gd * wd - xd * r * proj / C), REL_BF16, "dx vs numpy")
    assert_close(dw, dw0 + (gd * xd * r).sum(0), REL_F32, "dw vs numpy")


# ---- SwiGLU ----
def test_swiglu_bf16(each_path):
    rng = np.random.default_rng(2)
    n = 5001                                          # not a multiple of the 2048-element chunks
    g, u, dy = randbf(rng, n, 3.0), randbf(rng, n), randbf(rng, n)
    y = kernels.swiglu_fwd(g, u, threads=2)
    ref = np.empty(n, np.float32)
    call("ref_swiglu_fwd", ref, widen(g), widen(u), n)
    gd, ud, dyd = (widen(a).astype(np.float64) for a in (g, u, dy))
    sig = 1.0 / (1.0 + np.exp(-gd))
    assert y.dtype == np.uint16
    assert_close(widen(y), ref, REL_BF16, "y vs C")
    assert_close(widen(y), gd * sig * ud, REL_BF16, "y vs numpy")
    dg, du = kernels.swiglu_bwd(dy, g, u, threads=2)
    rdg, rdu = np.empty(n, np.float32), np.empty(n, np.float32)
    call("ref_swiglu_bwd", rdg, rdu, widen(dy), widen(g), widen(u), n)
    assert_close(widen(dg), rdg, REL_BF16, "dgate vs C")
    assert_close(widen(du), rdu, REL_BF16, "dup vs C")
    assert_close(widen(dg), dyd * ud * sig * (1 + gd * (1 - sig)), REL_BF16, "dgate vs numpy")
    assert_close(widen(du), dyd * gd * sig, REL_BF16, "dup vs numpy")


# ---- RoPE ----
def np_rope(x, inv_freq, scale, inverse):
    B, T, H, D = x.shape
    ang = np.arange(T)[:, None] * inv_freq.astype(np.float64)[None, :]
    cos = scale * np.cos(np.concatenate([ang, ang], -1))[None, :, None, :]
    sin = scale * np.sin(np.concatenate([ang, ang], -1))[None, :, None, :]
    x = x.astype(np.float64)
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos - rot * sin if inverse else x * cos + rot * sin


def test_rope_bf16(each_path):
    rng = np.random.default_rng(3)
    B, T, H, D = 2, 333, 3, 40                        # T past any tile, D/2 = 20 odd lanes
    x = randbf(rng, (B, T, H, D))
    freqs = (1.0 / 10000.0 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    for inverse, fn in ((0, kernels.rope_fwd), (1, kernels.rope_bwd)):
        y = fn(x, freqs, scale=1.25, threads=2)
        ref = np.empty(x.shape, np.float32)
        call("ref_rope", ref, widen(x), B, T, H, D, freqs, 1.25, inverse)
        assert y.dtype == np.uint16
        # the kernel's fp32 sin/cos of angles up to T (~1e-5 relative) sit under bf16 rounding
        assert_close(widen(y), ref, REL_BF16, f"rope inverse={inverse} vs C")
        assert_close(widen(y), np_rope(widen(x), freqs, 1.25, inverse), REL_BF16,
                     f"rope inverse={inverse} vs numpy")


# ---- cross-entropy ----
def np_cross_entropy(h, w, t):
    z = h.astype(np.float64) @ w.astype(np.float64).T
    mx = z.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(z - mx).sum(-1, keepdims=True)))[:, 0]
    keep = t >= 0
    losses = np.where(keep, lse - z[np.arange(len(t)), np.maximum(t, 0)], 0.0)
    return losses, lse, z


@pytest.mark.parametrize("chunk", [64, 4096])       # many vocabulary chunks, and one
def test_cross_entropy_bf16(each_path, chunk):
    rng = np.random.default_rng(4)
    N, V, C = 45, 301, 70
    h, w = randbf(rng, (N, C)), randbf(rng, (V, C), 0.3)
    t = rng.integers(0, V, size=N).astype(np.int32)
    t[3] = -1                                         # ignored token
    losses, lse = kernels.cross_entropy_fwd(h, w, t, chunk=chunk, threads=2)
    rl, rlse = np.empty(N, np.float32), np.empty(N, np.float32)
    call("ref_crossentropy_fwd", rl, rlse, widen(h), widen(w), t, N, V, C)
    nl, nlse, z = np_cross_entropy(widen(h), widen(w), t)
    # logits from the fp32-accumulating GEMM of exact bf16 products: fp32 error only
    assert_close(losses, rl, REL_F32, "losses vs C")
    assert_close(losses, nl, REL_F32, "losses vs numpy")
    assert_close(lse, nlse, REL_F32, "lse vs numpy")
    assert losses[3] == 0.0
    dl = np.full(N, 1.0 / N, np.float32)
    dw0 = (0.01 * rng.standard_normal((V, C))).astype(np.float32)
    dh, dw = kernels.cross_entropy_bwd(h, w, t, lse, dl, dw=dw0.copy(), chunk=chunk, threads=2)
    rdh, rdw = np.empty((N, C), np.float32), dw0.copy()
    call("ref_crossentropy_bwd", rdh, rdw, widen(h), widen(w), t, dl, N, V, C)
    assert dh.dtype == np.uint16 and dw.dtype == np.float32
    # See NOTE [bf16 logits gradient]: the softmax gradient G is rounded to bf16 (2^-9 relative)
    # before both GEMMs, so dw (fp32 sums of bf16 products) is bf16-accurate, not fp32's
    assert_close(widen(dh), rdh, REL_BF16, "dh vs C")
    assert_close(dw, rdw, REL_BF16, "dw vs C")
    p = np.exp(z - nlse[:, None])
    p[np.arange(N), np.maximum(t, 0)] -= 1.0
    p[t < 0] = 0.0
    p *= dl[:, None]
    assert_close(widen(dh), p @ widen(w).astype(np.float64), REL_BF16, "dh vs numpy")
    assert_close(dw, dw0 + p.T @ widen(h).astype(np.float64), REL_BF16, "dw vs numpy")


# ---- embedding ----
def test_embedding_bf16(each_path):
    rng = np.random.default_rng(5)
    V, C = 50, 73
    table = randbf(rng, (V, C))
    ids = rng.integers(0, V, size=(3, 41)).astype(np.int32)   # repeats exercise the scatter-add
    out = kernels.embedding_fwd(ids, table, threads=2)
    assert out.dtype == np.uint16 and np.array_equal(out, table[ids])   # a copy: bit-exact
    dy = randbf(rng, (3, 41, C))
    start = rng.standard_normal((V, C)).astype(np.float32)
    got = kernels.embedding_bwd(dy, ids, V, dtable=start.copy(), threads=2)
    ref = start.copy()
    call("ref_embedding_bwd", ref, widen(dy).reshape(-1, C), ids.reshape(-1), ids.size, C)
    assert_close(got, ref, 1e-6, "dtable vs C")       # same fp32 additions, maybe reordered
    want = start.astype(np.float64)
    np.add.at(want, ids.reshape(-1), widen(dy).reshape(-1, C).astype(np.float64))
    assert_close(got, want, 1e-6, "dtable vs numpy")


def test_finite_sumsq_bf16(each_path):
    rng = np.random.default_rng(6)
    x = randbf(rng, 100003)
    finite, ss = kernels.finite_sumsq(x, threads=2)
    assert finite
    assert abs(ss - float(np.sum(widen(x).astype(np.float64) ** 2))) <= 1e-9 * ss
    x[777] = 0x7F80                                   # +inf
    assert not kernels.finite_sumsq(x, threads=2)[0]


def test_layers_reject_other_dtypes():
    with pytest.raises(TypeError):
        kernels.swiglu_fwd(np.zeros(4, np.int16), np.zeros(4, np.int16))


FORCED = """
import numpy as np
from ratrain import kernels
rng = np.random.default_rng(7)
w = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
b = lambda x: kernels.cast(np.asarray(x, np.float32), np.uint16)
err = lambda got, want: float(np.abs(w(got) - want).max() / np.abs(want).max())
x, g = b(rng.standard_normal((9, 100))), b(rng.standard_normal(100))
y, _ = kernels.rmsnorm_fwd(x, g)
r = 1 / np.sqrt((w(x) ** 2).mean(-1, keepdims=True) + 1e-5)
gate, up = b(rng.standard_normal(3001)), b(rng.standard_normal(3001))
s = kernels.swiglu_fwd(gate, up)
want_s = w(gate) / (1 + np.exp(-w(gate))) * w(up)
p, m, v = np.ones(5000, np.float32), np.zeros(5000, np.float32), np.zeros(5000, np.float32)
view = np.zeros(5000, np.uint16)
kernels.adamw_step(p, m, v, np.full(5000, 0.5, np.float32), param_bf16=view, lr=0.1, step=1)
print(kernels.isa(), max(err(y, w(x) * r * w(g)), err(s, want_s)),
      int(np.array_equal(view, b(p))))
"""


@pytest.mark.parametrize("name", PATHS)
def test_ratrain_isa_forces_each_path(name):
    if name not in AVAILABLE_PATHS:
        pytest.skip(f"this CPU (or OS, for amx) does not have the {name} path")
    env = dict(os.environ, RATRAIN_ISA=name)
    res = subprocess.run([sys.executable, "-c", FORCED], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    isa, rel, view_exact = res.stdout.split()
    assert isa == name
    assert float(rel) <= REL_BF16
    assert view_exact == "1"
