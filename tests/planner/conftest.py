"""Fixtures shared by the planner's tests."""
import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.program_format.options import CompileOptions


@pytest.fixture(scope="session")
def after_norm_only_budget() -> int:
    """A budget between tiny's fp16 arena under --update-rule after-norm and under commit
    (its undo copies), one rank, 2 micro-batches of 4 x 32 tokens: only after-norm fits
    (NOTE [update rule fallback])."""
    arenas = {}
    for rule in ("commit", "after-norm"):
        options = CompileOptions(micro_batches=2, micro_batch_size=4, seq_len=32,
                                 precision="fp16", update_rule=rule, recompute="auto")
        program, _ = compile_graph(trace_for(models.get_config("tiny"), "tiny", options),
                                   options)
        arenas[rule] = program.memory.arena_bytes
    assert arenas["commit"] > arenas["after-norm"]
    return (arenas["commit"] + arenas["after-norm"]) // 2
