"""Traced rows (NOTE [traced rows], calibrate/from_trace.py): what a traced run took for
each kernel shape and runtime call, written into a profile by `ratrain calibrate --from`
and charged by the cost model in every program that has the shape. Checked on traces
whose every call ran a known multiple of its charge, then on a real traced run."""
import json
import math
from collections import defaultdict
import subprocess
import sys

import pytest

from ratrain.calibrate.from_trace import TracedRun, _add_samples, _ran, traced_profile
from ratrain.cli import main
from ratrain.compiler import recompile
from ratrain.hw import load_profile
from ratrain.programs import read_manifest
from ratrain.sim import simulate
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.simulate import rank_profile

SHAPE = ["tiny", "--seq-len", "32", "--micro-batch-size", "2", "--precision", "fp32"]


def compiled(root, name, *flags):
    out = root / name
    assert main(["compile", *SHAPE, *flags, "-o", str(out)]) == 0
    return out, recompile(read_manifest(out))


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    root = tmp_path_factory.mktemp("traced")
    return {"pp2": compiled(root, "pp2", "--pp", "2", "--micro-batches", "4"),
            "dp2": compiled(root, "dp2", "--pp", "1", "--dp", "2", "--micro-batches", "2"),
            "zb1": compiled(root, "zb1", "--pp", "2", "--micro-batches", "4",
                            "--pipeline-schedule", "zb1"),
            "long": compiled(root, "long", "--pp", "2", "--micro-batches", "4",
                             "--seq-len", "64")}


def charges(program, profile):
    costs = ProfileCosts(program, rank_profile(profile, program.options.world_size))
    return {task: costs.call_charges(task) for tasks in program.tasks.values()
            for task in tasks}


def write_traces(directory, path, program, factor, steps=4, profile=None):
    """Every rank's trace of `program` (directory `path`) as `ratrain run --trace` writes
    it, each lowered call one step that ran `factor` x its charge on `profile` (default:
    the cpu profile); `factor` may be a function of the rank and the step."""
    directory.mkdir(parents=True, exist_ok=True)
    charged = charges(program, profile or load_profile("cpu"))
    pace = factor if callable(factor) else lambda rank, step: factor
    for stage, tasks in program.tasks.items():
        for replica in range(program.options.dp):
            rank, events = program.rank(stage, replica), []
            for step in range(1, steps + 1):
                for task in tasks:
                    calls = [[i, 1, 5.0, seconds * pace(rank, step) * 1e6]
                             for i, (seconds, *_) in enumerate(charged[task])]
                    events.append({"name": str(task), "ph": "X", "pid": rank, "tid": 0,
                                   "ts": 0.0, "dur": 1.0, "args": {"step": step, "calls": calls}})
            meta = {"name": "ratrain_program", "ph": "M", "pid": rank,
                    "args": {"program": str(path)}}
            (directory / f"trace-rank{rank}.json").write_text(
                json.dumps({"traceEvents": [meta] + events}))


def test_every_keyed_call_costs_what_the_trace_measured_in_every_program(programs, tmp_path):
    """pp 2 ran every call at 1.5x its charge: the traced profile charges each call with
    a row 1.5x its old charge, in pp 2 itself, in dp 2 (other micro-batches, one stage,
    the same threads per rank) and in zb1 (whose B and W take their shares of the whole
    backward node's row)."""
    path, program = programs["pp2"]
    write_traces(tmp_path / "t", path, program, 1.5)
    base = load_profile("cpu")
    traced = traced_profile(base, [TracedRun(tmp_path / "t", path)])
    for name in ("pp2", "dp2", "zb1"):
        before, after = charges(programs[name][1], base), charges(programs[name][1], traced)
        keyed = 0
        for task, calls in before.items():
            for (old, key, *_), (new, *_) in zip(calls, after[task]):
                if key is not None and old > 0 and rows_hold(traced, program, key):
                    assert math.isclose(new, 1.5 * old, rel_tol=1e-5), (name, task, key)
                    keyed += 1
        assert keyed > 50, name
    assert simulate(program, traced).step_time > 1.3 * simulate(program, base).step_time


