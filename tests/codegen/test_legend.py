"""Legends of the generated functions: every `o[i]` a function reads has a legend line
naming its slot role, the roles agree with the lowered calls, the legend does not stop
identical code from being shared, and the task table keeps the first user's slots."""
import re

import pytest

from ratrain.codegen import NativeStep, build_stage_table
from ratrain.codegen.legend import format_legend, format_ranges
from ratrain.codegen.module import render_module
from test_codegen import config, program

FUNCTION = re.compile(r"^cdef int (f\d+)\(char \*A.*?\n(.*?)\n    return -1$", re.M | re.S)
LEGEND_LINE = re.compile(r"^    # o\[(\d+)\] = (.+)$", re.M)

PROGRAMS = [dict(), dict(pp=2, m=3), dict(pp=2, m=2, precision="fp16", recompute="full"),
            dict(cfg=config("qwen2")), dict(cfg=config("baichuan", layers=3))]


def functions(source: str) -> dict[str, str]:
    return dict(FUNCTION.findall(source))


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: "-".join(map(str, c.values())) or "llama")
def test_every_pointer_of_every_function_has_a_legend_line(case):
    case = dict(case)
    prog = program(case.pop("cfg", config()), **case)
    for stage in range(prog.options.pp):
        table = build_stage_table(prog, stage)
        bodies = functions(render_module(table, "x"))
        assert len(bodies) == len(table.functions) > 0
        for name, body in bodies.items():
            used = {int(i) for i in re.findall(r"\bo\[(\d+)\]", re.sub(r"#.*", "", body))}
            legend = [int(i) for i, _ in LEGEND_LINE.findall(body)]
            assert legend == list(range(len(legend))), name  # one line per index, in order
            assert used == set(legend), (name, sorted(used ^ set(legend)))


def test_legend_roles_match_the_lowered_calls():
    prog = program(config())
    table = build_stage_table(prog, 0)
    source = render_module(table, "x")
    for row, lowered in zip(table.rows, prog.lowered[0]):
        task, steps, _ = row
        for step in (s for s in steps if isinstance(s, NativeStep)):
            roles = dict(LEGEND_LINE.findall(functions(source)[f"f{step.function}"]))
            assert len(roles) == len(step.offsets)
            # every role's dtype/shape is one a pointer of this step's calls has
            for role in roles.values():
                assert "{l}" in role or "{l+1}" in role or "ws.{task}" in role, role
    embed_forward = next(f for f, c in zip(table.functions, table.comments)
                         if c == "F tasks of embed layers")
    roles = LEGEND_LINE.findall(functions(source)[f"f{table.functions.index(embed_forward)}"])
    assert [r for _, r in roles] == ["act.L{l+1}.mb{m}:f32[2,8,32]",
                                    "act.L{l}.mb{m}:i32[2,8]",
                                    "view.L{l}+0:f32[64,32] (param embed_tokens.weight)"]


def test_legend_keeps_identical_code_shared():
    """Modules stay equal across layer counts (even and odd: the backward's cotangent
    ping-pong lands the embedding's on the other slot) and micro-batches: the legend is
    written in roles, not in layer or micro-batch numbers or workspace offsets."""
    texts = {render_module(build_stage_table(program(config(layers=n), m=m), 0), "x")
             for n in (2, 5) for m in (2, 4)}
    assert len(texts) == 1
    assert "L{l}" in texts.pop()


def test_task_table_keeps_the_first_user_and_the_layers():
    prog = program(config(layers=4), m=2)
    table = build_stage_table(prog, 0)
    decoder = [i for i, c in enumerate(table.comments) if c == "F tasks of decoder layers"]
    assert decoder and all(table.layers[i] == (1, 2, 3, 4) for i in decoder)
    assert all(table.first_users[i] == "0F0 (L1)" for i in decoder)
    text = format_legend(table)
    assert text.startswith("# legend of the generated functions of stage 0\n")
    assert f"f{decoder[0]}: first used by 0F0 (L1); layers 1-4" in text
    first = table.first_slots[decoder[0]]
    assert len(first) == len(table.legends[decoder[0]])
    assert any("view.L1+0:f32[32] (param model.layers.0.input_layernorm.weight)" == s
               for s in first)


def test_format_ranges():
    assert format_ranges([5, 1, 2, 3, 7, 8]) == "1-3,5,7-8"
    assert format_ranges([4]) == "4" and format_ranges([]) == ""
