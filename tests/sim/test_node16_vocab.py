"""The vocabulary-parallel head on ../shared/measurements/node16-xeon's profile (NOTE
[vocabulary-parallel head], ir/vocab.py): pp 4 x dp 4 (ZeRO 0, 8 micro-batches of 1,
T 256, fp32, as the measurement's README compiles it) simulated with the head's rows over
the four stages against today's 1f1b, and the LM-head stage no longer the busiest."""
import pytest

from ratrain import models
from ratrain.compiler import compile_graph, resolve_options, trace_for
from ratrain.sim import simulate
from test_node16 import MEASURED, _profile, _rows

pytestmark = pytest.mark.skipif(not (MEASURED / "steps.jsonl").is_file(),
                                reason=f"the 16-rank measurement is not at {MEASURED}")
GAINS = {"1f1b": 1.20, "zb1": 1.40}     # issue 43's acceptance: at least these speed-ups


def _simulation(row: dict, pipeline_schedule: str, vocab_parallel: bool):
    config = models.get_config(str(MEASURED / "model.json"))
    options = resolve_options(config, _profile(), pp=row["pp"], dp=row["dp"],
                              micro_batches=row["micro_batches"],
                              micro_batch_size=row["micro_batch_size"], zero=row["zero"],
                              seq_len=row["seq_len"], precision=row["precision"],
                              pipeline_schedule=pipeline_schedule,
                              vocab_parallel=vocab_parallel)
    program = compile_graph(trace_for(config, "node16", options), options,
                            profile=_profile())[0]
    return simulate(program, _profile())


@pytest.fixture(scope="module")
def pp4_dp4():
    row, = [r for r in _rows() if (r["pp"], r["dp"]) == (4, 4)]
    return {(s, v): _simulation(row, s, v) for s in ("1f1b", "zb1") for v in (False, True)}


@pytest.mark.parametrize("schedule", list(GAINS))
def test_vocab_parallel_speeds_up_the_pipelined_step(pp4_dp4, schedule):
    today = pp4_dp4[("1f1b", False)].step_time
    split = pp4_dp4[(schedule, True)].step_time
    assert today / split >= GAINS[schedule], \
        f"vocab-parallel {schedule} {split:.3f} s against 1f1b {today:.3f} s"


def test_the_head_stage_no_longer_bounds_the_step(pp4_dp4):
    """The last stage is the busiest without the split and not with it."""
    busy = lambda result: {r: result.replay.busy(r) for r in result.replay.ends}
    before, after = busy(pp4_dp4[("1f1b", False)]), busy(pp4_dp4[("1f1b", True)])
    assert max(before, key=before.get) == 3
    assert max(after, key=after.get) != 3
    assert after[3] < 0.8 * before[3]