def rows_hold(profile, program, key) -> bool:
    """Whether the traced rows `profile` holds for `program`'s threads per rank have `key`
    (a runtime call of other shapes, a fill of another micro-batch count, has none)."""
    rows = rank_profile(profile, program.options.world_size)["traced"]["calls"]
    return " ".join(map(str, key)) in rows


def test_a_traced_row_moves_with_the_residency_a_call_finds(programs, tmp_path):
    """See NOTE [traced residency]: on a profile whose GEMMs cost 3x cold what they cost warm,
    with a cache share of 256 KiB, pp 2 ran every call at 1.5x its charge, each at the
    residency it found. The traced profile charges every GEMM call 1.5x its old charge in
    pp 2 and in dp 2, whose rank holds every layer and finds its operands otherwise
    cached; the median of pp 2's times as they ran (the rows before) is off for many of
    dp 2's calls."""
    import statistics
    warm = {"matmul": {"seconds": 1e-4}, "matmul_bwd": {"seconds": 2e-4}}
    cold = {op: {"seconds": 3 * cost["seconds"]} for op, cost in warm.items()}
    base = {k: v for k, v in load_profile("cpu").items() if k != "threads"} | {
        "op_costs": {"fp32": warm}, "op_costs_cold": {"fp32": cold}, "cache_bytes": 1 << 18}
    path, program = programs["pp2"]
    write_traces(tmp_path / "t", path, program, 1.5, profile=base)
    traced = traced_profile(base, [TracedRun(tmp_path / "t", path)])
    rows = traced["traced"]["calls"]
    gemm = lambda key: key is not None and key[1].startswith("matmul")
    as_ran = defaultdict(list)
    for calls in charges(program, base).values():
        for old, key, share, _ in filter(lambda c: gemm(c[1]), calls):
            as_ran[key].append(1.5 * old / share)
    off = 0
    for name in ("pp2", "dp2"):
        before, after = charges(programs[name][1], base), charges(programs[name][1], traced)
        gemms = 0
        for task, calls in before.items():
            for (old, key, share, _), (new, *_) in zip(calls, after[task]):
                if gemm(key):
                    assert rows[" ".join(map(str, key))][2] == 0.0
                    assert math.isclose(new, 1.5 * old, rel_tol=1e-9), (name, task, key)
                    gemms += 1
                    if name == "dp2":
                        off += not math.isclose(new, statistics.median(as_ran[key]) * share,
                                                rel_tol=0.01)
        assert gemms > 20, name
    assert off > 10


def test_a_step_of_several_calls_spreads_its_time_by_their_charges():
    """Step 0 ran calls 0-1 (charged 1 and 3) in 8 s: 2 s and 6 s; step 1 was skipped (one
    call, the commit rule's); step 2 ran call 3 alone in 5 s; a zb1 half (share 0.5) of
    call 4 gives its whole node twice what it took. Each call's op ran at its step's
    run over charge (NOTE [traced rows] 5): 2, 2, 2.5 and 4. A kernel call whose warm
    part of its charge the profile knows gives its sample scaled to fully cached (NOTE
    [traced residency]): a's 2 s at a warm part of 0.25 is 0.5 s."""
    samples, ratios, warm = defaultdict(list), defaultdict(list), defaultdict(int)
    a, b, c, d = (("fp32", op, "shape") for op in "abcd")
    charged = [(1.0, a, 1.0, 0.25), (3.0, b, 1.0, None), (9.0, ("fp32", "skipped"), 1.0, 1.0),
               (2.0, c, 1.0, None), (1.0, d, 0.5, None), (0.0, None, 1.0, None)]
    _add_samples(samples, ratios, warm, charged,
                 _ran(charged, [[0, 2, 0.0, 8e6], [2, 1, 1.0, 5e6], [3, 2, 0.0, 4e6]]))
    assert dict(samples) == {a: [0.5], b: [6.0], c: [5.0], d: [8.0]}
    assert dict(ratios) == {("fp32", "a"): [2.0], ("fp32", "b"): [2.0],
                            ("fp32", "c"): [2.5], ("fp32", "d"): [4.0]}
    assert dict(warm) == {a: 1}


