"""bf16 kernels: fp32 <-> bf16 casts (round to nearest even on hand-picked ties, NaN, inf,
overflow and subnormals, bit-identical on every path and to the C reference and ml_dtypes) and
the bf16 GEMM in every layout against the C reference and numpy float64, on each path in-process
and with RATRAIN_ISA forcing it in a subprocess. bf16 arrays are uint16 arrays of the bits."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from native_refs import AVAILABLE_PATHS, PATHS, call, each_path, f32  # noqa: F401

from ratrain import kernels

LAYOUTS = {"NN": (False, False), "NT": (False, True), "TN": (True, False)}
# M, N, K: 1s, primes and sizes just past the micro-tiles (AMX 32x32 and K step 32, VDPBF16PS
# 12x32, fp32 12x32) and past the K pair (odd K)
SHAPES = [(1, 1, 1), (17, 33, 5), (33, 17, 64), (67, 45, 39), (1, 300, 17), (130, 1, 33),
          (97, 65, 513)]




@pytest.fixture(scope="module", autouse=True)
def isa_unchanged_by_this_module():
    """No test here may leave the process on a forced path (later tests would run on it)."""
    before = kernels.isa()
    yield
    assert kernels.isa() == before, f"a test left the ISA on {kernels.isa()}, not {before}"




def bits32(values):
    return np.array(values, np.uint32).view(np.float32)


def bf16(x):
    """float -> bf16 bits with ml_dtypes (round to nearest even), independent of ratrain."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def widen(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def ref_cast(x):
    out = np.empty(x.shape, np.uint16)
    call("ref_f32_to_bf16", out, f32(x), x.size)
    return out


# fp32 bits -> expected bf16 bits, each a case the rounding has to get right
RNE_CASES = {
    0x3F800000: 0x3F80,   # 1.0 exact
    0x3F808000: 0x3F80,   # 1 + 2^-8: a tie, the even neighbour is below
    0x3F818000: 0x3F82,   # 1 + 3*2^-8: a tie, the even neighbour is above
    0x3F808001: 0x3F81,   # just above the tie
    0x3F807FFF: 0x3F80,   # just below the tie
    0xBF808000: 0xBF80,   # negative tie goes to even too
    0x7F7F7FFF: 0x7F7F,   # largest value that stays finite
    0x7F7F8000: 0x7F80,   # tie at the top: the even neighbour is infinity
    0x7F7FFFFF: 0x7F80,   # FLT_MAX overflows to inf
    0xFF7FFFFF: 0xFF80,   # and -FLT_MAX to -inf
    0x7F800000: 0x7F80,   # inf
    0xFF800000: 0xFF80,   # -inf
    0x7FC00000: 0x7FC0,   # quiet NaN
    0x7F800001: 0x7FC0,   # signalling NaN, payload only in the dropped half: NaN, not inf
    0x7FA00000: 0x7FE0,   # signalling NaN: quieted, top payload kept
    0xFFC00001: 0xFFC0,   # negative NaN keeps its sign
    0x00000000: 0x0000,
    0x80000000: 0x8000,   # -0
    0x00008000: 0x0000,   # subnormal tie between 0 and the smallest bf16 subnormal: even (0)
    0x00018000: 0x0002,   # subnormal tie, odd below: up
    0x80008001: 0x8001,   # negative subnormal just above a tie
    0x007FFFFF: 0x0080,   # largest fp32 subnormal rounds up to the smallest normal
}


def test_cast_rounds_hand_picked_cases(each_path):
    src = np.array(list(RNE_CASES), np.uint32)
    want = np.array(list(RNE_CASES.values()), np.uint16)
    # tiled to 3 x 22 values: every case lands in SIMD lanes and in the scalar tail
    x = np.tile(src, 3).view(np.float32)
    got = kernels.cast(x, np.uint16)
    assert got.dtype == np.uint16
    bad = [f"{s:08x}->{g:04x} (want {w:04x})" for s, g, w in zip(np.tile(src, 3), got, np.tile(want, 3)) if g != w]
    assert not bad, f"{each_path}: {bad}"
    assert np.array_equal(ref_cast(x), np.tile(want, 3))          # the reference agrees


def test_cast_random_bits_match_reference_and_ml_dtypes(each_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, size=100_003, dtype=np.uint64).astype(np.uint32).view(np.float32)
    got = kernels.cast(x, np.uint16)
    assert np.array_equal(got, ref_cast(x)), each_path
    finite = ~np.isnan(x)                  # ml_dtypes may canonicalise NaN payloads
    assert np.array_equal(got[finite], bf16(x[finite])), each_path


def test_widening_is_exact_for_every_bf16(each_path):
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    got = kernels.cast(every, np.float32)
    assert np.array_equal(got.view(np.uint32), every.astype(np.uint32) << 16), each_path


def test_cast_rejects_float16_to_bf16():
    with pytest.raises(TypeError):
        kernels.cast(np.zeros(4, np.float16), np.uint16)


def operands(rng, M, N, K, ta, tb):
    """bf16 operands (normal values: VDPBF16PS and AMX read subnormals as zero)."""
    a = bf16(rng.standard_normal((K, M) if ta else (M, K)))
    b = bf16(rng.standard_normal((N, K) if tb else (K, N)))
    return a, b


def numpy_ref(a, b, ta, tb):
    a64, b64 = widen(a).astype(np.float64), widen(b).astype(np.float64)
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


