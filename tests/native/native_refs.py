"""ctypes access to the plain-C references (native/ref/) compiled into ratrain.kernels, plus
the comparison helpers the native tests share. References take float32 arrays (fp16 values
upcast) and compute in double."""
import ctypes

import numpy as np
import pytest

from ratrain import kernels

_lib = ctypes.CDLL(kernels.__file__)
_P, _I, _F, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
_SIGS = {
    "ref_gemm": [_P, _P, _P, _I, _I, _I, _I, _I],
    "ref_gemm_bf16": [_P, _P, _P, _I, _I, _I, _I, _I],
    "ref_f32_to_bf16": [_P, _P, _S],
    "ref_attention_fwd": [_P, _P, _P, _P, _P, _P] + [_I] * 6,
    "ref_attention_bwd": [_P] * 8 + [_I] * 6,
    "ref_rmsnorm_fwd": [_P, _P, _P, _P, _I, _I, _F],
    "ref_rmsnorm_bwd": [_P] * 5 + [_I, _I, _F],
    "ref_rope": [_P, _P, _I, _I, _I, _I, _P, _F, _I],
    "ref_swiglu_fwd": [_P, _P, _P, _S],
    "ref_swiglu_bwd": [_P] * 5 + [_S],
    "ref_embedding_bwd": [_P, _P, _P, _I, _I],
    "ref_crossentropy_fwd": [_P] * 5 + [_I] * 3,
    "ref_crossentropy_bwd": [_P] * 6 + [_I] * 3,
    "ref_adamw_step": [_P] * 4 + [_S, _F, _F, _F, _F, _F, _I],
}
for _name, _args in _SIGS.items():
    getattr(_lib, _name).argtypes = _args
    getattr(_lib, _name).restype = None


def _ptr(a):
    return None if a is None else a.ctypes.data


def f32(a):
    return np.ascontiguousarray(a, np.float32)


def call(name, *args):
    """Call a reference; numpy arrays are passed by pointer, everything else by value."""
    getattr(_lib, name)(*[_ptr(a) if isinstance(a, np.ndarray) or a is None else a for a in args])


def assert_close(actual, expected, rel, what=""):
    """max |actual - expected| <= rel * max |expected| (errors scale with the data's size)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.abs(expected).max()), 1e-30)
    err = float(np.abs(actual - expected).max())
    assert err <= rel * scale, f"{what}: max err {err:.3g} > {rel:.3g} * {scale:.3g}"


# every dispatch path (native/src/dispatch.c); the fp32/fp16 kernels of amx and
# avx512_bf16 are avx512's, so each_isa runs those three and each_path all of them
PATHS = ("amx", "avx512_bf16", "avx512", "avx2", "scalar")


def available_isas(names=("avx512", "avx2", "scalar")):
    """The paths of `names` this CPU (and OS, for AMX) has; the process's path unchanged."""
    current = kernels.isa()
    found = []
    try:
        for name in names:
            try:
                kernels.set_isa(name)
                found.append(name)
            except RuntimeError:
                pass
    finally:
        kernels.set_isa(current)
    return found


AVAILABLE_PATHS = available_isas(PATHS)


def _on_path(name):
    """The test on path `name`, the start-up path put back after."""
    before = kernels.isa()
    try:
        kernels.set_isa(name)
        yield name
    finally:
        kernels.set_isa(before)


@pytest.fixture(params=available_isas())
def each_isa(request):
    """Run the test once per SIMD path of the fp32/fp16 kernels this CPU has."""
    yield from _on_path(request.param)


@pytest.fixture(params=AVAILABLE_PATHS)
def each_path(request):
    """Run the test on every path this CPU has, bf16 ones included."""
    yield from _on_path(request.param)