def test_a_step_whose_calls_were_clocked_gives_each_call_its_own_time():
    """NOTE [traced rows] 1: step 0 ran calls a and b (charged 1 and 3) in 8 s, clocked 1 s
    and 7 s: their samples and op speeds are their own (a's 1 s at a warm part of 0.25 is
    0.25 s), not the step's 2 x charge; a zb1 half (share 0.5) clocked at 2 s gives its
    whole node 4 s, and a call charged nothing its clocked time, with no op speed."""
    samples, ratios, warm = defaultdict(list), defaultdict(list), defaultdict(int)
    a, b, d, e = (("fp32", op, "shape") for op in "abde")
    charged = [(1.0, a, 1.0, 0.25), (3.0, b, 1.0, None), (1.0, d, 0.5, None),
               (0.0, e, 1.0, None)]
    _add_samples(samples, ratios, warm, charged,
                 _ran(charged, [[0, 2, 0.0, 8e6, [1e6, 7e6]], [1, 2, 0.0, 3e6, [2e6, 1e6]]]))
    assert dict(samples) == {a: [0.25], b: [7.0], d: [4.0], e: [1.0]}
    assert dict(ratios) == {("fp32", "a"): [1.0], ("fp32", "b"): [7 / 3],
                            ("fp32", "d"): [2.0]}
    assert dict(warm) == {a: 1}


def write_host_traces(directory, path, program, steps=4):
    """Every rank's trace of `program`, each call its charge on the cpu profile, as
    `ratrain run --trace` writes it, and beyond that: a kernel call's step 20 us to enter
    its generated function (its clocked calls leave it out), a call that moves data 50
    us of host time, 10 us in each task outside its steps and 5 us between tasks. The
    microseconds outside the calls after the skipped steps, and the lowered calls."""
    from ratrain.calibrate.from_trace import SKIP_STEPS
    from ratrain.sim.calls import is_kernel_call
    costs = ProfileCosts(program, rank_profile(load_profile("cpu"), program.options.world_size))
    lowered_calls = {lt.task: lt.calls for stage in program.lowered.values() for lt in stage}
    outside, lowered = 0.0, 0
    for stage, tasks in program.tasks.items():
        rank, now, events = program.rank(stage, 0), 0.0, []
        for step in range(1, steps + 1):
            for task in tasks:
                ran = [[i, 1, 0.0, s * 1e6 + 20, [s * 1e6]] if is_kernel_call(call)
                       else [i, 1, 0.0, s * 1e6 + 50 * (op is not None)]
                       for i, ((s, *_), op, call) in enumerate(zip(
                           costs.call_charges(task), costs.host_ops(task), lowered_calls[task]))]
                dur = sum(c[3] for c in ran) + 10
                events.append({"name": str(task), "ph": "X", "pid": rank, "tid": 0, "ts": now,
                               "dur": dur, "args": {"step": step, "calls": ran}})
                now += dur + 5
                if step > SKIP_STEPS:
                    outside += 10 + 5 * (task is not tasks[0]) + 20 * sum(len(c) > 4 for c in ran)
                    lowered += len(ran)
            now += 1000
        meta = {"name": "ratrain_program", "ph": "M", "pid": rank, "args": {"program": str(path)}}
        (directory / f"trace-rank{rank}.json").write_text(
            json.dumps({"traceEvents": [meta] + events}))
    return outside, lowered


