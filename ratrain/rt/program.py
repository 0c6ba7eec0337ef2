"""A stage's code for a rank: its rows (code/stage<N>.tasks.json, read and checked by the
program format's codec, then against the RuntimeProgram here) and its generated module,
rendered from those rows by the installed codegen and built into the user's cache. Cached
per process, as a rank runs one stage.

NOTE [a program directory is data]: a program directory is what people hand to each other
and to shared machines, so running one must not run its author's code (as safetensors
and `torch.load(weights_only=True)` load weights, and as Hugging Face runs a model's own
code only with `trust_remote_code=True`). The runtime trusts the installed ratrain and the
user's build cache, nothing inside the directory:
1. Code is derived: each stage's Cython is rendered from its JSON rows by the installed
   codegen/module.py (a pure renderer over the emit.py templates) and built only into
   the user's cache, keyed by that source (program_format/build.py). A `.so` or `.pyx`
   inside the directory is never compiled or loaded as found.
2. The shipped code/stage<N>.pyx is for people; one that differs from its rendering (an
   edit, with the manifest's hash updated or not) is refused in one line naming the file
   and the first differing line, unless --trust-program-code is given: then the first
   line the job prints says so and the shipped .pyx is built as it is. Formats before 10
   hold no functions to render from, so they run only with that flag.
3. Every field the runtime reads is checked as input (program_format/checks.py, the
   codec, check_stage_rows below): types, ranges, names against the grammar tables,
   buffers inside the arena, pointers inside their buffers, ranks and stages in range,
   every runtime call's params against its op's schema (program_format/call_ops.py);
   each problem is one `ratrain: error:` line naming the file, the field and the fix.
4. A table that passes 3 but holds a value the compiler would not write is refused by
   `ratrain run` before it starts ranks, which rebuilds the directory from program.json
   (see NOTE [tables are derived], programs.py); the ranks import no pass and cannot.
Not checked: that a generated call's shapes agree with each other (a kernel reads what
its shapes say; the pointers' byte ranges are checked against the largest shape that
uses them), so a hand-made table whose shapes disagree can still make a kernel read past
a pointer's range, though its rendering then matches a .pyx its author wrote to match.
"""
from __future__ import annotations

from pathlib import Path

from ratrain.codegen.emit import EMITTERS, ITEMSIZE
from ratrain.codegen.module import render_stage
import ratrain.ir.lax_rules  # noqa: F401  (registers the lax rules _check_call looks up: slice)
from ratrain.ir.rules import lookup_rule
from ratrain.program_format.build import BuildError, CacheError, build_module, load_module
from ratrain.program_format.call_ops import CALL_OPS, CallContext, check_call, is_call_op
from ratrain.program_format.checks import FieldError, FormatError, refused
from ratrain.program_format.codec import read_stage_rows
from ratrain.program_format.table import FORWARD_ROW, NativeStep, PythonStep

_SOURCES: dict = {}                     # (directory, stage) -> (StageRows, source)
_CODE: dict = {}                        # (directory, stage) -> (StageRows, module)

TRUST_FLAG = "--trust-program-code"


def trusted_line(directory) -> str:
    """The first line a job running a program's own code prints (case 2 of the NOTE)."""
    return (f"ratrain: {TRUST_FLAG}: running the code shipped in {directory}/code as it is, "
            "not the code its tables make")


class CodeError(ValueError):
    """The program's code cannot be run as asked; one line saying what to do."""


def stage_source(program, stage: int, trust: bool = False) -> tuple:
    """(checked StageRows, Cython source to build) of `stage`: the rendering of its rows,
    refused (CodeError, FormatError) when the shipped .pyx differs and `trust` is off."""
    key = (program.directory, stage)
    if key not in _SOURCES:
        code = Path(program.directory) / "code"
        rows_file = code / f"stage{stage}.tasks.json"
        rows = read_stage_rows(_read(rows_file), str(rows_file), tuple(EMITTERS))
        check_stage_rows(rows, program, stage, str(rows_file))
        _SOURCES[key] = (rows, _source(rows, code / f"stage{stage}.pyx", trust))
    return _SOURCES[key]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CodeError(f"{path} cannot be read ({e}); recompile the program") from None


def _source(rows, shipped: Path, trust: bool) -> str:
    if trust:
        return _read(shipped)
    if rows.functions is None:
        raise CodeError(f"{shipped.parent.parent} was written before format 10 and holds no "
                        f"tables to render its code from: recompile it, or run its own "
                        f"code/*.pyx with {TRUST_FLAG} if you trust whoever wrote it")
    try:
        rendered = render_stage(rows.functions, rows.header)
    except (KeyError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        raise FormatError(f"{shipped.with_suffix('.tasks.json')}: its functions cannot be "
                          f"rendered ({type(e).__name__}: {e}); recompile the program") from None
    line = first_difference(_read(shipped), rendered)
    if line is not None:
        raise CodeError(f"{shipped} differs from the code its tables make at line {line}; "
                        f"recompile the program, or run {shipped.name} as shipped with "
                        f"{TRUST_FLAG} if you trust whoever wrote it")
    return rendered


def first_difference(shipped: str, rendered: str) -> int | None:
    """The first line (1-based) where two texts differ, None if they are equal."""
    if shipped == rendered:
        return None
    a, b = shipped.splitlines(keepends=True), rendered.splitlines(keepends=True)
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)) + 1)


def stage_code(program, stage: int, trust: bool = False) -> tuple:
    """(StageRows, loaded generated module) of `stage` of an opened RuntimeProgram."""
    key = (program.directory, stage)
    if key not in _CODE:
        rows, source = stage_source(program, stage, trust)
        try:
            module = load_module(build_module(source))
        except CacheError as e:
            raise CodeError(str(e)) from None
        except BuildError as e:
            raise CodeError(f"the code of stage {stage} did not build (a C compiler and the "
                            f"Python headers are needed): {str(e).splitlines()[-1]}") from None
        _CODE[key] = (rows, module)
    return _CODE[key]


