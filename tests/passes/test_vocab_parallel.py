"""The vocabulary-parallel head (NOTE [vocabulary-parallel head], ir/vocab.py; NOTE
[vocabulary-parallel schedule], passes/schedule_vocab.py): the split graph, where S and T
go in 1F1B and zb1, what the verifier refuses, the memory plan's extra micro-batch, and
the compiled program's losses against the unsplit program's through the reference
executor (the MPI runs: tests/rt/test_vocab_parallel_mpi.py)."""
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from ratrain import models
from ratrain.ir.tasks import Kind, Task, format_tasks
from ratrain.ir.vocab import merge_shards, state_layers, vocab_layers
from ratrain.models.trace import trace_model
from ratrain.optim import AdamW
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.passes.verify_schedule import ScheduleInvariantError, verify_schedule
from ratrain.rt.reference import Executor

CONFIG = models.fill_defaults({
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 64, "max_position_embeddings": 16, "initializer_range": 0.1})
TIED = models.fill_defaults(dict(CONFIG, tie_word_embeddings=True))
B, T, STEPS = 2, 8, 4
OPTIMIZER = AdamW(lr=1e-2, weight_decay=0.1, eps=1e-3)  # NOTE [Adam and rounding]


@lru_cache(maxsize=None)
def graph(shards: int, tied: bool = False):
    return trace_model(TIED if tied else CONFIG, micro_batch_size=B, seq_len=T,
                       vocab_shards=shards)


@lru_cache(maxsize=None)
def compiled(pp: int, m: int, vocab: bool, schedule: str = "1f1b", tied: bool = False,
             dp: int = 1, zero: int = 0):
    options = CompileOptions(pp=pp, dp=dp, zero=zero, micro_batches=m, micro_batch_size=B,
                             seq_len=T, recompute="none", pipeline_schedule=schedule,
                             vocab_parallel=vocab)
    return run_pipeline(Program(graph(pp if vocab else 0, tied), options))[0]


def test_the_split_graph_has_a_final_norm_and_one_shard_per_stage():
    g = graph(4)
    assert [layer.kind for layer in g.layers[-5:]] == ["final_norm"] + ["vocab"] * 4
    assert vocab_layers(g) == (5, 6, 7, 8)
    assert [layer.param_names for layer in g.layers[5:]] == [
        (f"lm_head.weight[{lo}:{lo + 16}]",) for lo in range(0, 64, 16)]
    assert g.kinds["vocab"].fwd.params[0].shape == (16, 32)
    # the shards' cross-entropies and the final norm are the unsplit head's work
    costs, whole = g.kind_costs, graph(0).kind_costs["head"]
    assert 4 * costs["vocab"].fwd_flops + costs["final_norm"].fwd_flops == whole.fwd_flops


def _compute(program, stage: int) -> str:
    return format_tasks(t for t in program.tasks[stage]
                        if t.kind in (Kind.F, Kind.B, Kind.BL, Kind.S, Kind.T))


def test_1f1b_places_s_and_t_as_one_more_stage():
    """pp 2, M 4 (worked by hand in unit time on the 3-stage 1F1B): stage 0 runs three
    warm-up forwards, not two; S(m) and T(m) go where the shards' virtual stage starts
    its F(m) and B(m); the last stage runs F(m), S(m), T(m), B(m) in that order."""
    p = compiled(2, 4, True)
    assert _compute(p, 0) == ("0F0 0F1 0S0 0F2 0T0 0S1 0T1 0B0 0S2 0F3 0T2 0B1 0S3 0T3 0B2 "
                              "0B[L2]3 0B[L1]3 0B[L0]3")
    assert _compute(p, 1) == ("1F0 1S0 1F1 1T0 1S1 1B0 1T1 1F2 1S2 1B1 1T2 1F3 1S3 1B2 1T3 "
                              "1B[L4]3 1B[L3]3")
    for stage in (0, 1):  # the shard's SYNC right after the stage's last T (and its FREEs)
        tasks = [t for t in p.tasks[stage] if t.kind != Kind.FREE]
        last_t = max(i for i, t in enumerate(tasks) if t.kind == Kind.T)
        assert tasks[last_t + 1] == Task(stage, Kind.SYNC, layer=5 + stage)


