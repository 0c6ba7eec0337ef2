"""Buffer names (ir/buffers.py): every kind prints and parses back, malformed names are
refused, and the per-layer rules give the names the compiled programs use."""
from functools import lru_cache
from string import Formatter

import pytest

from ratrain import models
from ratrain.ir.buffers import (NAME_FORMS, BufferKind, BufferName, arena_name, buffer_name,
                                grad_accumulator, is_grad_shard, message_buffer, parse_buffer,
                                sync_buffers, update_grad)
from ratrain.ir.tasks import Kind, Task, parse_task
from ratrain.models.trace import trace_model
from ratrain.passes.buffers import persistent_buffers, task_effects
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program

# One value per placeholder of the forms: a new kind's operands are covered without edits.
SAMPLE = {"layer": 12, "micro_batch": 3, "slot": 1, "task": "1REC[L5]3"}


def operands(kind):
    return {name: SAMPLE[name] for _, name, _, _ in Formatter().parse(NAME_FORMS[kind]) if name}


@pytest.mark.parametrize("kind", list(BufferKind))
def test_every_kind_prints_and_parses_back(kind):
    name = BufferName(kind, **operands(kind))
    text = str(name)
    assert text == NAME_FORMS[kind].format(**operands(kind))
    assert parse_buffer(text) == name
    assert buffer_name(kind, **operands(kind)) == text
    assert str(parse_buffer(arena_name(text))) == arena_name(text)


def test_names_are_todays():
    assert [buffer_name(BufferKind.ACT, layer=5, micro_batch=3), buffer_name("grad", layer=3),
            buffer_name(BufferKind.GSHARD, layer=3), buffer_name(BufferKind.UNDO, layer=3),
            buffer_name(BufferKind.ZVIEW, slot=0), buffer_name(BufferKind.GOUT, micro_batch=2),
            buffer_name(BufferKind.WS, task=parse_task("0REC[L1]0"))] == \
        ["act.L5.mb3", "grad.L3", "gshard.L3", "undo.L3", "zview.0", "gout.mb2", "ws.0REC[L1]0"]


def test_workspace_parses_in_task_and_arena_form():
    assert parse_buffer("ws.0REC[L1]0").task == "0REC[L1]0"
    assert parse_buffer("ws.0REC(L1)0") == BufferName(BufferKind.WS, task="0REC(L1)0")
    assert parse_buffer("ws.1B2").kind == BufferKind.WS


@pytest.mark.parametrize("text", ["", "grad", "grad.L", "grad.Lx", "grad.3", "grad.L3 ",
                                  "act.L5", "act.L5.mb", "act.L5.mb3.x", "in.L1", "view.L-1",
                                  "zview.a", "zview.L0", "foo.L1", "ws.", "ws.notatask",
                                  "ws.1F", "GRAD.L3"])
def test_malformed_names_are_refused_naming_the_forms(text):
    with pytest.raises(ValueError) as error:
        parse_buffer(text)
    assert repr(text) in str(error.value)
    if not text.startswith("ws."):
        assert "act.L<layer>.mb<micro_batch>" in str(error.value)


@pytest.mark.parametrize("kind, given", [(BufferKind.GRAD, {}),
                                         (BufferKind.GRAD, {"layer": 1, "micro_batch": 0}),
                                         (BufferKind.ACT, {"layer": 1}),
                                         (BufferKind.ZVIEW, {"layer": 1}),
                                         (BufferKind.MASTER, {"layer": -1}),
                                         (BufferKind.IN, {"micro_batch": "3"}),
                                         (BufferKind.WS, {"task": "notatask"}),
                                         ("nosuchkind", {"layer": 1})])
def test_buffer_name_refuses_wrong_operands(kind, given):
    with pytest.raises(ValueError):
        buffer_name(kind, **given)


def test_messages_by_task():
    assert [message_buffer(parse_task(t)) for t in
            ("0SEND_F3", "1POST_F3", "1RECV_F3", "1SEND_B2", "0POST_B2", "0RECV_B2")] == \
        ["out.mb3", "in.mb3", "in.mb3", "gout.mb2", "gin.mb2", "gin.mb2"]


