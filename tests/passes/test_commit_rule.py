"""The commit rule (NOTE [commit rule], passes/insert_update.py) in the reference
executor: speculative UPDs before the NORM, rolled back and redone on clipped or
overflowing steps, give losses, weights and Adam moments bit-identical to after-norm's
NORM-then-UPD, for fp32 with clipping and fp16 with overflowing first steps, at pp 1 and 2,
with DP and ZeRO 1/2 and tied embeddings; the schedule, memory plan and lowering show it."""
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from ratrain import models
from ratrain.ir.tasks import Kind, parse_tasks
from ratrain.models.trace import trace_model
from ratrain.optim import AdamW, LossScaler
from ratrain.rt.reference import Executor
from ratrain.passes.lower import format_lowered
from ratrain.passes.lower_state import state_slots
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import CompileOptions, Program
from ratrain.passes.verify_schedule import ScheduleInvariantError, verify_schedule
from tiny_model import tiny_config

CONFIG = tiny_config()
TIED = {**CONFIG, "tie_word_embeddings": True}
B, T, STEPS = 2, 8, 5
OPTIMIZER = AdamW(lr=1e-2, weight_decay=0.1, eps=1e-3)
HUGE = 2.0 ** 20  # the first steps overflow: the logits cotangent ~ scale / (M*B*T) > 65504
TINY_CLIP = 1e-3                    # every step clips
# the norm the steps of the cases below reach lies between these: some steps clip, some not
SOME_CLIP = 2.0


@lru_cache(maxsize=None)
def compile_program(rule, precision="fp32", clip=None, pp=2, dp=1, zero=0, tied=False):
    config = TIED if tied else CONFIG
    graph = trace_model(config, micro_batch_size=B, seq_len=T,
                        dtype="float16" if precision == "fp16" else "float32")
    options = CompileOptions(pp=pp, dp=dp, micro_batches=2, micro_batch_size=B, seq_len=T,
                             precision=precision, zero=zero, clip=clip, recompute="none",
                             update_rule=rule)
    return run_pipeline(Program(graph, options))[0]


def train(program, tied=False, scale=HUGE):
    """(losses, per-step (overflow, clip coefficient), final master/m/v of every rank)."""
    config = TIED if tied else CONFIG
    scaler = LossScaler(scale, growth_interval=2) if program.options.precision == "fp16" else None
    ex = Executor(program, models.init_params(config, seed=0), OPTIMIZER, scaler)
    o, rng = program.options, np.random.default_rng(0)
    losses, steps = [], []
    for _ in range(STEPS):
        tokens = rng.integers(0, config["vocab_size"], (o.dp * o.micro_batches * B, T + 1))
        with np.errstate(over="ignore", invalid="ignore"):
            losses.append(ex.run_step(tokens))
        steps.append((ex.ranks[0].overflow, ex.ranks[0].clip_coef))
    state = [st.view(slot).copy() for st in ex.ranks for layer in program.stages[st.stage]
             for slot in state_slots(program, layer)[:3]]
    return losses, steps, state


CASES = [  # (precision, clip, pp, dp, zero, tied)
    ("fp32", TINY_CLIP, 2, 1, 0, False),
    ("fp32", SOME_CLIP, 1, 1, 0, False),
    ("fp16", None, 2, 1, 0, False),
    ("fp16", None, 1, 1, 0, False),
    ("fp16", TINY_CLIP, 2, 2, 1, False),
    ("fp16", None, 1, 2, 2, False),
    ("fp32", TINY_CLIP, 2, 2, 2, False),
    ("fp16", SOME_CLIP, 2, 1, 0, True),
    ("fp32", TINY_CLIP, 1, 2, 1, True),
    ("fp16", None, 2, 2, 3, False),     # ZeRO-3: views gathered from the rolled-back shards
    ("fp32", TINY_CLIP, 1, 2, 3, False),
]


@pytest.mark.parametrize("precision,clip,pp,dp,zero,tied", CASES)
def test_commit_rule_is_bit_identical_to_after_norm(precision, clip, pp, dp, zero, tied):
    runs = {rule: train(compile_program(rule, precision, clip, pp, dp, zero, tied), tied)
            for rule in ("commit", "after-norm")}
    (losses, steps, state), (ref_losses, ref_steps, ref_state) = runs["commit"], runs["after-norm"]
    assert losses == ref_losses and steps == ref_steps
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(state, ref_state))
    rolled = [overflow or coef != 1.0 for overflow, coef in steps]
    assert any(rolled), steps     # the rollback path ran
    if precision == "fp16":
        assert steps[0][0] and not all(o for o, _ in steps)  # overflowed, then stepped
    if clip == TINY_CLIP:
        assert all(coef < 1e-2 for o, coef in steps if not o)


