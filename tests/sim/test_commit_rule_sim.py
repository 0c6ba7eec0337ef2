"""The simulator under the commit rule (NOTE [commit rule], passes/insert_update.py): a
speculative AdamW costs the update plus its norm share and undo copy, the NORM only its
world sum, the rollback calls nothing (a simulated step commits); the updates then run
before the NORM instead of after it, which shortens the exposed tail."""
from functools import lru_cache

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, trace_for
from ratrain.hw import load_profile
from ratrain.hw.topology import node_per_rank
from ratrain.ir.tasks import Kind
from ratrain.passes.lower_state import state_slots
from ratrain.passes.program import CompileOptions
from ratrain.sim import simulate
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.costs import UPDATE_BYTES_PER_PARAM
from ratrain.sim.steps import Compute, WorldSum

PROFILE = node_per_rank(load_profile("mt3000") | {"link_bandwidth": 1e9, "op_costs": {}})


@lru_cache(maxsize=None)
def compiled(rule: str, **flags):
    options = CompileOptions(micro_batches=5, micro_batch_size=2, seq_len=32, update_rule=rule,
                             **flags)
    return compile_graph(trace_for(models.get_config("tiny"), "tiny", options), options)[0]


def _task(program, text: str):
    return next(t for ts in program.tasks.values() for t in ts if str(t) == text)


@pytest.mark.parametrize("flags", [dict(pp=1, dp=2, zero=0, clip=1.0),
                                   dict(pp=1, dp=2, zero=2, precision="fp16")])
def test_speculative_update_costs_its_share_and_undo_copy(flags):
    program = compiled("commit", **flags)
    costs = ProfileCosts(program, PROFILE)
    ddr, n = PROFILE["ddr_bandwidth"], state_slots(program, 1)[3]
    shard = state_slots(program, 1)[4]
    grad = 4 * (shard if program.options.zero == 2 else n)
    owned = grad if program.options.zero == 2 else grad / 2
    fp16 = program.options.precision == "fp16"
    share = (2 * owned + 2 * grad) if fp16 else owned
    undo = 2 * 3 * 4 * shard
    update = UPDATE_BYTES_PER_PARAM * shard / ddr
    steps = [s for s in costs.steps(_task(program, "0UPD[L1]")) if isinstance(s, Compute)]
    assert sum(s.seconds for s in steps) == pytest.approx(update + (share + undo) / ddr, rel=1e-12)
    assert costs.steps(_task(program, "0NORM")) == (WorldSum(costs.world_sum_seconds()),)
    plain = compiled("after-norm", **flags)
    plain_steps = ProfileCosts(plain, PROFILE).steps(_task(plain, "0UPD[L1]"))
    assert sum(s.seconds for s in plain_steps if isinstance(s, Compute)) == \
        pytest.approx(update, rel=1e-12)


@pytest.mark.parametrize("flags, tail_ms", [
    (dict(pp=1, dp=2, zero=0, clip=1.0), (16.793, 13.477)),
    (dict(pp=2, dp=2, zero=0, precision="fp16"), (9.361, 8.361))])
def test_updates_before_the_norm_shorten_the_exposed_tail(flags, tail_ms):
    """Values of this profile and model (a regression guard): after-norm's UPDs wait
    for the NORM behind the last SYNC; speculative ones overlap it."""
    tails = []
    for rule in ("after-norm", "commit"):
        sim = simulate(compiled(rule, **flags),
                           node_per_rank(load_profile("mt3000") | {"link_bandwidth": 1e9}))
        tails.append(sim.exposed_tail * 1e3)
        updates = [s for s in sim.replay.spans[0] if s.task.kind == Kind.UPD]
        norm = next(s for s in sim.replay.spans[0] if s.task.kind == Kind.NORM)
        if rule == "commit":
            assert all(u.end <= norm.start for u in updates)
        else:
            assert all(u.start >= norm.end for u in updates)
    assert tails == pytest.approx(tail_ms, abs=1e-3)
    assert tails[1] < tails[0]
