"""Semantics of the whole pass pipeline: executing the compiled per-rank programs for 2
steps gives the losses and updated parameters of the single-process reference on the
whole model (fp32, 1e-6 relative), for every pipeline/DP/ZeRO/schedule/recompute mix."""
import itertools
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from ratrain import models
from ratrain.ir.interp import run_train_graph
from ratrain.models.trace import trace_model
from ratrain.optim import AdamW, adamw_step
from ratrain.rt.reference import Executor
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from tiny_model import tiny_config

CONFIG = tiny_config(num_hidden_layers=3)
# the same model with llama3 RoPE scaling (original context 4 of T = 8: every band used),
# and with plain RoPE of its theta
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 4}
CONFIGS = {"llama": CONFIG,
           "llama3-rope": models.fill_defaults(dict(CONFIG, rope_parameters=LLAMA3,
                                                    rope_theta=500000.0)),
           "theta5e5": models.fill_defaults(dict(CONFIG, rope_theta=500000.0)),
           "tied": models.fill_defaults(dict(CONFIG, tie_word_embeddings=True))}
B, T, STEPS = 2, 8, 2
# NOTE [Adam and rounding]: the compiled program and the reference sum gradients in other
# orders and feed BLAS differently laid-out operands, so gradients agree to fp32 rounding
# (~1e-7 of their scale), not bit for bit. Adam divides by sqrt(v) + eps, which turns a
# rounding difference dg of a gradient near eps into a parameter change of ~lr * dg / eps.
# eps = 1e-3 keeps that under 1e-6 of the parameters; any semantic error is far larger.
OPTIMIZER = AdamW(lr=1e-2, weight_decay=0.1, eps=1e-3)


@lru_cache(maxsize=None)
def graph(model: str = "llama"):
    return trace_model(CONFIGS[model], micro_batch_size=B, seq_len=T)


@lru_cache(maxsize=None)
def batches(dp: int, m: int):
    rng = np.random.default_rng(dp * 100 + m)
    return tuple(rng.integers(0, CONFIG["vocab_size"], (dp * m * B, T + 1), dtype=np.int32)
                 for _ in range(STEPS))


def _decay(a):
    return np.full(a.size, float(a.ndim >= 2), np.float32)


@lru_cache(maxsize=None)
def reference(dp: int, m: int, clip, model: str = "llama"):
    """Whole model in one process. Gradients are summed in the order the ranks sum them
    (micro-batches within a replica, then replicas), so that Adam, which amplifies the
    last bits of near-zero gradients, sees the same numbers."""
    params = {k: v.copy() for k, v in models.init_params(CONFIGS[model], seed=0).items()}
    moments = {k: (np.zeros(v.size, np.float32), np.zeros(v.size, np.float32))
               for k, v in params.items()}
    losses = []
    for step, tokens in enumerate(batches(dp, m), 1):
        step_losses, replica_grads = [], []
        for d in range(dp):
            acc = None
            for i in range(m):
                rows = tokens[(d * m + i) * B:(d * m + i + 1) * B]
                loss, grads = run_train_graph(graph(model), params, rows,
                                              loss_cotangent=1.0 / m)
                step_losses.append(loss)
                acc = grads if acc is None else {k: acc[k] + grads[k] for k in grads}
            replica_grads.append(acc)
        grads = {k: np.sum([g[k] for g in replica_grads], axis=0) / dp for k in params}
        coef = 1.0
        if clip is not None:
            norm = np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))
            coef = min(1.0, clip / (norm + 1e-6))
        for k, p in params.items():
            flat = p.reshape(-1)
            adamw_step(OPTIMIZER, step, flat, (grads[k] * np.float32(coef)).reshape(-1),
                       *moments[k], _decay(p))
        losses.append(float(np.mean(step_losses)))
    return losses, params


def compile_program(pp, dp, m, schedule, zero, recompute, clip=None, grad_accum="local",
                    model="llama", update_rule="commit"):
    options = CompileOptions(pp=pp, dp=dp, micro_batches=m, micro_batch_size=B, seq_len=T,
                             schedule=schedule, zero=zero, recompute=recompute, clip=clip,
                             grad_accum=grad_accum, update_rule=update_rule)
    program = Program(graph(model), options)
    if recompute == "auto":
        program = replace(program, options=replace(options, budget=auto_budget(program)))
    return run_pipeline(program)[0]


