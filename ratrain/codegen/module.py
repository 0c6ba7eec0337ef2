"""Render a stage's task table as one Cython module: a header naming the program, small
nogil helpers for the glue ops (residual adds, gradient accumulation, the loss mean), one
function per distinct run of native calls, and `run_function`, the one entry point the
runtime calls per native step (the GIL is released for the whole run).
"""
from __future__ import annotations

PRELUDE = '''\
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset, memmove
from libc.stdlib cimport malloc
from ratrain.kernels cimport *

ctypedef int (*function_t)(char *A, const int64_t *o, int threads, int *status) noexcept nogil
cdef enum:
    CHUNK = 1024                   # fp32 elements staged per step of the fp16 helpers

cdef float *SCR = <float *>malloc({scratch} * sizeof(float))   # kernel-side fp32 scratch
if SCR == NULL:
    raise MemoryError()


cdef int add_f32(float *out, const float *a, const float *b, size_t n) noexcept nogil:
    cdef size_t i
    for i in range(n):
        out[i] = a[i] + b[i]
    return 0


cdef int add_f16(unsigned short *out, const unsigned short *a, const unsigned short *b,
                 size_t n) noexcept nogil:
    """fp16 + fp16 computed in fp32 and rounded once, as numpy does."""
    cdef float ta[CHUNK]
    cdef float tb[CHUNK]
    cdef size_t at, w, i
    at = 0
    while at < n:
        w = min(<size_t>CHUNK, n - at)
        cast_f16_to_f32(ta, a + at, w)
        cast_f16_to_f32(tb, b + at, w)
        for i in range(w):
            ta[i] = ta[i] + tb[i]
        cast_f32_to_f16(out + at, ta, w)
        at += w
    return 0


cdef int accumulate_set_f32(float *target, const float *value, size_t n) noexcept nogil:
    memmove(target, value, n * sizeof(float))
    return 0


cdef int accumulate_add_f32(float *target, const float *value, size_t n) noexcept nogil:
    cdef size_t i
    for i in range(n):
        target[i] = target[i] + value[i]
    return 0


cdef int accumulate_set_f16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    return cast_f16_to_f32(target, value, n)


cdef int accumulate_add_f16(float *target, const unsigned short *value, size_t n) noexcept nogil:
    cdef float t[CHUNK]
    cdef size_t at, w, i
    at = 0
    while at < n:
        w = min(<size_t>CHUNK, n - at)
        cast_f16_to_f32(t, value + at, w)
        for i in range(w):
            target[at + i] = target[at + i] + t[i]
        at += w
    return 0


cdef int column_sums_f32(float *out, const float *x, size_t rows, size_t cols) noexcept nogil:
    cdef size_t r, c
    memset(out, 0, cols * sizeof(float))
    for r in range(rows):
        for c in range(cols):
            out[c] = out[c] + x[r * cols + c]
    return 0


cdef int column_sums_f16(unsigned short *out, const unsigned short *x, size_t rows,
                         size_t cols) noexcept nogil:
    cdef float acc[CHUNK]
    cdef float t[CHUNK]
    cdef size_t at, w, r, c
    at = 0
    while at < cols:
        w = min(<size_t>CHUNK, cols - at)
        memset(acc, 0, w * sizeof(float))
        for r in range(rows):
            cast_f16_to_f32(t, x + r * cols + at, w)
            for c in range(w):
                acc[c] = acc[c] + t[c]
        cast_f32_to_f16(out + at, acc, w)
        at += w
    return 0


cdef void mean_into(float *out, const float *x, size_t n) noexcept nogil:
    cdef double total = 0
    cdef size_t i
    for i in range(n):
        total += x[i]
    out[0] = <float>(total / n)


cdef void spread(const float *total, float *out, size_t n) noexcept nogil:
    """d(mean)/d(x[i]) = total / n for every element."""
    cdef size_t i
    cdef float each = total[0] / n
    for i in range(n):
        out[i] = each
'''

ENTRY = '''

def run_function(int function, size_t arena, size_t offsets, int threads):
    """Run generated function `function` on the arena at address `arena`, its pointers'
    int64 offsets at address `offsets`; (index of the failing call or -1, kernel status)."""
    if function < 0 or function >= {count}:
        raise IndexError("generated program: no such function")
    cdef int status = 0, failed
    cdef function_t run = FUNCTIONS[function]
    with nogil:
        failed = run(<char *>arena, <const int64_t *>offsets, threads, &status)
    return failed, status
'''


def _function(index: int, body: str, comment: str, legend: tuple[str, ...]) -> str:
    """One generated function; its header comment says who uses it and, per pointer, the
    slot role `o[i]` addresses (codegen/legend.py: {l} is the layer, {m} the micro-batch
    of the task running it)."""
    lines = "\n".join(f"    {line}" for line in body.splitlines())
    roles = "".join(f"    # o[{i}] = {role}\n" for i, role in enumerate(legend))
    return (f"\n\ncdef int f{index}(char *A, const int64_t *o, int threads, int *status) "
            f"noexcept nogil:\n    # used by {comment}\n{roles}    cdef int st = 0\n"
            f"{lines}\n    return -1\n")


def _tables(tables: dict) -> str:
    out = []
    for name, values in sorted(tables.items()):
        out.append(f"\ncdef float {name}[{len(values)}]")
        out += [f"{name}[{i}] = {v!r}" for i, v in enumerate(values)]
    return "\n".join(out) + "\n" if out else ""


def render_module(table, header: str) -> str:
    """Cython source of one stage's generated program."""
    functions = "".join(_function(i, body, comment, legend) for i, (body, comment, legend)
                        in enumerate(zip(table.functions, table.comments, table.legends)))
    count = len(table.functions)
    register = f"\n\ncdef function_t FUNCTIONS[{max(1, count)}]\n" + "".join(
        f"FUNCTIONS[{i}] = f{i}\n" for i in range(count))
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return (comment + PRELUDE.format(scratch=max(1, table.scratch_floats))
            + _tables(table.tables) + functions + register + ENTRY.format(count=count))