def test_the_runtimes_own_time_is_charged_where_the_run_spent_it(programs, tmp_path):
    """NOTE [traced rows] 4 and 7: what a run spends outside its calls' own clocks (the
    entry into a generated function, the loop within and between tasks) is the traced
    per-call overhead, and a call that moves data gives its op the host time it ran
    beyond its charge (50 us each: a send, a posted receive, a receive's wait, a gradient
    sync's start), which the simulator charges at the call: a send's before it goes, a
    receive's after its message is in."""
    from ratrain.ir.tasks import Kind
    from ratrain.sim.steps import Compute, Recv, Send
    path, program = programs["pp2"]
    outside, lowered = write_host_traces(tmp_path, path, program)
    traced = rank_profile(traced_profile(load_profile("cpu"), [TracedRun(tmp_path, path)]), 2)
    overhead, calls = traced.traced["call_overhead"]
    assert calls == lowered and math.isclose(overhead, outside * 1e-6 / lowered, rel_tol=1e-3)
    host = traced.traced["call_host"]
    assert set(host) == {"send", "post_recv", "wait_recv", "grad_sync"}
    assert all(math.isclose(seconds, 50e-6, rel_tol=1e-3) for seconds, _ in host.values())
    without = traced.with_fields(traced={k: v for k, v in traced.traced.items()
                                         if k != "call_host"})
    charged, bare = ProfileCosts(program, traced), ProfileCosts(program, without)

    def compute_around(costs, task, kind):
        steps = costs.steps(task)
        at = next(i for i, s in enumerate(steps) if isinstance(s, kind))
        before = sum(s.seconds for s in steps[:at] if isinstance(s, Compute))
        return before, sum(s.seconds for s in steps[at:] if isinstance(s, Compute))

    sends = [t for t in program.tasks[0] if t.kind == Kind.SEND_F]
    recvs = [t for t in program.tasks[1] if t.kind == Kind.RECV_F]
    assert sends and recvs
    for task in sends:
        (before, after), (was, then) = (compute_around(c, task, Send) for c in (charged, bare))
        assert math.isclose(before - was, 50e-6, rel_tol=1e-3) and after == then
    for task in recvs:
        (before, after), (was, then) = (compute_around(c, task, Recv) for c in (charged, bare))
        assert math.isclose(after - then, 50e-6, rel_tol=1e-3) and before == was