@pytest.mark.parametrize("zero, scattered, accumulator, sync, update", [
    (0, False, "grad.L4", ("grad.L4", "grad.L4"), "grad.L4"),
    (1, False, "grad.L4", ("grad.L4", "grad.L4"), "grad.L4"),
    (2, False, "grad.L4", ("grad.L4", "gshard.L4"), "gshard.L4"),
    (3, False, "grad.L4", ("grad.L4", "gshard.L4"), "gshard.L4"),
    (2, True, "gshard.L4", ("gshard.L4", "gshard.L4"), "gshard.L4"),
    (3, True, "gshard.L4", ("gshard.L4", "gshard.L4"), "gshard.L4")])
def test_layer_gradient_rules(zero, scattered, accumulator, sync, update):
    assert grad_accumulator(4, scattered) == accumulator
    assert sync_buffers(4, zero, scattered) == sync
    assert update_grad(4, zero) == update
    assert is_grad_shard(update) == (zero >= 2)


# ---- the compiled programs use exactly these names --------------------------------------

@lru_cache(maxsize=None)
def compiled(zero: int, grad_accum: str = "local", schedule: str = "ratrain"):
    graph = trace_model(models.get_config("tiny"), micro_batch_size=2, seq_len=32)
    options = CompileOptions(pp=2, dp=2, zero=zero, micro_batches=4, micro_batch_size=2,
                             seq_len=32, grad_accum=grad_accum, schedule=schedule,
                             recompute="selective")
    return run_pipeline(Program(graph, options))[0]


PROGRAMS = [(0, "local", "ratrain"), (1, "local", "ratrain"), (2, "local", "ratrain"),
            (2, "scatter", "ratrain"), (3, "local", "ratrain"), (2, "local", "baseline")]


@pytest.mark.parametrize("zero, grad_accum, schedule", PROGRAMS)
def test_every_planned_and_freed_buffer_parses(zero, grad_accum, schedule):
    program = compiled(zero, grad_accum, schedule)
    for stage, memory in program.memory.stages.items():
        names = set(memory.offsets)
        assert names and all(str(parse_buffer(n)) == n for n in names)
        frees = [t.buffer for t in program.tasks[stage] if t.kind == Kind.FREE]
        assert frees and all(str(parse_buffer(n)) == n for n in frees)
        assert set(frees) <= names
        slots = {s.buffer for lt in program.lowered[stage] for c in lt.calls
                 for s in c.outputs + c.inputs if hasattr(s, "buffer")}
        assert slots <= names and {parse_buffer(n).kind for n in slots} >= \
            {BufferKind.ACT, BufferKind.MASTER, BufferKind.WS}


@pytest.mark.parametrize("zero, grad_accum, schedule", PROGRAMS)
def test_passes_and_lowering_use_the_layer_rules(zero, grad_accum, schedule):
    program = compiled(zero, grad_accum, schedule)
    assert (program.scatter_grads != frozenset()) == (grad_accum == "scatter")
    for stage, lowered in program.lowered.items():
        persistent = {b.name for b in persistent_buffers(program, stage)}
        first_b = Task(stage, Kind.B, micro_batch=0)
        created = {b.name for b in task_effects(program, first_b).creates}
        for layer in program.stages[stage]:
            scattered = layer in program.scatter_grads
            assert grad_accumulator(layer, scattered) in created
            assert buffer_name(BufferKind.MASTER, layer=layer) in persistent
        for lt in lowered:
            layer = lt.task.layer
            if lt.task.kind == Kind.SYNC:
                source, target = sync_buffers(layer, zero, layer in program.scatter_grads)
                call, = lt.calls
                assert (call.inputs[0].buffer, call.outputs[0].buffer) == (source, target)
                assert set(task_effects(program, lt.task).reads) <= {source, target}
            if lt.task.kind == Kind.UPD:
                assert lt.calls[0].inputs[0].buffer == update_grad(layer, zero)
                assert update_grad(layer, zero) in task_effects(program, lt.task).reads
