"""`ratrain calibrate`: the fits, the kernel cases, the profile it writes (loaded, compiled
for and simulated on), the MPI probe and the command. No timing is asserted: the times
fed to the fits are made up, the probe's are only checked to be there."""
import json
import math

import numpy as np
import pytest

from ratrain.calibrate import build_profile
from ratrain.calibrate.cases import all_cases
from ratrain.calibrate.fit import fit_link, fit_op
from ratrain.calibrate.profile import run_probe
from ratrain.cli import main
from ratrain.calibrate.profile import write_profile
from ratrain.codegen.emit import EMITTERS
from ratrain.hw import load_profile
from ratrain.ir.split_backward import SPLIT_OPS  # zb1's GEMM halves: shares of matmul_bwd

MACHINE = {"node_cores": 2, "memory_bytes": 16 << 30, "last_level_cache": 32 << 20,
           "l1_data_cache": 48 << 10}
RUNTIME_MEMORY_OPS = {"reshape", "copy", "accumulate_grad", "matmul_bias", "matmul_bias_bwd"}


@pytest.fixture(scope="module")
def cases():
    return all_cases()


def made_up_run(cases, threads: int, ping_pong=()) -> dict:
    """Probe output whose times follow 5 us + FLOPs at 20 GFLOP/s x threads + bytes at
    10 GB/s."""
    seconds = lambda c: 5e-6 + c.flops / (2e10 * threads) + c.nbytes / 1e10
    return {"ranks": 2 if ping_pong else 1, "threads": threads, "ping_pong": list(ping_pong),
            "kernels": [{"op": c.op, "precision": c.precision, "shape": c.shape,
                         "flops": c.flops, "bytes": c.nbytes, "seconds": seconds(c)}
                        for c in cases]}


PINGS = [[8, 2e-6 + 8 / 4e9], [1 << 16, 2e-6 + (1 << 16) / 4e9],
         [1 << 20, 2e-6 + (1 << 20) / 4e9]]


def test_fit_op_recovers_call_time_and_rates():
    flops, nbytes = [1e8, 4e8, 1e9, 2e9, 3e7], [1e6, 8e6, 2e6, 3e7, 5e5]
    seconds = [1e-5 + f / 5e10 + b / 1e10 for f, b in zip(flops, nbytes)]
    costs = fit_op(flops, nbytes, seconds)
    assert costs == pytest.approx({"seconds": 1e-5, "flop_rate": 5e10, "byte_rate": 1e10},
                                  rel=1e-6)


def test_fit_op_keeps_every_term_non_negative():
    """Times growing faster than the FLOPs: unconstrained least squares would take a
    negative call time; the fit drops that term instead."""
    flops = [1e8, 1e9, 1e10]
    costs = fit_op(flops, [0, 0, 0], [(f / 1e9) ** 1.2 for f in flops])
    assert set(costs) == {"seconds", "flop_rate"} and costs["seconds"] == 0.0
    assert costs["flop_rate"] > 0


def test_fit_link_from_two_message_sizes():
    latency, bandwidth = fit_link(tuple(PINGS[0]), tuple(PINGS[-1]))
    assert (latency, bandwidth) == pytest.approx((2e-6, 4e9), rel=1e-9)


def test_fit_link_rejects_times_that_do_not_grow():
    with pytest.raises(ValueError, match="do not grow"):
        fit_link((8, 3e-6), (1 << 20, 2e-6))


def test_cases_cover_every_native_op_and_count_as_the_simulator(cases):
    ops = {c.op for c in cases}
    assert set(EMITTERS) - RUNTIME_MEMORY_OPS - SPLIT_OPS <= ops
    gemm = {c.op: c for c in cases if c.shape == "M=256 N=688 K=256" and c.precision == "fp32"}
    assert gemm["matmul"].flops == 2 * 256 * 688 * 256
    assert gemm["matmul_bwd"].flops == 4 * 256 * 688 * 256
    assert gemm["matmul"].nbytes == 4 * (256 * 256 + 688 * 256 + 256 * 688)
    assert gemm["matmul_bwd"].nbytes == 4 * (2 * 256 * 256 + 2 * 688 * 256 + 256 * 688)
    assert {c.precision for c in cases} == {"fp32", "bf16", "fp16"}
    assert {c.op for c in cases if c.precision != "fp32"} == \
        {"matmul", "matmul_bwd", "cross_entropy", "cross_entropy_bwd"}


