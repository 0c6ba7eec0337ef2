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
- inter-node port: none is crossed (one node).
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


def _simulated(row: dict) -> float:
    config = models.get_config(str(MEASURED / "model.json"))
    options = resolve_options(config, _profile(), pp=row["pp"], dp=row["dp"],
                              micro_batches=row["micro_batches"],
                              micro_batch_size=row["micro_batch_size"], zero=row["zero"],
                              seq_len=row["seq_len"], precision=row["precision"])
    program = compile_graph(trace_for(config, "node16", options), options)[0]
    return simulate(program, _profile()).step_time


def test_the_node_fields_come_from_what_the_profile_holds():
    node = node_of(rank_profile(_profile(), 16))
    one_rank = _profile()["threads"]["1"]["ddr_bandwidth"]
    assert (node.ranks, node.progress_share) == (16, 0.0)
    assert node.memory_bandwidth == pytest.approx(16 * one_rank) == pytest.approx(156.976e9)
    assert node.link_bandwidth == _profile()["link_bandwidth"]


# pp 2 x dp 8 and pp 4 x dp 4 are still 14% and 23% short, and what they lose is in the
# step's tail, not in the pipeline. Per-task traces of both programs (compiled on this
# profile) on another 16-core machine, steps 3-7, measured against simulated per micro-batch:
# - compute matches: pp 4's LM-head stage F 91.7 / B 249 ms (simulated 94 / 256: the
#   32000-word head is not underestimated), its 5-layer stage F 114 / B 188 (125 / 212);
#   stage 0 received its last backward at 3.27 s of a 4.15 s step (simulated 3.34 of 3.52);
# - the ZeRO-0 updates of the vocabulary-sized layers are not: UPD (all-reduce wait, its
#   finish and AdamW) of the embedding took 0.83-1.02 s on pp 4's stage 0 and of the head
#   0.33-0.50 s (simulated 0.135 s each); pp 2's 0.37 / 0.38 s (0.139 s). Three causes,
#   each measured: MPICH's 65.5 MB all-reduce in groups of 4 with the node busy took 78 ms
#   where the copy-rate model charges 11 (NOTE [measured node collectives]); AdamW and the
#   all-reduce finish of 16.4M parameters cost 1.6x and 4.3x a fit of layers up to 1M
#   (timed on a 2-core machine, NOTE [model-sized runtime calls]); and the replicas reach the
#   embedding's all-reduce up to 0.4 s apart, so it waits for the slowest pipeline, which a
#   replay of replica 0 cannot see. This profile holds neither the collective rows nor
#   runtime calls of those sizes, so none of it can be derived from it here; a fresh
#   `ratrain calibrate` on the node measures the first two.
LAYOUTS_NOT_YET = {(2, 8), (4, 4)}


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"pp{r['pp']}-dp{r['dp']}")
def test_simulated_step_is_within_5_percent_of_the_measured_median(row, request):
    if (row["pp"], row["dp"]) in LAYOUTS_NOT_YET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "the ZeRO-0 tail of the vocabulary-sized layers (MPICH's all-reduce, updates "
            "past the calibrated sizes, replicas apart) is not in this profile (see "
            "LAYOUTS_NOT_YET)")))
    simulated, measured = _simulated(row), row["measured_median_from_step_3"]
    assert abs(simulated / measured - 1) <= TOLERANCE, \
        f"simulated {simulated:.3f} s, measured {measured:.3f} s"
