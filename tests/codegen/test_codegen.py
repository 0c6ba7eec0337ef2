"""Generated code: the task table's size grows with layer kinds, not layers x micro-batches;
the golden text of a two-layer model's module; and running every stage's table (native
steps through the built module, the rest through rt/calls.py) gives, call by call, the
arena the numpy references give, for LLaMA (GQA), Qwen2 (biases) and Baichuan (ALiBi),
in fp32 and fp16."""
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from ratrain import models
from ratrain.codegen import NativeStep, build_stage_table, generate
from ratrain.program_format.build import build_module, load_module
from ratrain.codegen.module import render_module
from ratrain.models.trace import trace_model
from ratrain.optim import AdamW
from ratrain.rt.reference import Executor
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.rt.calls import run_call
from tiny_model import tiny_config

GOLDEN = Path(__file__).parent / "golden" / "two_layer_stage0.pyx"
B, T = 2, 8


def config(model_type="llama", layers=2, kv_heads=2, **extra):
    return tiny_config(model_type=model_type, num_hidden_layers=layers,
                       num_key_value_heads=kv_heads, **extra)


@lru_cache(maxsize=None)
def _program(cfg_json: str, pp, m, precision, recompute):
    cfg = json.loads(cfg_json)
    graph = trace_model(cfg, micro_batch_size=B, seq_len=T,
                        dtype="float16" if precision == "fp16" else "float32")
    options = CompileOptions(pp=pp, micro_batches=m, micro_batch_size=B, seq_len=T,
                             recompute=recompute, precision=precision, budget=None)
    return run_pipeline(Program(graph, options))[0]


def program(cfg: dict, pp=1, m=2, precision="fp32", recompute="none"):
    return _program(json.dumps(cfg, sort_keys=True), pp, m, precision, recompute)


def test_code_grows_with_kinds_not_layers_or_micro_batches():
    sources = {(layers, m): render_module(build_stage_table(
        program(config(layers=layers), m=m), 0), "x") for layers in (2, 6) for m in (2, 8)}
    assert len(set(sources.values())) == 1  # m = 1 would lack the "+=" accumulation
    small = program(config(layers=2), m=1)
    rows = build_stage_table(small, 0).rows
    assert len(rows) == len(small.lowered[0])


def test_golden_module_of_a_two_layer_model(golden):
    table = build_stage_table(program(config()), 0)
    golden(GOLDEN, render_module(table, "golden: two-layer llama, pp 1, fp32"))


def _run_tables(prog, module_of, check_against_reference: bool):
    """One step of every rank (pp ranks, dp 1) walking the tables; each native step is
    compared with the numpy references of its calls run on a copy of the arena."""
    params = models.init_params(prog.graph.config, seed=0)
    ex = Executor(prog, params, AdamW(lr=1e-2))  # its Transport
    ex.step, ex.tokens = 1, np.random.default_rng(1).integers(
        0, prog.graph.config["vocab_size"], (prog.options.micro_batches * B, T + 1),
        dtype=np.int32)
    tables = {s: build_stage_table(prog, s) for s in range(prog.options.pp)}
    worst = 0.0
    # run the tables rank by rank as far as messages allow (the executor raises _Wait)
    position = {s: 0 for s in tables}
    while any(position[s] < len(tables[s].rows) for s in tables):
        moved = False
        for s, table in tables.items():
            st = ex.ranks[s]
            while position[s] < len(table.rows):
                task, steps, _ = table.rows[position[s]]
                lowered = prog.lowered[s][position[s]]
                try:
                    worst = max(worst, _run_row(ex, st, steps, lowered, module_of(s),
                                                check_against_reference))
                except Exception as e:  # noqa: BLE001  (the executor's _Wait)
                    if type(e).__name__ != "_Wait":
                        raise
                    break
                position[s] += 1
                moved = True
        assert moved, "tables deadlocked"
    return worst


def _run_row(ex, st, steps, lowered, module, check: bool) -> float:
    """Run one task's steps; the largest relative difference native vs reference."""
    worst, calls = 0.0, iter(lowered.calls)
    for step in steps:
        if not isinstance(step, NativeStep):
            run_call(ex, st, next(calls))
            continue
        native_calls = [next(calls) for _ in step.calls]
        before = st.arena.copy()
        offsets = np.asarray(step.offsets or (0,), np.int64)
        clock = np.zeros(len(step.calls) + 1)  # NOTE [calls in the trace], rt/trace.py
        failed, status = module.run_function(step.function, st.arena.ctypes.data,
                                             offsets.ctypes.data, 1, clock.ctypes.data)
        assert failed == -1, (status, native_calls[failed])
        assert clock[0] > 0 and np.all(np.diff(clock) >= 0), clock
        if check:
            worst = max(worst, _compare(ex, st, before, native_calls))
    return worst


def _compare(ex, st, before, calls) -> float:
    native = st.arena.copy()
    st.arena[:] = before
    for call in calls:
        run_call(ex, st, call)
    worst = 0.0
    for call in calls:
        for slot in call.outputs:
            want = st.view(slot).astype(np.float64)
            lo, hi = st.byte_range(slot)
            got = np.frombuffer(native[lo:hi].tobytes(), slot.dtype).reshape(slot.shape)
            scale = max(np.abs(want).max(initial=0.0), 1e-3)
            worst = max(worst, float(np.abs(got.astype(np.float64) - want).max(initial=0.0)
                                     / scale))
    st.arena[:] = native  # go on from the native result
    return worst


MODELS = {
    "llama-gqa": config(),
    "qwen2-bias": config("qwen2", rope_theta=1e6),
    "baichuan-alibi": config("baichuan", kv_heads=4),
    # RoPE scaling: the kernels get ratrain.models.rope's frequencies (and yarn's factor)
    "llama3-rope": config(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    "yarn-rope": config(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 8}),
}
# fp32: kernels and numpy sum in other orders (measured 8e-7 of the output's scale); fp16:
# the numpy reference rounds to half between sub-steps that the kernels keep in fp32
# (measured 2.5e-3, a few half-precision ulps).
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2}


QUICK = {("llama-gqa", "fp32"), ("qwen2-bias", "fp16")}   # the rest: -m slow


@pytest.mark.parametrize("name,precision", [
    pytest.param(name, precision, id=f"{name}-{precision}",
                 marks=() if (name, precision) in QUICK else pytest.mark.slow)
    for precision in ("fp32", "fp16") for name in sorted(MODELS)])
def test_native_steps_match_references(tmp_path, name, precision):
    prog = program(MODELS[name], pp=2, precision=precision, recompute="selective")
    code = generate(prog, "test")
    modules = {s: load_module(build_module(source)) for s, (_, source) in code.items()}
    worst = _run_tables(prog, modules.__getitem__, check_against_reference=True)
    assert worst < TOLERANCE[precision], worst
