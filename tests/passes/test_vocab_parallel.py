"""The vocabulary-parallel head and embedding (NOTE [vocabulary-parallel head], NOTE
[vocabulary-parallel embedding], ir/vocab.py; NOTE [vocabulary-parallel schedule],
passes/schedule_vocab.py): the split graphs, where S and T (E and G) go in 1F1B and zb1,
what the verifier refuses, the memory plan's extra micro-batch, and the compiled
program's losses against the unsplit program's through the reference executor (the MPI
runs: tests/rt/test_vocab_parallel_mpi.py)."""
import json
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from ratrain import models
from ratrain.ir.tasks import Kind, Task, format_tasks
from ratrain.ir.tasks import PIPE_COLLECTIVES
from ratrain.ir.vocab import embed_layers, merge_shards, state_layers, vocab_layers
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
def graph(shards: int, tied: bool = False, embed: bool = False):
    return trace_model(TIED if tied else CONFIG, micro_batch_size=B, seq_len=T,
                       vocab_shards=shards, split_embed=embed)


@lru_cache(maxsize=None)
def compiled(pp: int, m: int, vocab: str, schedule: str = "1f1b", tied: bool = False,
             dp: int = 1, zero: int = 0):
    """`vocab`: --vocab-parallel none, head or both."""
    options = CompileOptions(pp=pp, dp=dp, zero=zero, micro_batches=m, micro_batch_size=B,
                             seq_len=T, recompute="none", pipeline_schedule=schedule,
                             vocab_parallel=vocab)
    return run_pipeline(Program(graph(pp if vocab != "none" else 0, tied, vocab == "both"),
                                options))[0]


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
    p = compiled(2, 4, "head")
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
    p = compiled(pp, 8, "head", schedule)
    for stage in range(pp):
        order = [str(t)[len(str(stage)):] for t in p.tasks[stage] if t.kind in (Kind.S, Kind.T)]
        assert order == [f"{k}{m}" for m in range(8) for k in "ST"]
        assert state_layers(p, stage)[-1] == vocab_layers(p.graph)[stage]
    verify_schedule(p)


def test_verifier_refuses_t_before_s_and_a_last_b_before_its_t():
    p = compiled(2, 4, "head")
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
    plain, vocab = compiled(2, 4, "none"), compiled(2, 4, "head")
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


@pytest.mark.parametrize("vocab", ["head", "both"])
@pytest.mark.parametrize("pp,schedule,dp,tied", [
    (2, "1f1b", 1, False), (2, "zb1", 1, False), (4, "1f1b", 1, False), (4, "zb1", 1, False),
    (2, "1f1b", 2, False), (2, "1f1b", 1, True), (4, "zb1", 1, True)])
