"""GEMM kernel: every layout, both input dtypes, both output dtypes, accumulate and bias,
against the C reference (small odd shapes) and numpy float64 (large non-tile-multiple shapes),
on each ISA path; and the DMA byte counters against the tiling formula (NOTE [gemm dma bytes])."""
import math

import numpy as np
import pytest
from native_refs import assert_close, call, each_isa, f32  # noqa: F401

from ratrain import kernels

LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


def operands(rng, M, N, K, ta, tb, dtype):
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(dtype)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(dtype)
    return a, b


def numpy_ref(a, b, ta, tb):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


# fp32 accumulation of K products of O(1) values: error grows like sqrt(K) * 6e-8 relative to
# |C| ~ sqrt(K); 2e-6 leaves >10x headroom. A float16 output adds one rounding (2^-11 = 4.9e-4).
REL = {np.float32: 2e-6, np.float16: 1e-3}


@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("out_dtype", [np.float16, np.float32])
def test_gemm_matches_c_reference(ta, tb, dtype, out_dtype):
    rng = np.random.default_rng(1)
    M, N, K = 67, 45, 39                       # no dimension a multiple of MR, NR or 4
    a, b = operands(rng, M, N, K, ta, tb, dtype)
    ref = np.empty((M, N), np.float32)
    call("ref_gemm", ref, f32(a), f32(b), M, N, K, int(ta), int(tb))
    out = kernels.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert_close(out, ref, REL[out_dtype], f"gemm ta={ta} tb={tb}")


@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_gemm_large_odd_shape_matches_numpy(ta, tb):
    rng = np.random.default_rng(2)
    M, N, K = 1000, 2749, 515
    a, b = operands(rng, M, N, K, ta, tb, np.float16)
    out = kernels.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=np.float32, threads=2)
    assert_close(out, numpy_ref(a, b, ta, tb), REL[np.float32], "gemm 1000x2749x515")


def test_gemm_each_isa(each_isa):
    rng = np.random.default_rng(3)
    for (ta, tb), dtype in zip(LAYOUTS, [np.float16, np.float32, np.float16, np.float32]):
        M, N, K = rng.integers(1, 300, size=3)
        a, b = operands(rng, M, N, K, ta, tb, dtype)
        out = kernels.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=np.float32, threads=2)
        assert_close(out, numpy_ref(a, b, ta, tb), REL[np.float32], f"{each_isa} {M}x{N}x{K}")


def test_gemm_accumulate_and_bias():
    rng = np.random.default_rng(4)
    M, N, K = 130, 70, 300
    a, b = operands(rng, M, N, K, True, False, np.float16)       # dW += dY^T X layout
    acc = rng.standard_normal((M, N)).astype(np.float32)
    start = acc.copy()
    bias = rng.standard_normal(N).astype(np.float32)
    kernels.gemm(a, b, trans_a=True, out=acc, accumulate=True, bias=bias)
    assert_close(acc, start + numpy_ref(a, b, True, False) + bias, REL[np.float32], "accumulate")


@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_dma_bytes_follow_tiling(ta, tb, accumulate):
    rng = np.random.default_rng(5)
    M, N, K = 1000, 2749, 515
    a, b = operands(rng, M, N, K, ta, tb, np.float16)
    out = np.zeros((M, N), np.float32)
    plan = kernels.gemm_plan(M, N, K, dtype=np.float16, trans_a=ta, trans_b=tb)
    kernels.dma_reset()
    kernels.gemm(a, b, trans_a=ta, trans_b=tb, out=out, accumulate=accumulate, threads=2)
    stats = kernels.dma_stats()
    n_jc = math.ceil(N / plan["nc"])
    assert stats["ddr_to_gsm"] == K * N * 2                          # B once per column block
    assert stats["ddr_to_am"] == M * K * 2 * n_jc + (M * N * 4 if accumulate else 0)
    assert stats["am_to_ddr"] == M * N * 4
    assert stats["gsm_to_ddr"] == 0


def test_gemm_rejects_bad_arguments():
    a = np.zeros((4, 5), np.float16)
    with pytest.raises(ValueError):
        kernels.gemm(a, np.zeros((6, 4), np.float16))
    with pytest.raises(ValueError):
        kernels.gemm(a, np.zeros((5, 3), np.float16), accumulate=True)
