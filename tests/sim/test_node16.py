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


# pp 2 x dp 8 and pp 4 x dp 4 are still 14% and 23% short: what they lose beyond the
# node's shared memory is not in the model yet. Leads: pp 4's critical stage is the LM
# head alone, whose 32000-word cross-entropy the profile costs from a fit of vocabularies
# up to 1024 (calibrate/cases.py VOCAB); on another 16-core node MPICH's all-reduce took
# twice its reduce-scatter plus all-gather, which the ZeRO-0 layouts use.
LAYOUTS_NOT_YET = {(2, 8), (4, 4)}


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"pp{r['pp']}-dp{r['dp']}")
def test_simulated_step_is_within_5_percent_of_the_measured_median(row, request):
    if (row["pp"], row["dp"]) in LAYOUTS_NOT_YET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "the pipelined layouts lose more than the node's shared memory: not modelled "
            "yet (see LAYOUTS_NOT_YET)")))
    simulated, measured = _simulated(row), row["measured_median_from_step_3"]
    assert abs(simulated / measured - 1) <= TOLERANCE, \
        f"simulated {simulated:.3f} s, measured {measured:.3f} s"