# ---- the rows against the program (NOTE [a program directory is data], case 3) ---------

def check_stage_rows(rows, program, stage: int, where: str) -> None:
    """Every row's task, buffers, steps and slots lie inside `stage`'s memory plan and
    the program's layers; native steps call a function the rows define with pointers
    inside the arena; Python steps name a call rt/calls.py runs. FormatError otherwise."""
    try:
        _check_rows(rows, program, stage)
    except FieldError as e:
        raise refused(where, e) from None


def _check_rows(rows, program, stage: int) -> None:
    if rows.stage != stage:
        raise FieldError("stage", f"must be {stage}, got {rows.stage}")
    plan, context = program.memory.stages[stage], call_context(program, stage)
    for r, (task, steps, touched) in enumerate(rows.rows):
        _check_task(task, program, stage, f"rows[{r}].task")
        for name in touched:
            if name not in plan.offsets:
                raise FieldError(f"rows[{r}].buffers", f"names {name!r}, no buffer of stage "
                                 f"{stage}'s memory plan")
        for i, step in enumerate(steps):
            path = f"rows[{r}].steps[{i}]"
            if isinstance(step, PythonStep):
                _check_call(step.call, plan, context, f"{path}.call")
            else:
                _check_native(step, rows.functions, plan, path)
    _check_period(rows, len(rows.rows))
    for i, (row, what) in enumerate(rows.forward):
        if row >= len(rows.rows):
            raise FieldError(f"forward[{i}][0]", f"must be a row (< {len(rows.rows)}), got {row}")
        if what != FORWARD_ROW:
            _check_call(what, plan, context, f"forward[{i}][1]")


def _check_task(task, program, stage: int, path: str) -> None:
    o = program.options
    if task.stage != stage:
        raise FieldError(path, f"runs on stage {task.stage}, not {stage}")
    if task.micro_batch is not None and task.micro_batch >= o.micro_batches:
        raise FieldError(path, f"names micro-batch {task.micro_batch} of {o.micro_batches}")
    if task.layer is not None and task.layer >= program.num_layers:
        raise FieldError(path, f"names layer {task.layer} of {program.num_layers}")


def call_context(program, stage: int) -> CallContext:
    """What `stage`'s calls' params are checked against (program_format/call_ops.py)."""
    return CallContext(program.options, stage, tuple(program.stages[stage]),
                       program.num_layers, tuple(program.tie_stages))


def _check_call(call, plan, context: CallContext, path: str) -> None:
    """A Python-run call: a runtime call of the grammar (program_format/call_ops.py),
    its params and operands checked against the op's schema, or an IR op the runtime
    runs by its rule's numpy reference (rt/calls.run_call: `slice` in ALiBi models)."""
    if is_call_op(call.op):
        check_call(call, context, path)
    elif not isinstance(call.op, str) or lookup_rule(call.op) is None:
        raise FieldError(f"{path}.op", f"must be a call of the grammar ({', '.join(CALL_OPS)})"
                         f" or an IR op with a rule, got {call.op!r}")
    if call.layer is not None and call.layer >= context.num_layers:
        raise FieldError(f"{path}.layer", f"names layer {call.layer} of {context.num_layers}")
    for key in ("outputs", "inputs"):
        for i, x in enumerate(getattr(call, key)):
            if hasattr(x, "buffer"):
                _slot_in_plan(x, plan, f"{path}.{key}[{i}]")


def _slot_in_plan(slot, plan, path: str) -> None:
    if slot.buffer not in plan.offsets:
        raise FieldError(f"{path}.buffer", f"names no buffer of the stage's memory plan, got "
                         f"{slot.buffer!r}")
    if slot.offset + slot.nbytes > plan.offsets[slot.buffer][1]:
        raise FieldError(path, f"runs past the end of buffer {slot.buffer}")


def _check_native(step: NativeStep, functions, plan, path: str) -> None:
    if functions is None:
        return  # a format before 10: its .pyx runs only when trusted
    if step.function >= len(functions):
        raise FieldError(f"{path}.function", f"must name one of the {len(functions)} "
                         f"generated functions, got {step.function}")
    needed = pointer_bytes(functions[step.function])
    if len(step.offsets) != len(needed) or len(step.nbytes) != len(needed):
        raise FieldError(path, f"must give {len(needed)} offsets and nbytes, one per pointer "
                         f"of function {step.function}")
    # NOTE: nbytes is the hazard range of the pointer's first slot, which a later call
    # may read under a larger shape; what must fit in the arena is the larger of the two
    for i, (offset, nbytes, least) in enumerate(zip(step.offsets, step.nbytes, needed)):
        if offset + max(nbytes, least) > plan.arena_bytes:
            raise FieldError(f"{path}.offsets[{i}]", f"must leave the pointer's "
                             f"{max(nbytes, least)} bytes inside the arena "
                             f"({plan.arena_bytes} bytes), got {offset}")


def pointer_bytes(function) -> list[int]:
    """Bytes of each pointer of a NativeFunction: the largest operand using it."""
    sizes = [0] * len(function.legend)
    for call in function.calls:
        for x in (*call.outputs, *call.inputs):
            n = ITEMSIZE[x.dtype]
            for d in x.shape:
                n *= d
            sizes[x.index] = max(sizes[x.index], n)
    return sizes


def _check_period(rows, count: int) -> None:
    p = rows.period
    if p is not None and p.start + p.length > count:
        raise FieldError("period", f"must lie inside the {count} rows")