def test_vocab_parallel_trains_as_the_unsplit_program(pp, schedule, dp, tied, vocab):
    zero = 1 if dp > 1 else 0
    split, split_params = _losses(compiled(pp, 4, vocab, schedule, tied, dp, zero), tied)
    whole, whole_params = _losses(compiled(pp, 4, "none", schedule, tied, dp, zero), tied)
    np.testing.assert_allclose(split, whole, rtol=1e-6)
    assert split_params.keys() == whole_params.keys()
    for name in whole_params:
        np.testing.assert_allclose(split_params[name], whole_params[name], rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_verifier_refuses_a_tie_before_the_last_gradient_of_a_tied_layer():
    """The TIE of a stage sums its tied copies: it must follow their last producer (the
    embedding's last backward piece, a shard's last T)."""
    p = compiled(2, 4, "head", tied=True)
    tasks = list(p.tasks[0])
    tie = tasks.pop(next(i for i, t in enumerate(tasks) if t.kind == Kind.TIE))
    tasks.insert(tasks.index(Task(0, Kind.T, micro_batch=3)), tie)
    with pytest.raises(ScheduleInvariantError, match="sums the tied gradient before"):
        verify_schedule(replace(p, tasks={**p.tasks, 0: tuple(tasks)}))


# ---- the embedding's rows too (--vocab-parallel both) -------------------------------------

def test_the_split_embedding_leaves_the_pipeline_one_shard_per_stage():
    """The decoders and the final norm are the pipeline's layers 0..3, the head's shards
    4..7, the embedding's 8..11, each V/P rows of model.embed_tokens.weight."""
    g, whole = graph(4, embed=True), graph(0)
    assert [layer.kind for layer in g.layers] == \
        ["decoder"] * 3 + ["final_norm"] + ["vocab"] * 4 + ["embed_rows"] * 4
    assert vocab_layers(g) == (4, 5, 6, 7) and embed_layers(g) == (8, 9, 10, 11)
    assert [layer.param_names for layer in g.layers[8:]] == [
        (f"model.embed_tokens.weight[{lo}:{lo + 16}]",) for lo in range(0, 64, 16)]
    assert [layer.param_names for layer in g.layers[:3]] == \
        [layer.param_names for layer in whole.layers[1:4]]
    assert g.kinds["embed_rows"].fwd.params[0].shape == (16, 32)
    assert g.tied == {}
    tied = graph(4, tied=True, embed=True)   # head shard s and embedding shard s: one name
    assert tied.tied == {f"model.embed_tokens.weight[{16 * s}:{16 * s + 16}]": (4 + s, 8 + s)
                         for s in range(4)}


def _order(program, stage: int, kinds) -> list[str]:
    return [str(t)[len(str(stage)):] for t in program.tasks[stage] if t.kind in kinds]


@pytest.mark.parametrize("schedule", ["1f1b", "zb1"])
@pytest.mark.parametrize("pp", [2, 4])
def test_e_and_g_go_where_a_stage_in_front_of_stage_0_runs_its_f_and_b(pp, schedule):
    """Every stage issues E, S, T and G in one order; stage 0 runs E(m) before its F(m)
    and G(m) after its backward of m; the head's S and T stay as they were."""
    p = compiled(pp, 8, "both", schedule)
    orders = [_order(p, s, PIPE_COLLECTIVES) for s in range(pp)]
    assert all(order == orders[0] for order in orders)
    assert [o for o in orders[0] if o[0] in "ST"] == [f"{k}{m}" for m in range(8) for k in "ST"]
    assert [o for o in orders[0] if o[0] in "EG"] != []
    for m in range(8):
        at = {str(t): i for i, t in enumerate(p.tasks[0])}
        last_backward = max(i for i, t in enumerate(p.tasks[0])
                            if t.kind in (Kind.B, Kind.BL) and t.micro_batch == m)
        assert at[f"0E{m}"] < at[f"0F{m}"] < last_backward < at[f"0G{m}"]
    for stage in range(pp):  # the shards' state, each SYNC after its last T or G
        assert state_layers(p, stage)[-2:] == (vocab_layers(p.graph)[stage],
                                               embed_layers(p.graph)[stage])
        tasks = [t for t in p.tasks[stage] if t.kind != Kind.FREE]
        last_g = max(i for i, t in enumerate(tasks) if t.kind == Kind.G)
        sync = tasks.index(Task(stage, Kind.SYNC, layer=embed_layers(p.graph)[stage]))
        assert sync > last_g and {t.kind for t in tasks[last_g + 1:sync]} <= {Kind.SYNC}
    assert not any(t.kind in (Kind.RECV_F, Kind.SEND_B) for t in p.tasks[0])
    verify_schedule(p)


def test_1f1b_places_e_and_g_as_a_stage_in_front():
    """pp 2, M 4 in unit time (the 4-stage 1F1B of the embedding's turn, stages 0 and 1,
    and the head's turn): the embedding's turn runs three warm-up forwards, so E0 E1 E2
    precede stage 0's first F; G(m) follows stage 0's B(m)."""
    p = compiled(2, 4, "both")
    assert " ".join(_order(p, 0, (Kind.E, Kind.F, Kind.B, Kind.BL, Kind.G))) == (
        "E0 E1 F0 E2 F1 E3 F2 B0 G0 F3 B1 G1 B2 G2 B[L1]3 B[L0]3 G3")


def test_verifier_refuses_g_before_stage_0s_backward_and_collectives_out_of_order():
    p = compiled(2, 4, "both")
    tasks = list(p.tasks[0])    # G0 moved before stage 0's B0, whose gout.mb it sends
    tasks.insert(tasks.index(Task(0, Kind.B, micro_batch=0)),
                 tasks.pop(tasks.index(Task(0, Kind.G, micro_batch=0))))
    with pytest.raises(ScheduleInvariantError, match="E, F, its backward, then G"):
        verify_schedule(replace(p, tasks={**p.tasks, 0: tuple(tasks)}))
    p = compiled(4, 8, "both")
    tasks = list(p.tasks[1])    # two collectives of other kinds swapped on stage 1 only
    pipe = [i for i, t in enumerate(tasks) if t.kind in PIPE_COLLECTIVES]
    i, j = next((a, b) for a, b in zip(pipe, pipe[1:]) if tasks[a].kind != tasks[b].kind
                and {tasks[a].kind, tasks[b].kind} != {Kind.S, Kind.T}
                and {tasks[a].kind, tasks[b].kind} != {Kind.E, Kind.G})
    tasks[i], tasks[j] = tasks[j], tasks[i]
    with pytest.raises(ScheduleInvariantError, match="collectives run in another order"):
        verify_schedule(replace(p, tasks={**p.tasks, 1: tuple(tasks)}))


def test_the_memory_plan_holds_a_pth_of_the_embedding_on_every_stage():
    head, both = compiled(2, 4, "head"), compiled(2, 4, "both")
    whole = lambda p, s, b: p.memory.stages[s].offsets[b][1]
    assert embed_layers(both.graph) == (6, 7)
    assert 2 * whole(both, 0, "master.L6") == whole(head, 0, "master.L0")
    assert {"master.L6", "opt.L6", "view.L6", "grad.L6", "in.mb0", "gout.mb0"} <= \
        set(both.memory.stages[0].offsets)
    assert "master.L7" in both.memory.stages[1].offsets
    assert "master.L6" not in both.memory.stages[1].offsets


@pytest.mark.parametrize("pp,schedule,dp,tied", [
    (2, "1f1b", 1, False), (4, "zb1", 1, False), (2, "1f1b", 2, False), (4, "zb1", 1, True)])
def test_the_embedding_split_computes_the_head_splits_forward_bit_for_bit(pp, schedule, dp,
                                                                          tied):
    """See NOTE [vocabulary-parallel embedding]: the lookups' sum adds zeros to each row, so
    the first step's losses are the head split's, bit for bit. (Later steps differ here
    in the last bits: this executor runs the whole embedding's backward as numpy's rule,
    each micro-batch's rows summed before they join the gradient, where the runtime's
    kernel, and embed_grad, add each token's row into it; tests/rt/test_vocab_parallel_mpi.py
    compares the two splits' 30 steps under MPI bit for bit.)"""
    zero = 1 if dp > 1 else 0
    both, _ = _losses(compiled(pp, 4, "both", schedule, tied, dp, zero), tied)
    head, _ = _losses(compiled(pp, 4, "head", schedule, tied, dp, zero), tied)
    assert both[0] == head[0]
    np.testing.assert_allclose(both, head, rtol=1e-7)


def test_a_program_of_the_head_split_alone_reads_back_as_head():
    """runtime.json of a program written while --vocab-parallel was a switch holds
    `"vocab_parallel": true`: it reads as head (the codec converts), false as none; a
    program splitting both reads back with each stage's two shards last."""
    from ratrain.codegen.program_dir import runtime_program
    from ratrain.program_format.codec import read_runtime, write_runtime
    for vocab, legacy in (("head", True), ("none", False)):
        d = json.loads(write_runtime(runtime_program(compiled(2, 4, vocab))))
        d["options"]["vocab_parallel"] = legacy
        assert read_runtime(json.dumps(d), "runtime.json").options.vocab_parallel == vocab
        assert CompileOptions.from_dict(d["options"]).vocab_parallel == vocab
    both = runtime_program(compiled(2, 4, "both"))
    assert read_runtime(write_runtime(both), "runtime.json").stages == both.stages == (
        (0, 1, 4, 6), (2, 3, 5, 7))
