"""ISA dispatch (RATRAIN_ISA forces a path at start-up) and the .pxd contract: a Cython module
that cimports ratrain.kernels calls the kernels nogil and gets status codes back."""
import os
import subprocess
import sys
import textwrap

import pytest

from ratrain import kernels


@pytest.fixture(scope="module", autouse=True)
def isa_unchanged_by_this_module():
    """Every test here that forces a path puts the previous one back: later tests in the
    process must run on the dispatch start-up chose, not on the last path forced here."""
    before = kernels.isa()
    yield
    assert kernels.isa() == before, f"a test left the ISA on {kernels.isa()}, not {before}"


@pytest.fixture
def restore_isa():
    """The ISA of the process before the test; set back afterwards, whatever happened."""
    before = kernels.isa()
    try:
        yield before
    finally:
        kernels.set_isa(before)


@pytest.mark.parametrize("name", ["amx", "avx512_bf16", "avx512", "avx2", "scalar"])
def test_ratrain_isa_env_forces_path(name, restore_isa):
    env = dict(os.environ, RATRAIN_ISA=name)
    got = subprocess.run([sys.executable, "-c", "import ratrain.kernels as k; print(k.isa())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    try:                                   # the CPU may lack the path: then it is not chosen
        kernels.set_isa(name)
        available = kernels.isa() == name
    except RuntimeError:
        available = False
    assert (got == name) == available


def test_set_isa_rejects_unknown_name(restore_isa):
    with pytest.raises(RuntimeError):
        kernels.set_isa("sse9")
    assert kernels.isa() == restore_isa


GENERATED = '''
from ratrain.kernels cimport gemm_fwd_f32, gemm_fwd_bf16, cast_f32_to_bf16, RT_F32, RT_BF16
from ratrain.kernels cimport RT_TRANS_B, RT_EINVAL, adamw_step_f32_bf16, swiglu_fwd_bf16
def run(float[:, ::1] a, float[:, ::1] b, float[:, ::1] out):
    cdef int st, bad
    with nogil:
        st = gemm_fwd_f32(&out[0, 0], RT_F32, &a[0, 0], &b[0, 0], NULL,
                          a.shape[0], b.shape[0], a.shape[1], RT_TRANS_B, 1)
        bad = gemm_fwd_f32(&out[0, 0], RT_F32, &a[0, 0], &b[0, 0], NULL, -1, 1, 1, 0, 1)
    return st, bad == RT_EINVAL
def run_bf16(float[:, ::1] a, float[:, ::1] b, unsigned short[:, ::1] a16,
             unsigned short[:, ::1] b16, unsigned short[:, ::1] out):
    cdef int st
    with nogil:
        cast_f32_to_bf16(&a16[0, 0], &a[0, 0], a.shape[0] * a.shape[1])
        cast_f32_to_bf16(&b16[0, 0], &b[0, 0], b.shape[0] * b.shape[1])
        st = gemm_fwd_bf16(&out[0, 0], RT_BF16, &a16[0, 0], &b16[0, 0], NULL,
                           a.shape[0], b.shape[0], a.shape[1], RT_TRANS_B, 1)
    return st
def run_bf16_layers(float[::1] p, float[::1] m, float[::1] v, float[::1] g,
                    unsigned short[::1] view, unsigned short[::1] gate, unsigned short[::1] out):
    cdef int st, st2
    with nogil:
        st = adamw_step_f32_bf16(&p[0], &m[0], &v[0], &view[0], &g[0], p.shape[0], 0.1, 0.9,
                                 0.999, 1e-8, 0.0, 1)
        st2 = swiglu_fwd_bf16(&out[0], &gate[0], &gate[0], gate.shape[0], 1)
    return st, st2
'''


@pytest.mark.slow
def test_pxd_is_cimportable_by_generated_code(tmp_path):
    """The generated module needs only the package root on Cython's include path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(kernels.__file__)))
    (tmp_path / "gen_prog.pyx").write_text(GENERATED)
    (tmp_path / "build_it.py").write_text(textwrap.dedent(f"""
        from setuptools import setup
        from Cython.Build import cythonize
        setup(ext_modules=cythonize(["gen_prog.pyx"], language_level=3, include_path=[{root!r}]),
              script_args=["build_ext", "--inplace", "-q"])
    """))
    build = subprocess.run([sys.executable, "build_it.py"], cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    check = textwrap.dedent("""
        import numpy as np, gen_prog
        a = np.arange(12, dtype=np.float32).reshape(3, 4); b = np.ones((5, 4), np.float32)
        out = np.zeros((3, 5), np.float32)
        st, bad_ok = gen_prog.run(a, b, out)
        assert st == 0 and bad_ok and np.array_equal(out, a @ b.T), (st, bad_ok, out)
        u16 = lambda x: np.zeros(x.shape, np.uint16)
        out16 = np.zeros((3, 5), np.uint16)               # bf16 bits; sums up to 38 are exact
        st = gen_prog.run_bf16(a, b, u16(a), u16(b), out16)
        got = (out16.astype(np.uint32) << 16).view(np.float32)
        assert st == 0 and np.array_equal(got, a @ b.T), (st, got)
        gate = np.array([0x4000, 0x0000], np.uint16)      # bf16 2.0 and 0.0
        out, view, z = np.zeros(2, np.uint16), np.zeros(1, np.uint16), np.zeros(1, np.float32)
        st, st2 = gen_prog.run_bf16_layers(np.ones(1, np.float32), z, z.copy(),
                                           np.full(1, 0.5, np.float32), view, gate, out)
        # first AdamW step moves 1.0 by lr = 0.1: 0.9 -> bf16 0x3F66 (0.8984375);
        # silu(2) * 2 = 3.5232 -> bf16 0x4061 (3.515625)
        assert st == 0 and view.tolist() == [0x3F66], (st, view)
        assert st2 == 0 and out.tolist() == [0x4061, 0], (st2, out)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert res.stdout.strip() == "ok", res.stderr
