"""Legends of the generated functions: what each `o[i]` of a function points at.

A function is shared by every task and layer whose calls differ only in arena offsets, so
the .pyx legend names each pointer by its role, the same text for every user: the buffer
with the function's layer written {l} and the task's micro-batch {m} (`act.L{l+1}.mb{m}`),
dtype, shape and, for a parameter's view or gradient, its offset and parameter name.
Other offsets are left out: they move with the number of layers (the backward's
cotangent ping-pong) and the recompute choice of each (layer, micro-batch), and a legend
that differed would stop two programs running the same code from sharing its build. The
task table keeps the concrete slots of each function's first user and the layers using
it (format_legend).
"""
from __future__ import annotations

from ratrain.ir.buffers import NAME_FORMS, BufferKind, parse_buffer
from ratrain.ir.graph import DTYPE_SHORT
from ratrain.passes.layer_buffers import grad_layout, view_layout

_PARAM_BUFFERS = (BufferKind.VIEW, BufferKind.GRAD)  # laid out by the layer kind


def _relative(delta: int) -> str:
    return "{l}" if delta == 0 else f"{{l{delta:+d}}}"


def _slot_text(buffer: str, slot, offset: bool = True) -> str:
    dims = ",".join(map(str, slot.shape))
    at = f"+{slot.offset}" if offset else ""
    return f"{buffer}{at}:{DTYPE_SHORT.get(slot.dtype, slot.dtype)}[{dims}]"


def _param_index(program, slot) -> tuple[int, int] | None:
    """(layer, parameter index) of a slot that starts a parameter's view or gradient."""
    name = parse_buffer(slot.buffer)
    if name.kind not in _PARAM_BUFFERS:
        return None
    layer = name.layer
    if name.kind == BufferKind.VIEW:
        starts = view_layout(program, layer)[0]
    else:
        starts = tuple(4 * e for e in grad_layout(program, layer)[0])  # fp32 elements
    return (layer, starts.index(slot.offset)) if slot.offset in starts else None


def _param_note(program, slot, names) -> str:
    found = _param_index(program, slot)
    if found is None:
        return ""
    layer, index = found
    kind = "param" if parse_buffer(slot.buffer).kind == BufferKind.VIEW else "grad of"
    return f" ({kind} {names(layer)[index]})"


def slot_role(program, slot, layer: int | None, micro_batch: int | None) -> str:
    """The slot as every user of a function sees it: `view.L{l}+64:f32[32] (param
    input_layernorm.weight)`, `act.L{l+1}.mb{m}:f32[2,8,32]`, `ws.{task}:f32[2,8,48]`."""
    name = parse_buffer(slot.buffer)
    kind_names = lambda l: program.graph.kinds[program.graph.layers[l].kind].fwd.param_names
    fixed = name.kind in _PARAM_BUFFERS
    return _slot_text(_role_name(name, layer, micro_batch), slot, fixed) + \
        _param_note(program, slot, kind_names)


def _role_name(name, layer: int | None, micro_batch: int | None) -> str:
    """The buffer's name with its layer relative to the function's (`{l+1}`), the task's
    micro-batch as `{m}` and any workspace as `ws.{task}`."""
    relative = name.layer if layer is None or name.layer is None else \
        _relative(name.layer - layer)
    own = micro_batch is not None and name.micro_batch == micro_batch
    return NAME_FORMS[name.kind].format(layer=relative, slot=name.slot, task="{task}",
                                        micro_batch="{m}" if own else name.micro_batch)


def slot_legend(program, slot) -> str:
    """The slot itself, with the model's name of the parameter it holds, if any."""
    return _slot_text(slot.buffer, slot) + _param_note(
        program, slot, lambda l: program.graph.layers[l].param_names)


def layer_kinds(program, layers) -> str:
    """`decoder layers` / `embed, head layers` for the layers using a function."""
    kinds = sorted({program.graph.layers[l].kind for l in layers if l is not None})
    return f"{', '.join(kinds)} layers" if kinds else "step-wide calls"


def format_ranges(numbers) -> str:
    """1,2,3,5 -> `1-3,5`."""
    numbers, out = sorted(set(numbers)), []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


def format_legend(table) -> str:
    """Per generated function of a stage table: the task and layer that first use it,
    every layer using it, and the concrete slot of each `o[i]` for that first user."""
    lines = [f"# legend of the generated functions of stage {table.stage}"]
    for index, (first, layers, slots) in enumerate(zip(table.first_users, table.layers,
                                                      table.first_slots)):
        used = f"layers {format_ranges(l for l in layers if l is not None)}" \
            if any(l is not None for l in layers) else "no layer"
        lines.append(f"f{index}: first used by {first}; {used}")
        lines += [f"    o[{i}] = {text}" for i, text in enumerate(slots)]
    return "\n".join(lines) + "\n"