def test_every_kernel_node_of_the_bench_programs_finds_its_case_by_shape(cases):
    """See NOTE [cases by shape]: the simulator looks a call up by kernel_shape of its node
    (the forward partner's for a backward node); the cases are named the same way, so
    every kernel node of tiny and tiny-gqa at bench/predict's shapes (T 256, micro-batches
    of 1 and 2) that some case's FLOPs and bytes match names a case that ran, with the
    node's own FLOPs and bytes (tiny-gqa's 64-wide K and V GEMMs match none: the fit)."""
    from ratrain import models
    from ratrain.compiler import trace_for
    from ratrain.ir.costs import node_flops
    from ratrain.passes.program import CompileOptions
    from ratrain.sim.kernels import kernel_shape, node_bytes
    named = {(c.op, c.shape): c for c in cases if c.precision == "fp32"}
    sized = {(c.op, c.flops, c.nbytes) for c in named.values()}
    found = set()
    for model in ("tiny", "tiny-gqa"):
        for batch in (1, 2):
            options = CompileOptions(micro_batches=2, micro_batch_size=batch, seq_len=256)
            graph = trace_for(models.get_config(model), model, options)
            for kind in graph.kinds.values():
                for node in kind.fwd.nodes:
                    shape, size = kernel_shape(node), (node_flops(node), node_bytes(node))
                    if shape is None or (node.op, *size) not in sized:
                        continue
                    case = named.get((node.op, shape))
                    assert case is not None, (model, batch, node.op, shape)
                    assert (case.flops, case.nbytes) == size
                    found.add(node.op)
    assert found == {"matmul", "rope", "attention", "rms_norm", "swiglu", "embedding",
                     "cross_entropy"}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_gemm_cases_count_their_operands_in_their_format(cases, precision):
    """See NOTE [16-bit GEMM cases]: x, w, y, dy and dx in the 16-bit format, dw in fp32 (the
    bytes the simulator counts for a 16-bit program's matmul nodes), the same FLOPs."""
    gemm = {c.op: c for c in cases if c.shape == "M=256 N=688 K=256" and
            c.precision == precision}
    assert gemm["matmul"].flops == 2 * 256 * 688 * 256
    assert gemm["matmul"].nbytes == 2 * (256 * 256 + 688 * 256 + 256 * 688)
    assert gemm["matmul_bwd"].nbytes == 2 * (2 * 256 * 256 + 688 * 256 + 256 * 688) \
        + 4 * 688 * 256
    attention = next(c for c in cases if c.op == "attention" and c.shape == "B=2 T=128 H=4 D=64")
    assert attention.flops == 4 * 2 * 4 * 64 * (128 * 129 // 2)


class OneRank:
    """The MPI world of a probe run alone: barriers pass, reductions are the value."""

    def Barrier(self):
        pass

    def allreduce(self, value, op=None):
        return value


def test_every_case_runs(cases):
    """Every op of every case group has cases, and its first case, timed as the probe times
    it, runs and gives positive finite seconds and positive bytes."""
    from ratrain.calibrate.cases import _groups
    from ratrain.calibrate.probe import REPS, time_case
    assert {c.op for c in cases} == {op for names in _groups() for op in names}
    for op in sorted({c.op for c in cases}):
        case = next(c for c in cases if c.op == op)
        times = time_case(OneRank(), case, 1, lambda: None)
        assert case.op == op and case.nbytes > 0 and case.flops >= 0, case
        assert REPS[0] <= len(times) <= REPS[1], (op, times)
        assert all(math.isfinite(t) and t > 0 for t in times), (op, times)


def test_profile_loads_compiles_and_simulates(cases, tmp_path, capsys):
    profile = build_profile([made_up_run(cases, 1, PINGS), made_up_run(cases, 2)], MACHINE)
    path = tmp_path / "cpu-here.json"
    write_profile(profile, path)
    loaded = load_profile(path)
    assert loaded["calibrated"] is True and set(loaded["threads"]) == {"1", "2"}
    assert (loaded["link_latency"], loaded["link_bandwidth"]) == pytest.approx((2e-6, 4e9))
    for threads in (1, 2):
        matmul = dict(loaded["threads"][str(threads)]["op_costs"]["fp32"]["matmul"])
        measured = matmul.pop("measured")
        assert matmul == pytest.approx({"seconds": 5e-6, "flop_rate": 2e10 * threads,
                                        "byte_rate": 1e10}, rel=1e-3)
        gemms = [c for c in cases if c.op == "matmul" and c.precision == "fp32"]
        assert [m[:2] for m in measured] == [[c.flops, c.nbytes] for c in gemms]
        assert [m[3] for m in measured] == [c.shape for c in gemms]  # NOTE [cases by shape]
        assert measured[0][2] == pytest.approx(5e-6 + gemms[0].flops / (2e10 * threads)
                                               + gemms[0].nbytes / 1e10, rel=1e-3)
        per_thread = loaded["threads"][str(threads)]
        for precision in ("bf16", "fp16"):  # NOTE [16-bit GEMM cases]
            assert set(per_thread["op_costs"][precision]) == {
                "matmul", "matmul_bwd", "matmul_bias", "matmul_bias_bwd", "cross_entropy",
                "cross_entropy_bwd"}
            assert [m[:2] for m in per_thread["op_costs"][precision]["matmul"]["measured"]] \
                == [[c.flops, c.nbytes] for c in cases
                    if c.op == "matmul" and c.precision == precision]
            assert per_thread[f"{precision}_flops"] > per_thread["fp32_flops"]  # fewer bytes
    assert loaded["threads"]["1"]["op_costs"]["fp32"]["matmul_bias"] == \
        loaded["threads"]["1"]["op_costs"]["fp32"]["matmul"]
    assert max(v for per_op in loaded["sources"]["fit_error"].values()
               for v in per_op.values()) < 1e-3
    program = tmp_path / "prog"
    assert main(["compile", "tiny", "--seq-len", "32", "--pp", "2", "--hw", str(path),
                 "-o", str(program)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(program), "--hw", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["hw"] == "cpu" and record["step_time_s"] > 0


def test_probe_times_kernels_and_ping_pongs_under_mpiexec(capfd):
    run = run_probe(2, 1, ops="add,adamw")
    assert (run["ranks"], run["threads"]) == (2, 1)
    assert {r["op"] for r in run["kernels"]} == {"add", "adamw"}
    assert all(r["seconds"] > 0 and r["bytes"] > 0 for r in run["kernels"])
    assert [n for n, _ in run["ping_pong"]] == [8, 1 << 16, 1 << 20]
    assert all(t > 0 for _, t in run["ping_pong"])
    assert "ping-pong between ranks 0 and 1" in capfd.readouterr().out


def test_cold_times_and_the_cache_share_go_to_each_threads_entry(cases):
    """See NOTE [cache residency]: a probe run with cold times and a cache share gives its
    threads entry op_costs_cold (fitted on the cold times) and cache_bytes; one without
    them gives neither, and the simulator charges every call warm."""
    cold_run = made_up_run(cases, 1, PINGS)
    for row in cold_run["kernels"]:
        row["seconds_cold"] = 2 * row["seconds"]
    cold_run["cache_bytes"] = 12 << 20
    profile = build_profile([cold_run, made_up_run(cases, 2)], MACHINE)
    one, two = profile["threads"]["1"], profile["threads"]["2"]
    assert one["cache_bytes"] == 12 << 20
    warm_fit, cold_fit = one["op_costs"]["fp32"]["matmul"], one["op_costs_cold"]["fp32"]["matmul"]
    assert [m[2] for m in cold_fit["measured"]] == pytest.approx(
        [2 * m[2] for m in warm_fit["measured"]], rel=1e-3)
    assert "op_costs_cold" not in two and "cache_bytes" not in two


@pytest.mark.slow
def test_probe_times_kernels_warm_and_cold_and_measures_the_cache_share():
    run = run_probe(2, 1, ops="add,rms_norm", evict=8 << 20)
    from ratrain.calibrate.probe import CACHE_SWEEP
    assert run["cache_bytes"] in CACHE_SWEEP
    for row in run["kernels"]:
        assert row["seconds_cold"] > 0
        if row["op"] == "add":  # swept either way: timed once
            assert row["seconds_cold"] == row["seconds"]


def test_command_writes_a_loadable_profile(cases, tmp_path, capsys, monkeypatch):
    profile = build_profile([made_up_run(cases, 1, PINGS), made_up_run(cases, 2)], MACHINE)
    monkeypatch.setattr("ratrain.calibrate.calibrate", lambda progress, evict: profile)
    out = tmp_path / "sub" / "mine.json"
    assert main(["calibrate", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "link 2.00 us + 4.00 GB/s" in printed
    assert "2 threads per rank: GEMM up to" in printed
    assert load_profile(out)["threads"] == profile["threads"]
    assert not math.isnan(load_profile(out)["ddr_bandwidth"])


def test_command_refuses_a_file_that_is_not_json(tmp_path, capsys):
    assert main(["calibrate", "-o", str(tmp_path / "cpu.txt")]) == 2
    err = capsys.readouterr().err
    assert "a profile is a .json file" in err and err.count("\n") == 1


@pytest.mark.parametrize("flag", [[], ["--evict"]])
def test_probes_sweep_the_caches_only_under_evict(cases, tmp_path, monkeypatch, flag):
    """See NOTE [warm operands]: by default the probes time kernel calls back to back and sweep
    the last-level cache only before the runtime calls; --evict sweeps before every call,
    and the profile's sources say which. The run of several ranks also probes the node."""
    sweeps, nodes = [], []

    def probe(ranks, threads, ops=None, evict=0, evict_kernels=False, node=False):
        sweeps.append((evict, evict_kernels))
        nodes.append((ranks, node))
        return made_up_run(cases, threads, PINGS if ranks > 1 else ())
    monkeypatch.setattr("ratrain.calibrate.profile.run_probe", probe)
    monkeypatch.setattr("ratrain.calibrate.profile.machine_facts", lambda: MACHINE)
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "-o", str(out), *flag]) == 0
    assert sweeps == [(MACHINE["last_level_cache"], bool(flag))] * 2
    assert nodes == [(1, False), (2, True)]
    sources = load_profile(out)["sources"]["op_costs"]
    assert ("operands come from DDR (--evict)" in sources) == bool(flag)
    assert ("operands are warm" in sources) != bool(flag)


def test_ranks_sweeping_at_once_share_the_last_level_cache(cases, tmp_path, monkeypatch):
    """See NOTE [sweep share]: on a 16-core node with a 300 MiB cache, the 16 ranks that sweep
    together stream twice the cache between them (37.5 MiB each), and the one rank of 16
    threads streams it whole, as one rank or two did before."""
    sweeps = {}

    def probe(ranks, threads, ops=None, evict=0, evict_kernels=False, node=False):
        sweeps[ranks] = evict
        return made_up_run(cases, threads, PINGS if ranks > 1 else ())
    node16 = MACHINE | {"node_cores": 16, "last_level_cache": 300 << 20}
    monkeypatch.setattr("ratrain.calibrate.profile.run_probe", probe)
    monkeypatch.setattr("ratrain.calibrate.profile.machine_facts", lambda: node16)
    assert main(["calibrate", "-o", str(tmp_path / "cpu.json")]) == 0
    assert sweeps == {1: 300 << 20, 16: 75 << 19}


def test_only_cold_cases_are_swept_unless_every_case():
    from ratrain.calibrate.cases import all_cases as every
    from ratrain.calibrate.probe import Evictor
    from ratrain.calibrate.rt_cases import runtime_cases
    kernel = next(c for c in every({"matmul"}))
    cold = [c for c in every({"add"})] + runtime_cases()
    assert cold and all(c.cold for c in cold) and not kernel.cold
    sweep = Evictor(1 << 20, 1)
    assert sweep.before(kernel) is not sweep and all(sweep.before(c) is sweep for c in cold)
    everything = Evictor(1 << 20, 1, every_case=True)
    assert everything.before(kernel) is everything


def made_up_node(ranks: int, memory: float, progress: float) -> dict:
    """Node probe output of `ranks` ranks whose collectives copy through `memory` B/s
    (NOTE [node memory]) and move at `progress` of their speed beside kernels."""
    rows = []
    for op, traffic, port in (("reduce_scatter", 3, (ranks - 1) / ranks),
                              ("allgather", 2, (ranks - 1) / ranks),
                              ("allreduce", 2.5, 2 * (ranks - 1) / ranks)):
        for nbytes in (4 << 20, 32 << 20):
            rows.append({"op": op, "members": ranks, "groups": 1, "bytes": nbytes,
                         "seconds": port * nbytes * traffic * ranks / memory})
    allreduce = rows[-1]["seconds"]
    return {"collectives": rows, "beside_kernel": {
        "kernel_seconds": 1.0, "kernel_seconds_beside": 1.25, "allreduce_bytes": 32 << 20,
        "allreduces_done": progress * 1.25 / allreduce, "members": ranks}}


def test_node_fields_come_from_the_collectives_every_rank_ran(cases, tmp_path):
    run = made_up_run(cases, 1, PINGS) | {"node": made_up_node(2, 40e9, 0.25)}
    profile = build_profile([run, made_up_run(cases, 2)], MACHINE)
    assert profile["node_memory_bandwidth"] == pytest.approx(40e9, rel=1e-3)
    assert profile["collective_progress_share"] == pytest.approx(0.25, rel=1e-3)
    assert profile["node_collectives"]["kernel_slowdown_beside"] == pytest.approx(1.25)
    assert len(profile["node_collectives"]["rows"]) == 6
    path = tmp_path / "node.json"
    write_profile(profile, path)
    assert load_profile(path)["node_memory_bandwidth"] == pytest.approx(40e9, rel=1e-3)
    assert "node_memory_bandwidth" not in build_profile(
        [made_up_run(cases, 1, PINGS), made_up_run(cases, 2)], MACHINE)


def test_probe_times_collectives_on_every_rank_and_beside_a_kernel_under_mpiexec(capfd):
    node = run_probe(2, 1, ops="add", node=True)["node"]
    assert {(r["op"], r["members"], r["groups"]) for r in node["collectives"]} == \
        {(op, 2, 1) for op in ("allreduce", "reduce_scatter", "allgather")}
    assert all(r["seconds"] > 0 for r in node["collectives"])
    beside = node["beside_kernel"]
    assert beside["kernel_seconds"] > 0 and beside["kernel_seconds_beside"] > 0
    assert beside["allreduces_done"] >= 0 and beside["members"] == 2
    assert "collectives on every rank at once" in capfd.readouterr().out


def test_the_gather_view_case_runs_the_runtimes_gather_over_a_group_of_one():
    """See NOTE [gather start]: the case is the runtime's own gather_view (shard cast, MPI's
    all-gather started and completed over this rank alone), so the view ends up holding
    the master; every size is a case."""
    from ratrain.calibrate.rt_cases import SIZES, OneMemberGroup, _slot, _state, runtime_cases
    from ratrain.ir.buffers import BufferKind, buffer_name
    from ratrain.program_format.lowered import Call
    from ratrain.rt.calls import run_call
    n = 1000
    names = [buffer_name(kind, layer=1) for kind in (BufferKind.MASTER, BufferKind.VIEW)]
    st = _state(n, dict.fromkeys(names, n))
    master, view = (_slot(name, n) for name in names)
    st.view(master)[:] = np.arange(n, dtype=np.float32) / 7
    run_call(OneMemberGroup(), st, Call("gather_view", (view,), (master,),
                                        (("use", "0F0"), ("in_place", True)), layer=1))
    np.testing.assert_array_equal(st.view(view), st.view(master))
    assert [c.shape for c in runtime_cases() if c.op == "gather_view"] == \
        [f"n={size}" for size in SIZES]


def test_no_two_buffers_of_a_runtime_case_start_a_multiple_of_1_mib_apart():
    """See NOTE [no power-of-two strides]: AdamW over master, m, v and a gradient that
    start a multiple of 1 MiB apart ran about 7x slower than in any step's arena."""
    from ratrain.calibrate.rt_cases import SIZES, layer_state
    for n in SIZES:
        st, *slots = layer_state(n)
        starts = [st.offsets[s.buffer][0] + s.offset for s in slots]
        assert all((a - b) % (1 << 20) for a in starts for b in starts if a != b), n


def test_the_cache_share_ends_where_copies_come_down_to_memory_speed():
    """See NOTE [cache share]: a curve with a fast 2 MiB L2, a 16 MiB L3 share and DDR
    beyond (this machine's, one rank) gives the L3's share, not the L2's."""
    from ratrain.calibrate.probe import CACHE_SWEEP, cache_share_of
    gb = [64.1, 38.3, 23.7, 21.8, 20.1, 17.0, 20.9, 20.3, 15.3, 15.6, 13.2, 13.2]
    assert len(gb) == len(CACHE_SWEEP)
    assert cache_share_of([r * 1e9 for r in gb]) == 16 << 20
    assert cache_share_of([10e9] * len(CACHE_SWEEP)) == CACHE_SWEEP[0]  # no cache at all