def test_ranks_run_at_the_pace_of_their_expected_slowest(programs, tmp_path):
    """See NOTE [rank spread]: in pp 2's counted steps (after SKIP_STEPS) one stage ran every
    call at 1.2x its charge and the other at 0.8x, the other way round the next step, so
    every call key's median is its charge: each step's slowest stage is 0.2 above the
    ranks' mean, and the spread 0.2 / e(2). dp 2's replicas so traced give the same
    spread. Every rank of a one-stage program of 2 replicas then computes 1 + spread x
    e(2) = 1.2x as long in every task, and the paced replicas' collectives wait for no
    straggler (the drift is left to a pipeline's replicas); a 2-stage pipeline's stages
    compute exp(+-spread x e(2)) as long, the slower first and then second, and its
    simulated step is the mean of the two; one rank keeps its pace, and a profile without
    the spread charges none."""
    from ratrain.calibrate.from_trace import SKIP_STEPS
    from ratrain.sim.costs import expected_largest_normal, stage_paces
    from ratrain.sim.steps import Compute, Start
    spreads = {}
    for name in ("pp2", "dp2"):
        path, program = programs[name]
        write_traces(tmp_path / name, path, program,
                     lambda rank, step: 1.2 if (rank + step) % 2 else 0.8, steps=SKIP_STEPS + 2)
        traced = rank_profile(traced_profile(load_profile("cpu"), [
            TracedRun(tmp_path / name, path)]), 2)
        spreads[name] = traced.traced["rank_spread"]
    assert spreads["pp2"] == spreads["dp2"]
    spread, samples = spreads["pp2"]
    assert math.isclose(spread, 0.2 / expected_largest_normal(2), rel_tol=1e-3) and samples == 2
    slow, fast = math.exp(0.2), math.exp(-0.2)
    (first, second), = [stage_paces(traced, 2, 1)]
    assert all(math.isclose(a, b, rel_tol=1e-3)
               for a, b in zip(first + second, (slow, fast, fast, slow)))
    assert stage_paces(traced, 2, 4) == stage_paces(traced, 2, 1)
    (replicas,), = stage_paces(traced, 1, 2)
    assert math.isclose(replicas, 1.2, rel_tol=1e-3)
    assert stage_paces(traced, 1, 1) == ((1.0,),)
    assert stage_paces(load_profile("cpu"), 2, 2) == ((1.0, 1.0),)
    without = traced.with_fields(traced={k: v for k, v in traced.traced.items()
                                         if k != "rank_spread"})
    drifting = {**without.traced, "arrival_drift": [0.1, 10]}
    computed = lambda costs, task: sum(s.seconds for s in costs.steps(task)
                                       if isinstance(s, Compute))
    straggles = lambda costs, task: [s.straggle for s in costs.steps(task)
                                     if isinstance(s, Start)]
    for name, paces in (("pp2", first), ("pp2", second), ("dp2", (1.2, 1.2))):
        p = programs[name][1]
        paced, bare = ProfileCosts(p, traced).paced(paces), ProfileCosts(p, without)
        tasks = [t for stage in p.tasks.values() for t in stage if computed(bare, t) > 0]
        assert len(tasks) > 10
        for task in tasks:
            assert math.isclose(computed(paced, task), paces[task.stage] * computed(bare, task),
                                rel_tol=1e-3), (name, task)
    pp2 = programs["pp2"][1]
    sim = simulate(pp2, traced)
    turns = [simulate_paced(pp2, traced, paces) for paces in (first, second)]
    assert all(map(lambda a, b: math.isclose(a, b, rel_tol=1e-9), sim.rotations, turns))
    assert len(sim.rotations) == 2 and turns[0] != turns[1]
    assert math.isclose(sim.step_time, sum(turns) / 2, rel_tol=1e-9)
    assert simulate(pp2, load_profile("cpu")).rotations == ()
    dp2 = programs["dp2"][1]
    paced = ProfileCosts(dp2, traced.with_fields(traced={**drifting, "rank_spread": [spread, 2]}))
    free = ProfileCosts(dp2, traced.with_fields(traced=drifting))
    posts = [t for t in dp2.tasks[0] if straggles(free, t)]
    assert posts and all(x > 0 for t in posts for x in straggles(free, t))
    assert all(x == 0 for t in posts for x in straggles(paced, t))


def simulate_paced(program, profile, paces):
    """The step of `program` replayed with its stages at `paces` (one rotation)."""
    from ratrain.hw.topology import node_of
    from ratrain.sim.replay import replay
    pipeline = {program.rank(stage, 0): tasks for stage, tasks in program.tasks.items()}
    node = node_of(profile)
    return replay(pipeline, ProfileCosts(program, profile).paced(paces),
                  bandwidth=profile.link_bandwidth, progress_share=node.progress_share,
                  kernel_slowdown=node.kernel_slowdown).step_time


def test_a_long_pipeline_replays_at_most_eight_rotations():
    """See NOTE [rank spread]. 16 stages replay 8 of their 16 rotations, evenly spaced, each
    the same 16 paces in another order, the slowest stage 8 stages on from the last's."""
    from ratrain.sim.costs import MAX_ROTATIONS, expected_normal_order, stage_paces
    profile = load_profile("cpu").with_fields(traced={"rank_spread": [0.1, 4]})
    rotations = stage_paces(profile, 16, 2)
    assert len(rotations) == MAX_ROTATIONS == 8
    paces = sorted(math.exp(0.1 * z) for z in expected_normal_order(16))
    assert all(sorted(r) == paces for r in rotations)
    assert [r.index(max(r)) for r in rotations] == [0, 14, 12, 10, 8, 6, 4, 2]


