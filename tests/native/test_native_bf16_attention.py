"""bf16 flash attention (uint16 bits of q, k, v, o, dO, dq, dk, dv; fp32 lse) against the C
reference and a float64 numpy reference on awkward shapes (T not a tile multiple, odd and wide
head dims, GQA 1/3/4, ALiBi, causal and not), on each path in-process and with RATRAIN_ISA
forcing it in a subprocess: amx runs the tile products on AMX bf16 tiles (attention_bf16.c),
the other paths widen to the fp32 tiles (NOTE [bf16 attention path])."""
import os
import subprocess
import sys

import numpy as np
import pytest
from native_refs import AVAILABLE_PATHS, PATHS, assert_close, call, each_path  # noqa: F401
from test_native_bf16_layers import randbf, widen

from ratrain import kernels

# NOTE [bf16 attention rounding] in native/src/attention_bf16.c: half an ulp of bf16 is 2^-9
# (1.95e-3) relative. o: P rounded to bf16 for P V, then o rounded -> two roundings, 6e-3 of
# the largest value. Gradients: o enters through rowsum(dO o), P and dS are rounded before
# their products, and the gradient itself is rounded -> four roundings, 1.2e-2.
REL_O, REL_GRAD = 6e-3, 1.2e-2
REL_LSE = 1e-5          # lse is fp32 from exact bf16 products: fp32 arithmetic only

CASES = [  # B, T, Hq, Hkv, D, causal, alibi
    (1, 333, 4, 4, 64, True, False),      # T past five 64-row tiles, no GQA
    (2, 130, 8, 2, 128, True, True),      # GQA 4, ALiBi, two batches
    (1, 97, 3, 1, 40, False, True),       # D not a multiple of 32, GQA 3, non-causal
    (1, 50, 2, 1, 256, True, False),      # wide head, T under one tile
    (1, 17, 2, 2, 2, True, True),         # one bf16 pair per row
    (1, 65, 2, 1, 30, True, False),       # one key past a tile, odd pair count
]