def test_commit_lowering_updates_speculatively_and_redoes_in_the_norm():
    program = compile_program("commit", "fp16", None, 2, 2, 1)
    text = format_lowered(program, 1)
    upd = next(line for line in text.splitlines() if "adamw[" in line)
    assert "= adamw[loss_scale=True speculative=True zero=1] grad.L3+0:f32[2080]" in upd
    assert [w.split("+")[0] for w in upd.split(" = ")[0].split()] == \
        ["master.L3", "opt.L3", "opt.L3", "undo.L3", "undo.L3", "undo.L3"]
    norm = text[text.index("1NORM:"):].splitlines()[1:7]
    assert norm[0].strip() == "global_norm[clip=None layers=(2,3) loss_scale=True]    # step"
    assert [line.split("= ")[1].split(" ")[0] for line in norm[1:5]] == \
        ["redo_update[zero=1]"] * 2 + ["prefetch_view[gather=True", "prefetch_view[gather=True"]
    after = format_lowered(compile_program("after-norm", "fp16", None, 2, 2, 1), 1)
    assert "speculative" not in after and "redo" not in after and "undo." not in after


def test_undo_copies_are_planned_buffers_live_from_the_update_to_the_norm():
    program = compile_program("commit", "fp32", TINY_CLIP, 2, 2, 1)
    memory, tasks = program.memory.stages[0], [str(t) for t in program.tasks[0]]
    shard = state_slots(program, 1)[4]
    offset, nbytes = memory.offsets["undo.L1"]
    assert nbytes == 3 * (-(-4 * shard // 64) * 64) and memory.categories["undo.L1"] == "optimizer"
    first, last = memory.lifetimes["undo.L1"]
    assert tasks[first] == "0UPD[L1]" and tasks[last] == "0NORM"
    assert tasks[last + 1:] and all(t.startswith("0FREE[") for t in tasks[last + 1:])
    assert "undo.L1" not in compile_program("after-norm", "fp32", TINY_CLIP, 2, 2, 1) \
        .memory.stages[0].offsets


def test_no_norm_no_commit_rule():
    program = compile_program("commit", "fp32", None, 2, 1, 0)
    assert not any(t.kind == Kind.NORM for ts in program.tasks.values() for t in ts)
    assert "speculative" not in format_lowered(program, 0)


def _words(program, stage=0):
    return " ".join(str(t) for t in program.tasks[stage] if t.kind != Kind.FREE)


def test_verify_schedule_takes_either_order_only_under_its_rule():
    commit, after = (compile_program(r, "fp32", TINY_CLIP) for r in ("commit", "after-norm"))
    text = _words(commit)
    assert text.endswith("0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0] 0UPD[L1] 0PREF[L1] 0UPD[L0] "
                         "0PREF[L0] 0NORM")
    assert _words(after).endswith("0B[L1]1 0SYNC[L1] 0B[L0]1 0SYNC[L0] 0NORM 0UPD[L0] "
                                  "0PREF[L0] 0UPD[L1] 0PREF[L1]")
    broken = {  # program -> (task text, message)
        "upd before its sync": (commit, "0UPD[L0] " + text.replace(" 0UPD[L0]", ""),
                                "0UPD[L0] is not preceded by its SYNC"),
        "commit upd after norm": (commit, text.replace("0UPD[L0] 0PREF[L0] 0NORM",
                                                       "0NORM 0UPD[L0] 0PREF[L0]"),
                                  "0UPD[L0] runs after 0NORM"),
        "after-norm upd before norm": (after, text, "0UPD[L1] runs before 0NORM"),
    }
    for name, (program, words, message) in broken.items():
        with pytest.raises(ScheduleInvariantError, match=message.replace("[", r"\[").replace("]", r"\]")):
            verify_schedule(replace(program, tasks={**program.tasks, 0: parse_tasks(words)}))
    verify_schedule(commit)
    verify_schedule(after)


def test_a_budget_only_after_norm_fits_names_the_rule():
    from ratrain.passes.plan_memory import MemoryBudgetError
    after = compile_program("after-norm", "fp32", TINY_CLIP, 1, 1, 0)
    commit = compile_program("commit", "fp32", TINY_CLIP, 1, 1, 0)
    assert commit.memory.arena_bytes > after.memory.arena_bytes
    graph = trace_model(CONFIG, micro_batch_size=B, seq_len=T)
    options = replace(commit.options, budget=after.memory.arena_bytes)
    with pytest.raises(MemoryBudgetError, match=r"--update-rule after-norm would drop the "
                                                r"commit rule's undo copies \("):
        run_pipeline(Program(graph, options))
    run_pipeline(Program(graph, replace(options, update_rule="after-norm")))