def test_a_shape_no_trace_ran_is_charged_at_its_ops_traced_speed(programs, tmp_path):
    """NOTE [traced rows] 5: pp 2 at 32 tokens ran every call at 1.5x its charge; the same
    layout at 64 tokens has none of its kernel shapes among the rows, and each of its
    calls that only computes is charged 1.5x the microbenchmark's charge of it, so its
    simulated step is 1.5x; without a trace of the op, a call keeps its charge."""
    path, program = programs["pp2"]
    write_traces(tmp_path / "t", path, program, 1.5)
    base = load_profile("cpu")
    traced = traced_profile(base, [TracedRun(tmp_path / "t", path)])
    long = programs["long"][1]
    before, after = charges(long, base), charges(long, traced)
    unrowed = 0
    for task, calls in before.items():
        for (old, key, *_), (new, *_) in zip(calls, after[task]):
            if key is not None and old > 0:
                assert math.isclose(new, 1.5 * old, rel_tol=1e-3), (task, key)
                unrowed += not rows_hold(traced, program, key)
    assert unrowed > 50
    entry = rank_profile(traced, 2)["traced"]
    del entry["op_speed"]["fp32 matmul"]
    unscaled = charges(long, traced)
    assert any(math.isclose(new, old, rel_tol=1e-9) and key[1] == "matmul"
               for task, calls in before.items()
               for (old, key, *_), (new, *_) in zip(calls, unscaled[task]) if key)


def test_calibrate_prints_the_kernel_ops_farthest_from_their_charge_first():
    """`calibrate --from` names the kernel ops whose run most disagrees with the given
    profile (NOTE [traced rows] 5); runtime calls, charged next to nothing, are left out."""
    from ratrain.cli.calibrate import op_speeds
    speeds = {"fp32 add": [0.3, 10], "fp32 matmul": [1.1, 40], "fp32 record_loss": [3e4, 4],
              "bf16 adamw": [0.5, 4], "fp32 rope_bwd": [2.0, 8], "fp32 swiglu": [0.95, 4]}
    line = op_speeds(speeds, most=3)
    assert line.endswith(": fp32 add 0.30x, fp32 rope_bwd 2.00x, fp32 matmul 1.10x, "
                         "and 1 more in the profile's op_speed")


