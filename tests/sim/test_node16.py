"""The 16-rank measurement of ../shared/measurements/node16-xeon (a 16-core Xeon, one node):
`ratrain simulate` of its three programs on that node's own profile against the measured
median step times.

The profile predates the node fields (hw/profiles.py); each is derived from what it holds
(hw/topology.py), never fitted to the runs:
- ranks_per_node: node_cores 16 // 1 thread per rank (16 ranks on 16 cores) = 16;
- node_memory_bandwidth: its `threads["1"]` DDR rate, measured with all 16 ranks
  streaming at once (9.811 GB/s each), times node_cores = 157 GB/s;
- collective_progress_share: 0, as for every calibrated profile: its ranks talk through
  the mpich wheel's shared memory, which moves a collective's bytes only inside MPI calls
  (NOTE [manual progress], sim/engine.py);
- inter-node port: none is crossed (one node);
- the runtime's calls past their largest calibrated case (AdamW of the 16.4M-parameter
  embedding and head, its all-reduce finish) at that case's measured time per byte
  (NOTE [streaming calls past the cases], sim/kernels.py), not the fit over all cases.
The programs are compiled as the measurement's README says (T 256, global batch 32,
fp32, --hw that profile).
"""
import json
from functools import lru_cache
from pathlib import Path

import pytest

from ratrain import models
from ratrain.compiler import compile_graph, resolve_options, trace_for
from ratrain.hw import load_profile
from ratrain.hw.topology import node_of
from ratrain.sim import simulate
from ratrain.sim.simulate import rank_profile

MEASURED = Path(__file__).resolve().parents[2].parent / "shared/measurements/node16-xeon"
pytestmark = pytest.mark.skipif(not (MEASURED / "steps.jsonl").is_file(),
                                reason=f"the 16-rank measurement is not at {MEASURED} "
                                       "(CI copies shared/ beside the clone)")
TOLERANCE = 0.05


def _rows() -> list[dict]:
    if not (MEASURED / "steps.jsonl").is_file():
        return []
    return [json.loads(line) for line in (MEASURED / "steps.jsonl").read_text().splitlines()]


@lru_cache(maxsize=None)
def _profile() -> dict:
    return load_profile(str(MEASURED / "profile.json"))


def _simulated(row: dict, pipeline_schedule: str = "1f1b") -> float:
    config = models.get_config(str(MEASURED / "model.json"))
    options = resolve_options(config, _profile(), pp=row["pp"], dp=row["dp"],
                              micro_batches=row["micro_batches"],
                              micro_batch_size=row["micro_batch_size"], zero=row["zero"],
                              seq_len=row["seq_len"], precision=row["precision"],
                              pipeline_schedule=pipeline_schedule)
    program = compile_graph(trace_for(config, "node16", options), options,
                            profile=_profile())[0]
    return simulate(program, _profile()).step_time


def test_the_node_fields_come_from_what_the_profile_holds():
    node = node_of(rank_profile(_profile(), 16))
    one_rank = _profile()["threads"]["1"]["ddr_bandwidth"]
    assert (node.ranks, node.progress_share) == (16, 0.0)
    assert node.memory_bandwidth == pytest.approx(16 * one_rank) == pytest.approx(156.976e9)
    assert node.link_bandwidth == _profile()["link_bandwidth"]


# The pipelined ZeRO-0 layouts lose their time in the step's tail, not in the pipeline.
# Per-task traces of pp 2 x dp 8 and pp 4 x dp 4 (compiled on this profile) on another
# 16-core machine, steps 3-7, against the simulation:
# - compute matches: pp 4's LM-head stage F 91.7 / B 249 ms per micro-batch (simulated
#   94 / 256: the 32000-word head is not underestimated), its 5-layer stage F 114 / B 188
#   (125 / 212); stage 0 received its last backward at 3.27 s of a 4.15 s step (3.34);
# - the updates of the vocabulary-sized layers did not: UPD (all-reduce wait, its finish,
#   AdamW) of the embedding took 0.83-1.02 s on pp 4's stage 0, of the head 0.33-0.50 s,
#   pp 2's 0.37 / 0.38 s, where the fit of AdamW over all its cases charged 0.135 s. This
#   profile's own AdamW cases stream at 5.0, 2.3 and 1.35 GB/s (64K, 256K, 1M parameters,
#   every rank at once) and the same machine's 16.4M-parameter AdamW took 401 ms (1.14
#   GB/s): charging a runtime call past its largest case at that case's time per byte
#   (NOTE [streaming calls past the cases], sim/kernels.py) brings pp 2 within 5%.
# pp 4 x dp 4 stays about 18% short. What it still lacks, measured there: MPICH's 65.5 MB
# all-reduce in groups of 4 on the busy node took 78 ms where the copy-rate model charges
# 11 (see NOTE [measured node collectives]: a fresh calibration's rows give it; this profile
# has none), and the four replicas reach the embedding's all-reduce up to 0.4 s apart, so
# it waits for the slowest pipeline, which a replay of replica 0 cannot see.
LAYOUTS_NOT_YET = {(4, 4)}


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"pp{r['pp']}-dp{r['dp']}")
def test_simulated_step_is_within_5_percent_of_the_measured_median(row, request):
    if (row["pp"], row["dp"]) in LAYOUTS_NOT_YET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "pp 4's embedding all-reduce waits for MPICH's real rate and the slowest of "
            "four replicas, neither in this profile (see LAYOUTS_NOT_YET)")))
    simulated, measured = _simulated(row), row["measured_median_from_step_3"]
    assert abs(simulated / measured - 1) <= TOLERANCE, \
        f"simulated {simulated:.3f} s, measured {measured:.3f} s"


# NOTE [zb1 on the node]: zb1 (passes/schedule_zb1.py) simulates pp 4 x dp 4 at 3.448 s
# against 1f1b's 3.748 s, 8.0% faster (3.616 s, 3.5%, while the head's cross-entropy
# backward stayed whole in B), not the 20% issue 26 hoped for. The step is bound by the
# LM-head stage: its 32000-word cross-entropy backward took 256 ms of its 350 ms per
# micro-batch, a third of which W now runs (NOTE [B/W split]), so that stage passes each
# gradient on sooner, but it still computes F, B and W for 2.80 s from its first forward
# at 0.29 s, and its head's AdamW (0.35 s) ends it at 3.41 s whatever the schedule. No
# schedule does better than 3.40 s: that stage's first F starts at 0.206 s (ends at
# 0.29 s) and it computes 3.19 s per step on one core (F, B and W 2.80 s, the rest its
# updates): 9.4% below 1f1b's 3.748 s, where issue 26 hoped for 20%.
ZB1_GAIN = 0.07


@pytest.mark.parametrize("row", [r for r in _rows() if (r["pp"], r["dp"]) == (4, 4)],
                         ids=lambda r: f"pp{r['pp']}-dp{r['dp']}")
def test_zb1_shortens_the_pipelined_step(row):
    one_f_one_b, zb1 = _simulated(row), _simulated(row, "zb1")
    assert zb1 <= (1 - ZB1_GAIN) * one_f_one_b, f"zb1 {zb1:.3f} s, 1f1b {one_f_one_b:.3f} s"