def np_attention(q, k, v, do, causal, slopes):
    """float64 forward and backward of the project's attention (scale 1/sqrt(D), key j visible
    iff j <= i when causal, ALiBi slope*(j-i), GQA head h -> kv head h // (Hq/Hkv))."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    B, T, Hq, D = q.shape
    group = Hq // k.shape[2]
    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) / np.sqrt(D)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    if slopes is not None:
        s = s + slopes.astype(np.float64)[None, :, None, None] * (j - i)
    if causal:
        s = np.where(j <= i, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(s - mx).sum(-1))
    p = np.exp(s - lse[..., None])
    o = np.einsum("bhij,bjhd->bihd", p, vv)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    ds = p * (dp - np.einsum("bihd,bihd->bhi", do, o)[..., None]) / np.sqrt(D)
    dq = np.einsum("bhij,bjhd->bihd", ds, kk)
    dk = np.einsum("bhij,bihd->bjhd", ds, q).reshape(B, T, -1, group, D).sum(3)
    dv = np.einsum("bhij,bihd->bjhd", p, do).reshape(B, T, -1, group, D).sum(3)
    return o, lse, dq, dk, dv


def alibi(Hq):
    return (2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)).astype(np.float32)


def inputs(seed, B, T, Hq, Hkv, D):
    rng = np.random.default_rng(seed)
    return (randbf(rng, (B, T, Hq, D)), randbf(rng, (B, T, Hkv, D)), randbf(rng, (B, T, Hkv, D)),
            randbf(rng, (B, T, Hq, D)))


def run(q, k, v, do, causal, slopes, threads=2):
    o, lse = kernels.attention_fwd(q, k, v, causal=causal, alibi_slopes=slopes, threads=threads)
    grads = kernels.attention_bwd(q, k, v, o, lse, do, causal=causal, alibi_slopes=slopes,
                                  threads=threads)
    return o, lse, grads


@pytest.mark.parametrize("B,T,Hq,Hkv,D,causal,use_alibi", CASES)
def test_attention_bf16_matches_float64_numpy(each_path, B, T, Hq, Hkv, D, causal, use_alibi):
    q, k, v, do = inputs(0, B, T, Hq, Hkv, D)
    slopes = alibi(Hq) if use_alibi else None
    o, lse, grads = run(q, k, v, do, causal, slopes)
    assert o.dtype == np.uint16 and lse.dtype == np.float32
    assert all(g.dtype == np.uint16 for g in grads)
    want = np_attention(*(widen(x) for x in (q, k, v, do)), causal, slopes)
    assert_close(widen(o), want[0], REL_O, f"{each_path} o")
    assert_close(lse, want[1], REL_LSE, f"{each_path} lse")
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want[2:]):
        assert_close(widen(got), ref, REL_GRAD, f"{each_path} {name}")


@pytest.mark.parametrize("B,T,Hq,Hkv,D,causal,use_alibi", CASES[:3])
def test_attention_bf16_matches_c_reference(B, T, Hq, Hkv, D, causal, use_alibi):
    q, k, v, do = inputs(1, B, T, Hq, Hkv, D)
    slopes = alibi(Hq) if use_alibi else None
    o, lse, (dq, dk, dv) = run(q, k, v, do, causal, slopes)
    ro, rlse = np.empty(q.shape, np.float32), np.empty((B, Hq, T), np.float32)
    call("ref_attention_fwd", ro, rlse, widen(q), widen(k), widen(v), slopes, B, T, Hq, Hkv, D,
         int(causal))
    assert_close(widen(o), ro, REL_O, "o")
    assert_close(lse, rlse, REL_LSE, "lse")
    rdq, rdk, rdv = (np.empty(x.shape, np.float32) for x in (q, k, v))
    call("ref_attention_bwd", rdq, rdk, rdv, widen(q), widen(k), widen(v), widen(do), slopes,
         B, T, Hq, Hkv, D, int(causal))
    for name, got, want in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert_close(widen(got), want, REL_GRAD, name)


def test_attention_bf16_threads_agree():
    q, k, v, do = inputs(2, 2, 200, 4, 2, 64)
    one, two = run(q, k, v, do, True, None, threads=1), run(q, k, v, do, True, None, threads=2)
    # forward tasks are independent: the thread count must not change a single bit
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    # dq adds tiles in lock order, which may differ: fp32 reordering under one bf16 rounding
    for a, b in zip(one[2], two[2]):
        assert_close(widen(a), widen(b), 2 ** -8, "grads")


def test_attention_bf16_is_not_the_float16_result():
    """The bits are bf16: the same values as float16 give a different, larger-range result."""
    q, k, v, _ = inputs(3, 1, 40, 2, 2, 16)
    o, _ = kernels.attention_fwd(q, k, v)
    o16, _ = kernels.attention_fwd(*(widen(x).astype(np.float16) for x in (q, k, v)))
    assert_close(widen(o), o16.astype(np.float32), REL_O, "bf16 vs fp16 storage")
    assert not np.array_equal(widen(o), o16.astype(np.float32))


FORCED = """
import numpy as np
from ratrain import kernels
import sys
sys.path.insert(0, {tests!r})
from test_native_bf16_attention import inputs, np_attention, widen, alibi
q, k, v, do = inputs(4, 1, 150, 4, 2, 80)
s = alibi(4)
o, lse = kernels.attention_fwd(q, k, v, alibi_slopes=s, threads=2)
grads = kernels.attention_bwd(q, k, v, o, lse, do, alibi_slopes=s, threads=2)
want = np_attention(*(widen(x) for x in (q, k, v, do)), True, s)
err = lambda a, b: float(np.abs(widen(a) - b).max() / np.abs(b).max())
print(kernels.isa(), err(o, want[0]), max(err(g, w) for g, w in zip(grads, want[2:])))
"""


@pytest.mark.parametrize("name", PATHS)
def test_ratrain_isa_forces_each_path(name):
    if name not in AVAILABLE_PATHS:
        pytest.skip(f"this CPU (or OS, for amx) does not have the {name} path")
    env = dict(os.environ, RATRAIN_ISA=name)
    code = FORCED.format(tests=os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    isa, rel_o, rel_grad = res.stdout.split()
    assert isa == name
    assert float(rel_o) <= REL_O and float(rel_grad) <= REL_GRAD
