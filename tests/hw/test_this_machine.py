"""See NOTE [this machine's profile]: where no --hw is given, ratrain uses a profile of this
machine, cached per CPU model and core count and made on first use by a quick
calibration; the shipped cpu profile is a labelled fallback. The CPU identity and the
quick probe are faked here, so these tests read the same numbers on every machine (the
rest of the suite pins the shipped profile: tests/conftest.py)."""
import json

import pytest

from ratrain.calibrate.cases import GEMM_FORMATS, quick_cases
from ratrain.calibrate.this_machine import default_hw
from ratrain.cli import main
from ratrain.cluster.scaling import link_source, scaled_link
from ratrain.hw import load_profile
from ratrain.hw.identity import SHIPPED_LABEL, profile_label

GFLOPS = {1: 50e9, 2: 95e9, 4: 180e9}            # the fake CPU's fp32 GEMM peak per threads per rank


def fake_run(ranks: int, threads: int) -> dict:
    """A quick probe's result: bf16 twice and fp16 the fp32 rate, 20 GB/s per thread."""
    rate = GFLOPS[threads]
    gemms = [{"op": "matmul", "precision": p, "flops": 1e9, "bytes": 1,
              "seconds": 1e9 / (rate * factor)}
             for p, factor in (("fp32", 1), ("bf16", 2), ("fp16", 1))]
    adds = [{"op": "add", "precision": "fp32", "flops": n, "bytes": 12 * n,
             "seconds": 12 * n / (20e9 * threads)} for n in (1 << 20, 1 << 22)]
    return {"ranks": ranks, "threads": threads, "kernels": gemms + adds, "ping_pong": []}


@pytest.fixture
def fake_cpu(monkeypatch, tmp_path):
    """An empty cache, no pinned profile, a 4-core "Fake CPU 9000" whose quick probe
    returns fake_run; the probes run are listed in the fixture's value."""
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RATRAIN_DEFAULT_HW", raising=False)
    monkeypatch.setattr("ratrain.hw.identity.model_name", lambda: "Fake CPU 9000")
    monkeypatch.setattr("ratrain.hw.identity.core_count", lambda: 4)
    probes = []

    def probe(ranks, threads, quick=False):
        assert quick
        probes.append((ranks, threads))
        return fake_run(ranks, threads)
    monkeypatch.setattr("ratrain.calibrate.quick.run_probe", probe)
    return probes


def test_first_use_measures_quickly_once_and_caches_per_cpu(fake_cpu, tmp_path, monkeypatch):
    lines = []
    hw = default_hw(lines.append)
    assert hw == str(tmp_path / "cache" / "profiles" / "fake-cpu-9000-4-cores.json")
    assert fake_cpu == [(1, 4), (2, 2), (4, 1)]  # 1, 2 and 4 threads, in ranks filling 4 cores
    assert "quick calibration" in lines[0] and lines[-1].startswith(f"wrote {hw} in ")
    profile, shipped = load_profile(hw), load_profile("cpu")
    assert (profile["calibration"], profile["cpu_model"], profile["node_cores"]) == \
        ("quick", "Fake CPU 9000", 4)
    assert sorted(profile["threads"], key=int) == ["1", "2", "4"]
    one = profile["threads"]["1"]
    assert (one["fp32_flops"], one["bf16_flops"], one["fp16_flops"]) == (50e9, 100e9, 50e9)
    assert one["ddr_bandwidth"] == pytest.approx(20e9, rel=1e-3)
    assert one["op_costs"] == shipped["threads"]["1"]["op_costs"]  # the shipped fields stay
    assert "op_costs" not in profile["threads"]["4"]  # no rates of a count not measured here
    assert (profile["fp32_flops"], profile["link_bandwidth"]) == \
        (180e9, shipped["link_bandwidth"])
    assert profile_label(profile, hw) == \
        "this machine's profile (quick calibration, Fake CPU 9000, 4 cores)"
    assert default_hw(lines.append) == hw and len(fake_cpu) == 3  # cached: not measured again
    monkeypatch.setattr("ratrain.hw.identity.core_count", lambda: 1)
    monkeypatch.setitem(GFLOPS, 1, 40e9)
    other = default_hw(lines.append)  # another core count: another profile
    assert other.endswith("fake-cpu-9000-1-cores.json") and fake_cpu[3:] == [(1, 1)]
    assert profile_label(profile, hw) == \
        "another machine's profile (quick calibration, Fake CPU 9000, 4 cores)"