def auto_budget(program) -> int:
    """Halfway between the arenas of keeping everything and recomputing everything, so
    auto must drop something (or, where recompute saves nothing, just what fits)."""
    arenas = [run_pipeline(replace(program, options=replace(program.options, recompute=policy))
                           )[0].memory.arena_bytes for policy in ("none", "full")]
    return (arenas[0] + arenas[1]) // 2 if arenas[1] < arenas[0] else arenas[0]


def _relative(a, b) -> float:
    """Norm-wise relative difference of one parameter tensor (NOTE [Adam and rounding])."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_matches_reference(program, dp: int, m: int, clip=None,
                             model: str = "llama") -> Executor:
    """Run `program` for STEPS steps: losses and parameters equal the single-process
    reference's (fp32 on both sides with identical kernels and summation order: 1e-6 is
    rounding). Returns the executor, for further checks."""
    executor = Executor(program, models.init_params(CONFIGS[model], seed=0), OPTIMIZER)
    losses = [executor.run_step(tokens) for tokens in batches(dp, m)]
    ref_losses, ref_params = reference(dp, m, clip, model)
    assert losses == pytest.approx(ref_losses, rel=1e-6)
    got = executor.params()
    assert max(_relative(got[k], ref_params[k]) for k in ref_params) < 1e-6
    return executor


def slow_except(cases, quick):
    """`cases` as parameters, all but those in `quick` marked slow: `-m 'not slow'` runs a
    representative few, the default run every one."""
    return [case if case in quick else pytest.param(*case, marks=pytest.mark.slow)
            for case in cases]


GRID = list(itertools.product((1, 2, 3, 4), (1, 2), (1, 3, 8), ("ratrain", "baseline"),
                              (0, 1, 2), ("none", "full", "selective", "auto")))
# every value of every axis at least once
QUICK_GRID = {(1, 1, 1, "ratrain", 0, "none"), (2, 2, 3, "baseline", 1, "full"),
              (3, 2, 8, "ratrain", 2, "selective"), (4, 1, 3, "baseline", 0, "auto"),
              (2, 2, 8, "ratrain", 2, "auto")}
SCATTER_GRID = list(itertools.product((1, 2, 3, 4), (1, 3, 8), ("ratrain", "baseline"),
                                      ("none", "full")))
QUICK_SCATTER = {(2, 3, "ratrain", "none"), (3, 8, "baseline", "full")}


@pytest.mark.parametrize("pp,dp,m,schedule,zero,recompute", slow_except(GRID, QUICK_GRID))
def test_compiled_program_matches_whole_model(pp, dp, m, schedule, zero, recompute):
    program = compile_program(pp, dp, m, schedule, zero, recompute)
    if recompute == "auto":
        keep_all = compile_program(pp, dp, m, schedule, zero, "none").memory.arena_bytes
        assert program.memory.arena_bytes <= program.options.budget
        assert bool(program.recompute) == (program.options.budget < keep_all)
    assert_matches_reference(program, dp, m)


@pytest.mark.parametrize("pp,m,schedule,recompute", slow_except(SCATTER_GRID, QUICK_SCATTER))
def test_per_micro_batch_reduce_scatter_matches_whole_model(pp, m, schedule, recompute):
    program = compile_program(pp, 2, m, schedule, 2, recompute, grad_accum="scatter")
    assert program.scatter_grads == frozenset(range(len(graph().layers)))
    assert_matches_reference(program, 2, m)


@pytest.mark.parametrize("pp,dp,zero", [(2, 2, 0), (3, 2, 2), (1, 1, 0)])
def test_global_norm_clipping_is_exact(pp, dp, zero):
    program = compile_program(pp, dp, 3, "ratrain", zero, "none", clip=0.05)
    executor = assert_matches_reference(program, dp, 3, clip=0.05)
    assert all(st.clip_coef < 0.1 for st in executor.ranks), "clipping inactive"


@pytest.mark.parametrize("pp,recompute", [(1, "none"), (2, "full")])
def test_llama3_rope_scaling_survives_compilation(pp, recompute):
    """The scaled RoPE's params travel through every pass (recomputed forwards included)."""
    program = compile_program(pp, 1, 2, "ratrain", 0, recompute, model="llama3-rope")
    ropes = [n for n in graph("llama3-rope").kinds["decoder"].fwd.nodes if n.op == "rope"]
    assert [n.param_dict["type"] for n in ropes] == ["llama3", "llama3"]
    assert_matches_reference(program, 1, 2, model="llama3-rope")
    # plain RoPE of the same theta gives other losses, so a pass that dropped the scaling
    # would fail the check above
    plain = reference(1, 2, None, "theta5e5")[0]
    assert abs(reference(1, 2, None, "llama3-rope")[0][0] - plain[0]) > 1e-3