# The inputs are exactly bf16, so each product is exact in fp32 (8 + 8 significant bits <= 24):
# the only errors are fp32 accumulation (order differs by path: pairs for VDPBF16PS, 32-wide
# tile steps for AMX) and the final store. Accumulation: |error| <~ sqrt(K) * 2^-24 * |terms|,
# far under 2e-6 of max |C| for K <= ~2000. A bf16 store rounds once more: half an ulp is
# 2^-9 of the value; allowing 2^-8 covers an accumulation error that moves a value across a tie.
REL_F32 = 2e-6
REL_BF16 = 2.0**-8


def assert_gemm_close(out, ref, what):
    """Per element: |out - ref| <= rel |ref| + REL_F32 max |ref| (rel = 0 for fp32 output)."""
    rel = REL_BF16 if out.dtype == np.uint16 else 0.0
    got = widen(out).astype(np.float64) if out.dtype == np.uint16 else out.astype(np.float64)
    bound = rel * np.abs(ref) + REL_F32 * max(float(np.abs(ref).max()), 1e-30)
    worst = np.argmax(np.abs(got - ref) - bound)
    assert np.all(np.abs(got - ref) <= bound), (
        f"{what}: at {np.unravel_index(worst, ref.shape)} got {got.flat[worst]} want {ref.flat[worst]}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", [np.uint16, np.float32])
def test_gemm_matches_c_reference(each_path, layout, out_dtype):
    ta, tb = LAYOUTS[layout]
    rng = np.random.default_rng(1)
    for M, N, K in SHAPES:
        a, b = operands(rng, M, N, K, ta, tb)
        ref = np.empty((M, N), np.float32)
        call("ref_gemm_bf16", ref, a, b, M, N, K, int(ta), int(tb))
        out = kernels.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=out_dtype, threads=2)
        assert out.dtype == out_dtype and out.shape == (M, N)
        assert_gemm_close(out, ref.astype(np.float64), f"{each_path} {layout} {M}x{N}x{K}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_large_odd_shape_matches_numpy(layout):
    """The start-up path, two threads, several column and row blocks and K chunks."""
    ta, tb = LAYOUTS[layout]
    rng = np.random.default_rng(2)
    M, N, K = 301, 2749, 1029
    a, b = operands(rng, M, N, K, ta, tb)
    out = kernels.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=np.float32, threads=2)
    assert_gemm_close(out, numpy_ref(a, b, ta, tb), f"{kernels.isa()} {layout} {M}x{N}x{K}")


def test_gemm_default_output_is_bf16_rounded_to_nearest_even(each_path):
    """With one product per element (K=1) the fp32 value is exact: the stored bf16 is its
    correctly rounded value, bit for bit."""
    rng = np.random.default_rng(3)
    a, b = operands(rng, 40, 70, 1, False, False)
    out = kernels.gemm(a, b)
    assert out.dtype == np.uint16
    assert np.array_equal(out, bf16(widen(a) @ widen(b))), each_path


def test_gemm_accumulate_and_bias(each_path):
    rng = np.random.default_rng(4)
    M, N, K = 130, 70, 300
    a, b = operands(rng, M, N, K, True, False)                 # dW += dY^T X layout
    acc = rng.standard_normal((M, N)).astype(np.float32)
    start = acc.copy()
    bias = rng.standard_normal(N).astype(np.float32)
    kernels.gemm(a, b, trans_a=True, out=acc, accumulate=True, bias=bias, threads=2)
    assert_gemm_close(acc, start + numpy_ref(a, b, True, False) + bias, f"{each_path} accumulate")
    out = kernels.gemm(a, b, trans_a=True, bias=bias, threads=2)          # bias, bf16 store
    assert_gemm_close(out, numpy_ref(a, b, True, False) + bias, f"{each_path} bias")


def test_gemm_rejects_bad_arguments():
    a = np.zeros((4, 5), np.uint16)
    with pytest.raises(TypeError):                                 # bf16 with fp16
        kernels.gemm(a, np.zeros((5, 3), np.float16))
    with pytest.raises(ValueError):                                # inner sizes differ
        kernels.gemm(a, np.zeros((6, 3), np.uint16))
    with pytest.raises(ValueError):                                # += needs an fp32 out
        kernels.gemm(a, np.zeros((5, 3), np.uint16), out=np.zeros((4, 3), np.uint16), accumulate=True)


FORCED = """
import numpy as np
from ratrain import kernels
rng = np.random.default_rng(5)
M, N, K = 45, 77, 99
a = (rng.integers(0x3e00, 0x4000, (K, M)) | (rng.integers(0, 2, (K, M)) << 15)).astype(np.uint16)
b = (rng.integers(0x3e00, 0x4000, (K, N)) | (rng.integers(0, 2, (K, N)) << 15)).astype(np.uint16)
w = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
out = kernels.gemm(a, b, trans_a=True, out_dtype=np.float32, threads=2)
ref = w(a).T @ w(b)
print(kernels.isa(), float(np.abs(out - ref).max() / np.abs(ref).max()))
"""


@pytest.mark.parametrize("name", PATHS)
def test_ratrain_isa_forces_each_bf16_path(name):
    if name not in AVAILABLE_PATHS:
        pytest.skip(f"this CPU (or OS, for amx) does not have the {name} path")
    env = dict(os.environ, RATRAIN_ISA=name)
    res = subprocess.run([sys.executable, "-c", FORCED], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    isa, rel = res.stdout.split()
    assert isa == name
    assert float(rel) <= REL_F32