def test_the_setting_pins_a_profile_and_cpu_names_the_shipped_one(fake_cpu, monkeypatch):
    monkeypatch.setenv("RATRAIN_DEFAULT_HW", "cpu")
    assert default_hw() == "cpu" and fake_cpu == []
    assert profile_label(load_profile("cpu"), "cpu") == SHIPPED_LABEL
    assert profile_label(load_profile("mt3000"), "mt3000") == "the mt3000 profile"


def test_a_failed_quick_pass_falls_back_to_the_shipped_profile(fake_cpu, monkeypatch):
    def broken(ranks, threads, quick=False):
        raise RuntimeError("the calibration probe (4 ranks x 1 thread) failed")
    monkeypatch.setattr("ratrain.calibrate.quick.run_probe", broken)
    lines = []
    assert default_hw(lines.append) == "cpu"
    assert lines[-1].startswith("ratrain: note: the quick calibration failed (the "
                                "calibration probe") and lines[-1].endswith(SHIPPED_LABEL)


def test_mfu_plan_and_the_link_scaling_read_this_machines_profile(fake_cpu, tmp_path,
                                                                   capsys):
    """MFU's peak (program.json "flops"), compile's and plan's defaults and the test
    cluster's link all read the quick profile, and say so."""
    out = tmp_path / "p"
    assert main(["compile", "tiny", "--seq-len", "32", "--pp", "2", "--micro-batches", "2",
                 "-o", str(out)]) == 0
    label = "this machine's profile (quick calibration, Fake CPU 9000, 4 cores)"
    assert f"fp32 on {label}: peak" in capsys.readouterr().out
    flops = json.loads((out / "program.json").read_text())["flops"]
    assert (flops["peak"], flops["peak_of"]) == (2 * 95e9, label)  # 2 ranks x 2 threads
    bandwidth, latency = scaled_link()
    assert bandwidth == pytest.approx(3.7e9 * 50e9 / (0.70 * 8.1e12))
    assert link_source() == f"scaled from {label}"
    assert main(["plan", "tiny", "--clusters", "2", "--global-batch", "4", "--seq-len", "32",
                 "--top", "1", "--simulate", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"profile: {label}")


def test_quick_cases_are_the_largest_gemm_per_format_and_two_adds():
    cases = quick_cases()
    assert [(c.op, c.precision) for c in cases] == \
        [("matmul", p) for p in GEMM_FORMATS] + [("add", "fp32")] * 2
    assert len({c.shape for c in cases[:3]}) == 1


def test_calibrate_writes_this_machines_cached_profile_not_the_shipped_one(fake_cpu,
                                                                           monkeypatch,
                                                                           capsys):
    measured = load_profile("cpu") | {"calibration": "full", "cpu_model": "Fake CPU 9000",
                                      "node_cores": 4}
    monkeypatch.setattr("ratrain.calibrate.calibrate", lambda progress, evict: measured)
    assert main(["calibrate"]) == 0
    hw = default_hw()
    assert f"wrote {hw} in " in capsys.readouterr().out and fake_cpu == []
    assert profile_label(load_profile(hw), hw) == \
        "this machine's profile (calibrated, Fake CPU 9000, 4 cores)"
    assert load_profile("cpu").get("cpu_model") is None  # the shipped file is untouched
    assert main(["calibrate", "--from", "trace"]) == 2
    assert "give -o FILE" in capsys.readouterr().err