@pytest.mark.mpi
def test_calibrate_from_a_traced_run(programs, tmp_path, capsys):
    """`ratrain run --trace` names its program; `ratrain calibrate --from` finds it there,
    writes a row for every kernel key the run had and the host time of the calls that
    moved data, prints them, and says where they came from."""
    path, program = programs["pp2"]
    run = subprocess.run([sys.executable, "-m", "ratrain.cli", "run", str(path), "--steps", "4",
                          "--trace", str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert main(["calibrate", "--from", str(tmp_path / "t"), "-o", str(tmp_path / "p.json")]) == 0
    profile = json.loads((tmp_path / "p.json").read_text())
    entry = profile["threads"][str(rank_profile(profile, 2)["rank_threads"])] \
        if "threads" in profile else profile
    out = capsys.readouterr().out
    printed = out.split("(median per call): ")[1].splitlines()[0]
    for op, speed in (item.rsplit(" ", 1) for item in printed.split(", and ")[0].split(", ")):
        assert f"{entry['traced']['op_speed'][op][0]:.2f}x" == speed and "fill" not in op
    rows = entry["traced"]["calls"]
    keys = {" ".join(map(str, key)) for calls in charges(program, load_profile("cpu")).values()
            for _, key, *_ in calls if key is not None}
    assert keys - set(rows) <= {k for k in keys if " fill " in k or " copy " in k}
    assert all(seconds > 0 and samples >= 2 for seconds, samples, *_ in rows.values())
    assert entry["traced"]["sources"][0]["programs"] == [str(path.resolve())]
    host = entry["traced"]["call_host"]  # NOTE [traced rows] 7
    assert {"send", "post_recv", "wait_recv"} <= set(host)
    assert all(seconds > 0 for seconds, _ in host.values())
    assert f"send {host['send'][0] * 1e6:.0f} us" in out.split("host time of calls that move "
                                                               "data: ")[1].splitlines()[0]


def test_expected_latest_arrival_against_a_sampled_one():
    """See NOTE [stragglers]: e(D) by quadrature against the mean largest of D normal samples
    (200,000 draws each: standard error under 0.002)."""
    import numpy as np
    from ratrain.sim.costs import expected_largest_normal
    rng = np.random.default_rng(0)
    assert expected_largest_normal(1) == 0.0
    for members in (2, 4, 8, 16):
        sampled = rng.standard_normal((200_000, members)).max(axis=1).mean()
        assert abs(expected_largest_normal(members) - sampled) < 0.01, members


def test_expected_order_statistics_against_sampled_ones():
    """See NOTE [rank spread]. The expected k-th smallest of P normals by quadrature against
    the mean of sorted samples (200,000 draws: standard error under 0.003), symmetric
    about 0, the largest e(P)."""
    import numpy as np
    from ratrain.sim.costs import expected_largest_normal, expected_normal_order
    rng = np.random.default_rng(1)
    assert expected_normal_order(1) == (0.0,)
    for members in (2, 3, 4, 8):
        order = np.array(expected_normal_order(members))
        sampled = np.sort(rng.standard_normal((200_000, members)), axis=1).mean(axis=0)
        assert np.abs(order - sampled).max() < 0.012, members
        assert np.allclose(order, -order[::-1], atol=1e-9)
        assert order[-1] == expected_largest_normal(members)


def test_a_collective_waits_for_its_latest_replica(programs):
    """A traced arrival drift of 100%: each all-reduce of dp 2 posted t seconds after the
    rank's last collective ended starts e(2) x t late, on the stragglers lane the
    summary totals, and the step grows; nothing changes at dp 1."""
    from ratrain.sim.costs import expected_largest_normal
    from ratrain.sim.replay import STRAGGLE_LANE
    from ratrain.sim.report import format_summary
    base = load_profile("cpu")
    drift = base | {"traced": {"calls": {}, "arrival_drift": [1.0, 7]}}
    program = programs["dp2"][1]
    before, after = simulate(program, base), simulate(program, drift)
    late = [i for i in after.replay.intervals[program.rank(0, 0)] if i.lane == STRAGGLE_LANE]
    assert len(late) >= 4
    assert all(i.end - i.start > 0 for i in late)
    first = late[0]  # nothing met before it in the step: t is its post's time
    assert math.isclose(first.end - first.start, expected_largest_normal(2) * first.start,
                        rel_tol=1e-9)
    assert after.step_time > before.step_time and before.replay.straggle(0) == 0.0
    assert "stragglers s" in format_summary(after) and "stragglers" not in format_summary(before)
    pp2 = programs["pp2"][1]
    assert simulate(pp2, drift).step_time == simulate(pp2, base).step_time


def test_the_arrival_drift_is_the_replicas_waits_at_a_steps_first_upd(programs, tmp_path):
    """See NOTE [arrival drift]: at each step's first UPD the replicas waited 4 and 6 ms
    (the typical one 1 ms for the latest) after posting its SYNC about 100 ms after
    their last UPD of the step before: a drift of 1 ms / e(2) / that time, one sample
    per step from step 4 on (step 3 has no step before it in the traced steps); later
    UPDs of a step are no samples."""
    from ratrain.calibrate.from_trace import _drift_samples, drift_samples
    from ratrain.sim.costs import expected_largest_normal
    from ratrain.ir.tasks import Kind
    path, program = programs["dp2"]
    rows = []
    for replica, wait in ((0, 4000.0), (1, 6000.0)):
        rank, now, events = program.rank(0, replica), 0.0, []
        for step in range(1, 7):
            for task in program.tasks[0]:
                waited = wait if task.kind == Kind.UPD else 0.0
                events.append({"name": str(task), "pid": rank, "ts": now, "dur": 1000.0,
                               "args": {"step": step, "calls": [[0, 1, waited, 10.0]]}})
                now += 100_000.0 if task.kind == Kind.SYNC else 1000.0
        rows += _drift_samples(events, program, 2)
    samples = drift_samples(rows, 2)
    assert len(samples) == 4
    elapsed = [e for _, r, _, e in rows if r == 0]
    assert all(math.isclose(s, 1e-3 / expected_largest_normal(2) / e, rel_tol=1e-6)
               for s, e in zip(samples, elapsed))
    assert drift_samples([(k, r, 0.0 if r else w, e) for k, r, w, e in rows], 2) == []


def write_beside_traces(directory, program, charged):
    """Every rank's trace of `program`, 4 steps: B with nothing in flight at 1.0x its
    charge, a BL at 2.0x before any SYNC has posted and at 1.3x beside a posted one."""
    from ratrain.ir.tasks import Kind
    for stage, tasks in program.tasks.items():
        for replica in range(program.options.dp):
            rank, now, events, posted = program.rank(stage, replica), 0.0, [], False
            for step in range(1, 5):
                for task in tasks:
                    posted = (posted or task.kind == Kind.SYNC) and task.kind != Kind.UPD
                    factor = {Kind.B: 1.0, Kind.BL: 1.3 if posted else 2.0}.get(task.kind, 1.0)
                    calls = [[i, 1, 0.0, seconds * factor * 1e6]
                             for i, (seconds, *_) in enumerate(charged[task])]
                    events.append({"name": str(task), "ph": "X", "pid": rank, "tid": 0,
                                   "ts": now, "dur": 1.0, "args": {"step": step, "calls": calls}})
                    now += 1000.0
                posted = False
            (directory / f"trace-rank{rank}.json").write_text(json.dumps({"traceEvents": events}))


def test_the_slowdown_beside_collectives_is_bl_beside_a_post_over_b_alone(programs, tmp_path):
    """See NOTE [traced rows] 6: in dp 2 x 2 micro-batches each step runs B0 with nothing
    in flight (1.0x its charge), then the last micro-batch's layers (BL): the first before
    any SYNC has posted (2.0x, no sample), the others beside a posted all-reduce (1.3x).
    The traced profile holds 1.3 from each rank, and the simulator's node takes it over
    calibrate's probe (a profile without it keeps the probe's); `calibrate --from` prints
    it."""
    from ratrain.cli.calibrate import traced_summary
    from ratrain.hw.topology import node_of
    path, program = programs["dp2"]
    base = load_profile("cpu") | {"node_collectives": {"kernel_slowdown_beside": 1.8}}
    write_beside_traces(tmp_path, program, charges(program, base))
    traced = traced_profile(base, [TracedRun(tmp_path, path)])
    narrowed = rank_profile(traced, program.options.world_size)
    slowdown, ranks = narrowed.traced["kernel_slowdown_beside"]
    assert math.isclose(slowdown, 1.3, rel_tol=1e-3) and ranks == 2
    assert node_of(narrowed).kernel_slowdown == slowdown
    assert node_of(rank_profile(base, program.options.world_size)).kernel_slowdown == 1.8
    assert "kernels beside collectives 1.30x (2 samples)" in traced_summary(narrowed.traced,
                                                                            None)


def test_one_replica_gives_no_slowdown_beside_collectives(programs, tmp_path):
    """NOTE [traced rows] 6: pp 2 of one replica posts SYNCs that move nothing; its BLs
    after them, run 1.3x, are no sample of kernels beside a collective, and a profile
    calibrated from it keeps the probe's slowdown, and `calibrate --from` says so."""
    from ratrain.cli.calibrate import traced_summary
    path, program = programs["pp2"]
    base = load_profile("cpu") | {"node_collectives": {"kernel_slowdown_beside": 1.8}}
    charged = charges(program, base)
    assert any(task.kind.name == "SYNC" for task in charged)
    write_beside_traces(tmp_path, program, charged)
    traced = traced_profile(base, [TracedRun(tmp_path, path)])
    narrowed = rank_profile(traced, program.options.world_size)
    assert "kernel_slowdown_beside" not in narrowed.traced and narrowed.traced["calls"]
    assert "no slowdown of kernels beside collectives (no traced rank of DP replicas ran " \
        "backwards both beside a posted collective and alone): the given profile's stands" \
        in traced_summary(narrowed.traced, None)