@pytest.mark.parametrize("schedule", ["1f1b", "zb1"])
@pytest.mark.parametrize("pp", [2, 4])
def test_every_stage_runs_s0_t0_s1_t1_and_verifies(pp, schedule):
    p = compiled(pp, 8, True, schedule)
    for stage in range(pp):
        order = [str(t)[len(str(stage)):] for t in p.tasks[stage] if t.kind in (Kind.S, Kind.T)]
        assert order == [f"{k}{m}" for m in range(8) for k in "ST"]
        assert state_layers(p, stage)[-1] == vocab_layers(p.graph)[stage]
    verify_schedule(p)


def test_verifier_refuses_t_before_s_and_a_last_b_before_its_t():
    p = compiled(2, 4, True)
    tasks = list(p.tasks[0])
    s0, t0 = tasks.index(Task(0, Kind.S, micro_batch=0)), tasks.index(Task(0, Kind.T, micro_batch=0))
    tasks[s0], tasks[t0] = tasks[t0], tasks[s0]
    with pytest.raises(ScheduleInvariantError, match="S0 T0 S1 T1"):
        verify_schedule(replace(p, tasks={**p.tasks, 0: tuple(tasks)}))
    last = list(p.tasks[1])   # ... 1F1 1T0 1S1 1B0 ...: B0 moved before its T0
    last.insert(last.index(Task(1, Kind.T, micro_batch=0)),
                last.pop(last.index(Task(1, Kind.B, micro_batch=0))))
    with pytest.raises(ScheduleInvariantError, match="F, S, T, then its backward"):
        verify_schedule(replace(p, tasks={**p.tasks, 1: tuple(last)}))


def test_the_memory_plan_holds_one_micro_batch_more_and_the_shards_state():
    plain, vocab = compiled(2, 4, False), compiled(2, 4, True)
    acts = lambda p, s: max(r.get("activations", 0) for r in p.memory.stages[s].timeline)
    assert acts(vocab, 0) > acts(plain, 0)          # three micro-batches in flight, not two
    offsets = vocab.memory.stages[0].offsets
    assert {"master.L5", "opt.L5", "view.L5", "grad.L5", "vocab.mb0"} <= set(offsets)
    assert "master.L6" not in offsets and "master.L6" in vocab.memory.stages[1].offsets


def _losses(program, tied: bool = False) -> tuple[list[float], dict]:
    params = {k: np.array(v) for k, v in models.init_params(TIED if tied else CONFIG,
                                                            3).items()}
    run = Executor(program, params, OPTIMIZER)
    rng = np.random.default_rng(7)
    o = program.options
    out = [run.run_step(rng.integers(0, 64, (o.dp * o.micro_batches * B, T + 1),
                                     dtype=np.int32)) for _ in range(STEPS)]
    return out, merge_shards(run.params())


@pytest.mark.parametrize("pp,schedule,dp,tied", [
    (2, "1f1b", 1, False), (2, "zb1", 1, False), (4, "1f1b", 1, False), (4, "zb1", 1, False),
    (2, "1f1b", 2, False), (2, "1f1b", 1, True), (4, "zb1", 1, True)])
def test_vocab_parallel_trains_as_the_unsplit_program(pp, schedule, dp, tied):
    zero = 1 if dp > 1 else 0
    split, split_params = _losses(compiled(pp, 4, True, schedule, tied, dp, zero), tied)
    whole, whole_params = _losses(compiled(pp, 4, False, schedule, tied, dp, zero), tied)
    np.testing.assert_allclose(split, whole, rtol=1e-6)
    assert split_params.keys() == whole_params.keys()
    for name in whole_params:
        np.testing.assert_allclose(split_params[name], whole_params[name], rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_verifier_refuses_a_tie_before_the_last_gradient_of_a_tied_layer():
    """The TIE of a stage sums its tied copies: it must follow their last producer (the
    embedding's last backward piece, a shard's last T)."""
    p = compiled(2, 4, True, tied=True)
    tasks = list(p.tasks[0])
    tie = tasks.pop(next(i for i, t in enumerate(tasks) if t.kind == Kind.TIE))
    tasks.insert(tasks.index(Task(0, Kind.T, micro_batch=3)), tie)
    with pytest.raises(ScheduleInvariantError, match="sums the tied gradient before"):
        verify_schedule(replace(p, tasks={**p.tasks, 0: tuple(tasks)}))
