"""The quick calibration (NOTE [this machine's profile], calibrate/this_machine.py): a few
seconds that measure what another machine's profile cannot know about this one, its GEMM
peaks (fp32, bf16, fp16) and DDR bandwidth at the threads per rank the runtime uses, laid
over the shipped cpu profile's other fields and marked `"calibration": "quick"`.

`quick_profile(base, runs, machine)` is pure (the tests feed it made-up times);
`measure_quick(progress)` runs the probes. `ratrain calibrate` measures everything.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from ratrain.calibrate.profile import (ddr_bandwidth_of, gemm_rate, machine_facts, rounded,
                                       run_probe)
from ratrain.hw.profiles import Profile

FORMATS = ("fp32", "bf16", "fp16")      # the GEMM peaks measured (cases.quick_cases)


def measured_rates(run: dict) -> dict:
    """The `<format>_flops` peaks and `ddr_bandwidth` of one quick probe run."""
    kernels = run["kernels"]
    peaks = {f"{p}_flops": rate for p in FORMATS
             if (rate := gemm_rate(kernels, p)) is not None}
    return peaks | {"ddr_bandwidth": ddr_bandwidth_of(kernels)}


def quick_profile(base: dict, runs: list[dict], machine: dict) -> dict:
    """`base` (the shipped cpu profile) with the rates of the quick probe `runs` (one per
    thread count; the top level takes the one of the most threads, as calibrate's) and
    this machine's facts (`machine_facts`: CPU model, cores, memory, caches). Of base's
    `threads` entries only the counts measured here stay, each with these rates over its
    other fields (NOTE [this machine's profile])."""
    table = Profile.of(base).threads
    threads = {str(r["threads"]): table.get(str(r["threads"]), {}) | measured_rates(r)
               for r in sorted(runs, key=lambda r: r["threads"])}
    whole = measured_rates(max(runs, key=lambda r: r["threads"]))
    cores = machine["node_cores"]
    return rounded(base | whole | {
        "description": f"this machine ({machine['cpu_model']}, {cores} cores), quick "
        "calibration: its GEMM peaks and DDR bandwidth over the shipped cpu profile",
        "calibration": "quick", "cpu_model": machine["cpu_model"],
        "fp16_flops": whole.get("fp16_flops", whole["fp32_flops"] / 2),
        "cores": cores, "node_cores": cores, "usable_memory": machine["memory_bytes"] // cores,
        "gsm_bytes": machine["last_level_cache"], "am_bytes": machine["l1_data_cache"],
        "sm_bytes": machine["l1_data_cache"], "threads": threads,
        "sources": Profile.of(base).sources | _sources(sorted(threads, key=int))})


def _sources(counts: list[str]) -> dict:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    return {
        "all": f"quick calibration by ratrain on {stamp} (1-minute load average "
               f"{os.getloadavg()[0]:.2f} at the end; calibrate/quick.py): fp32_flops, "
               "bf16_flops, fp16_flops and ddr_bandwidth measured here at "
               f"{' and '.join(counts)} threads per rank, every rank at once; every other "
               "field (op_costs, the link, the node) is the shipped cpu profile's, measured "
               "on another machine: `ratrain calibrate` measures them here",
        "fp32_flops": "the quick pass's largest fp32 forward GEMM (cases.quick_cases)",
        "bf16_flops": "the quick pass's largest bf16 forward GEMM",
        "fp16_flops": "the quick pass's largest fp16 forward GEMM",
        "ddr_bandwidth": "byte rate fitted to out = a + b over 12 and 48 MiB of arrays",
        "usable_memory": "total memory / node_cores", "gsm_bytes": "last-level cache",
        "am_bytes": "L1 data cache of a core", "sm_bytes": "L1 data cache of a core",
    }


def thread_counts(cores: int) -> list[int]:
    """Threads per rank the quick pass measures: 1, the powers of two below `cores`, and
    `cores` (see NOTE [this machine's profile]: the runtime gives each rank cores // ranks)."""
    return sorted({1, cores} | {1 << k for k in range(cores.bit_length()) if 1 << k < cores})


def measure_quick(progress: Callable[[str], None], cores: int) -> list[dict]:
    """The quick probe at each of thread_counts(cores), its ranks filling the cores and
    all running at once, a progress line each."""
    runs = []
    for ranks, threads in sorted((cores // t, t) for t in thread_counts(cores)):
        started = time.perf_counter()
        runs.append(run_probe(ranks, threads, quick=True))
        rates = measured_rates(runs[-1])
        peaks = ", ".join(f"{rates[f'{p}_flops'] / 1e9:.1f} {p}" for p in FORMATS
                          if f"{p}_flops" in rates)
        progress(f"  {ranks} rank{'s' * (ranks > 1)} x {threads} thread{'s' * (threads > 1)}"
                 f": GEMM {peaks} GFLOP/s, DDR {rates['ddr_bandwidth'] / 1e9:.1f} GB/s "
                 f"({time.perf_counter() - started:.1f} s)")
    return runs


def calibrate_quick(base: dict, progress: Callable[[str], None]) -> dict:
    """This machine's quick profile over `base` (the shipped cpu profile)."""
    machine = machine_facts()
    return quick_profile(base, measure_quick(progress, machine["node_cores"]), machine)
