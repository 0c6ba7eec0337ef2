"""Render a stage's generated functions (NativeFunction, data in code/stage<N>.tasks.json)
as one Cython module: a header naming the program, the kernel-side scratch, one function
per distinct run of native calls (kernels and the glue between them, native/src/glue.c,
all cimported from ratrain.kernels), and `run_function`, the one entry point the runtime
calls per native step (the GIL is released for the whole run).

A pure renderer over the emit.py templates, imported by the ranks too: the compiler and
the runtime render the same text from the same tables (NOTE [a program directory is
data], rt/program.py). It trusts its input's types (program_format/checks.py checks them).
"""
from __future__ import annotations

from ratrain.codegen.emit import C_TYPES, EMITTERS, comment_of

PRELUDE = '''\
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset, memmove
from libc.stdlib cimport malloc
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from ratrain.kernels cimport *

ctypedef int (*function_t)(char *A, const int64_t *o, int threads, int *status,
                           double *clock) noexcept nogil

PER_CALL_CLOCK = True   # run_function takes `clock` (NOTE [calls in the trace], rt/trace.py)


cdef inline double now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9

cdef float *SCR = <float *>malloc({scratch} * sizeof(float))   # kernel-side fp32 scratch
if SCR == NULL:
    raise MemoryError()
'''

ENTRY = '''

def run_function(int function, size_t arena, size_t offsets, int threads, size_t clock=0):
    """Run generated function `function` on the arena at address `arena`, its pointers'
    int64 offsets at address `offsets`; (index of the failing call or -1, kernel status).
    `clock`: 0, or the address of calls + 1 doubles that get the monotonic seconds at
    the start and after each call."""
    if function < 0 or function >= {count}:
        raise IndexError("generated program: no such function")
    cdef int status = 0, failed
    cdef function_t run = FUNCTIONS[function]
    with nogil:
        failed = run(<char *>arena, <const int64_t *>offsets, threads, &status,
                     <double *>clock)
    return failed, status
'''


def _function(index: int, body: str, comment: str, legend: tuple[str, ...]) -> str:
    """One generated function; its header comment says who uses it and, per pointer, the
    slot role `o[i]` addresses (codegen/legend.py: {l} is the layer, {m} the micro-batch
    of the task running it)."""
    lines = "\n".join(f"    {line}" for line in body.splitlines())
    roles = "".join(f"    # o[{i}] = {role}\n" for i, role in enumerate(legend))
    return (f"\n\ncdef int f{index}(char *A, const int64_t *o, int threads, int *status, "
            f"double *clock) noexcept nogil:\n    # used by {comment}\n{roles}"
            f"    cdef int st = 0\n    if clock != NULL: clock[0] = now()\n"
            f"{lines}\n    return -1\n")


def _tables(tables: dict) -> str:
    out = []
    for name, values in sorted(tables.items()):
        out.append(f"\ncdef float {name}[{len(values)}]")
        out += [f"{name}[{i}] = {v!r}" for i, v in enumerate(values)]
    return "\n".join(out) + "\n" if out else ""


def _pointer(operand) -> str:
    return f"<{C_TYPES[operand.dtype]} *>(A + o[{operand.index}])"


def function_code(calls) -> tuple[str, int, dict]:
    """(body, fp32 scratch floats, constant tables) of a function running NativeCalls:
    each call's IR line as a comment, its template's lines, a stop on its status and, where
    the runtime asks, the time it ended (NOTE [calls in the trace], rt/trace.py)."""
    lines, scratch, tables = [], 0, {}
    for position, call in enumerate(calls):
        emitted = EMITTERS[call.op](call, _pointer)
        lines += [f"# {comment_of(call)}", *emitted.lines,
                  f"if st != 0: status[0] = st; return {position}",
                  f"if clock != NULL: clock[{position + 1}] = now()"]
        scratch = max(scratch, emitted.scratch_floats)
        tables.update(emitted.tables)
    return "\n".join(lines), scratch, tables


def render_stage(functions, header: str) -> str:
    """Cython source of one stage's generated program, from its NativeFunctions."""
    bodies, scratch, tables = [], 0, {}
    for function in functions:
        body, floats, constants = function_code(function.calls)
        bodies.append(_function(len(bodies), body, function.used_by, function.legend))
        scratch, tables = max(scratch, floats), tables | constants
    count = len(bodies)
    register = f"\n\ncdef function_t FUNCTIONS[{max(1, count)}]\n" + "".join(
        f"FUNCTIONS[{i}] = f{i}\n" for i in range(count))
    return (f"# {header}\n" + PRELUDE.format(scratch=max(1, scratch)) + _tables(tables)
            + "".join(bodies) + register + ENTRY.format(count=count))


def render_module(table, header: str) -> str:
    """Cython source of a (canonical) StageTable's module, as render_stage renders it."""
    return render_stage(table.native_functions(), header)
