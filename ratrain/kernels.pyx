# cython: language_level=3
"""Python bindings of the native kernels (native/). Filled in by the kernels issue."""

cdef extern from "ratrain_kernels.h":
    const char *rt_isa_name()


def isa():
    """The SIMD path the kernels run on: 'avx512', 'avx2' or 'scalar'."""
    return rt_isa_name().decode()
