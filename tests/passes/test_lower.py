"""lower: golden text of a two-stage toy's lowered program, and slot invariants."""
import math
from pathlib import Path

import numpy as np
import pytest

from ratrain.ir.tasks import format_schedule
from ratrain.models.trace import trace_model
from ratrain.passes.lower import format_lowered
from ratrain.program_format.lowered import Slot
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from tiny_model import MINI, tiny_config

GOLDEN = Path(__file__).parent / "golden"
CONFIG = tiny_config(MINI)


def toy(recompute="none", micro_batches=1, zero=0, dp=1):
    graph = trace_model(CONFIG, micro_batch_size=1, seq_len=4)
    options = CompileOptions(pp=2, dp=dp, micro_batches=micro_batches, micro_batch_size=1,
                             seq_len=4, recompute=recompute, zero=zero)
    return run_pipeline(Program(graph, options))[0]


def test_golden_schedule_of_two_stage_toy(golden):
    golden(GOLDEN / "toy_schedule.txt", format_schedule(toy(micro_batches=2).tasks))


@pytest.mark.parametrize("stage", [0, 1])
def test_golden_lowered_program_of_two_stage_toy(stage, golden):
    golden(GOLDEN / f"toy_lowered_stage{stage}.txt", format_lowered(toy(), stage))


@pytest.mark.parametrize("recompute,zero,dp", [("none", 0, 1), ("full", 2, 2), ("selective", 1, 2)])
def test_every_slot_lies_inside_a_planned_buffer(recompute, zero, dp):
    program = toy(recompute, micro_batches=3, zero=zero, dp=dp)
    for stage, lowered in program.lowered.items():
        offsets = program.memory.stages[stage].offsets
        for item in lowered:
            for call in item.calls:
                for slot in call.outputs + tuple(x for x in call.inputs if isinstance(x, Slot)):
                    assert slot.buffer in offsets, (item.task, str(call))
                    assert slot.offset + _nbytes(slot) <= offsets[slot.buffer][1], str(call)


def _nbytes(slot: Slot) -> int:
    return math.prod(slot.shape) * np.dtype(slot.dtype).itemsize
