"""Run the probes and turn their times into a hardware profile (ratrain/hw/profiles.py).

`build_profile(runs, machine)` is pure (the tests feed it made-up times);
`calibrate(progress)` launches the probes and measures the machine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

from ratrain.calibrate.fit import fit_link, fit_op
from ratrain.calibrate.node_fit import node_fields
from ratrain.hw.identity import this_cpu
from ratrain.rt.launch import find_mpiexec, rank_python
from ratrain.sim.kernels import fitted_seconds

PRECISION = "fp32"                      # what every case runs in (the cpu profile's default);
                                        # the GEMMs also in bf16 and fp16 (NOTE [16-bit GEMM
                                        # cases], cases.py)
BUSY_LOAD = 0.5                         # 1-minute load average above which times are noisy
ALIASES = {"matmul_bias": "matmul", "matmul_bias_bwd": "matmul_bwd"}  # same GEMMs + a bias


def _fits(kernels: list[dict], seconds: str = "seconds") -> tuple[dict, dict]:
    """precision -> op -> fitted cost, and `op` or `op precision` (16-bit) -> largest
    relative error of the fit over its shapes, of the rows' `seconds` field (seconds_cold:
    NOTE [cache residency])."""
    by_op = defaultdict(list)
    for row in kernels:
        by_op[row.get("precision", PRECISION), row["op"]].append(row)
    costs, errors = defaultdict(dict), {}
    for (precision, op), rows in by_op.items():
        fitted = fit_op(*([r[k] for r in rows] for k in ("flops", "bytes", seconds)))
        errors[op if precision == PRECISION else f"{op} {precision}"] = round(max(
            abs(fitted_seconds(fitted, r["flops"], r["bytes"]) / r[seconds] - 1)
            for r in rows), 3)
        costs[precision][op] = fitted | {"measured": [  # NOTE [cases by shape], sim/kernels.py
            [r["flops"], r["bytes"], r[seconds], r["shape"]] for r in rows]}
    for per_op in costs.values():
        per_op.update({alias: per_op[op] for alias, op in ALIASES.items() if op in per_op})
    return dict(costs), errors


def gemm_rate(kernels: list[dict], precision: str = PRECISION) -> float | None:
    """The best FLOP rate of any forward GEMM measured in `precision` (None: none was)."""
    return max((r["flops"] / r["seconds"] for r in kernels
                if r["op"] == "matmul" and r.get("precision", PRECISION) == precision),
               default=None)


def ddr_bandwidth_of(kernels: list[dict]) -> float:
    """Bytes per second of the streaming adds, a fixed call time aside."""
    adds = [r for r in kernels if r["op"] == "add"]
    fitted = fit_op([0] * len(adds), [r["bytes"] for r in adds], [r["seconds"] for r in adds])
    return fitted.get("byte_rate") or sum(r["bytes"] for r in adds) / sum(r["seconds"] for r in adds)


def _per_threads(run: dict) -> tuple[dict, dict]:
    costs, errors = _fits(run["kernels"])
    fields = {"fp32_flops": gemm_rate(run["kernels"]),
              "ddr_bandwidth": ddr_bandwidth_of(run["kernels"]), "op_costs": costs}
    fields |= {f"{p}_flops": rate for p in ("bf16", "fp16")
               if (rate := gemm_rate(run["kernels"], p)) is not None}
    if all("seconds_cold" in r for r in run["kernels"]) and run.get("cache_bytes"):
        fields["op_costs_cold"] = _fits(run["kernels"], "seconds_cold")[0]
        fields["cache_bytes"] = run["cache_bytes"]
    return fields, errors


def rounded(value):
    """Floats to 4 significant digits (the times do not carry more), through containers."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def build_profile(runs: list[dict], machine: dict, evict: bool = False) -> dict:
    """The profile of probe results `runs` (one per thread count; the one with several
    ranks carries the ping-pong) on `machine` (node_cores, memory and cache sizes);
    `evict`: whether the probes swept the caches before each call."""
    threads, errors = {}, {}
    for run in sorted(runs, key=lambda r: r["threads"]):
        threads[str(run["threads"])], errors[str(run["threads"])] = _per_threads(run)
    pings = next((r["ping_pong"] for r in runs if r.get("ping_pong")), None)
    if not pings:
        raise ValueError("no ping-pong between two ranks among the probe results")
    latency, bandwidth = fit_link(tuple(pings[0]), tuple(pings[-1]))
    cores = machine["node_cores"]
    whole = threads[str(max(map(int, threads)))]
    node = next((node_fields(r["node"], r["ranks"]) for r in runs if r.get("node")), {})
    return rounded({
        "name": "cpu", "description": f"this machine: {cores} cores, one MPI rank per core "
        "or one rank on all of them, measured by `ratrain calibrate`",
        "calibrated": True, "calibration": "full",
        **({"cpu_model": machine["cpu_model"]} if "cpu_model" in machine else {}),
        "fp16_flops": whole.get("fp16_flops", whole["fp32_flops"] / 2),
        **({"bf16_flops": whole["bf16_flops"]} if "bf16_flops" in whole else {}),
        "fp32_flops": whole["fp32_flops"], "gemm_efficiency": 1.0,
        "ddr_bandwidth": whole["ddr_bandwidth"], "link_bandwidth": bandwidth,
        "link_latency": latency, "usable_memory": machine["memory_bytes"] // cores,
        "gsm_bytes": machine["last_level_cache"], "am_bytes": machine["l1_data_cache"],
        "sm_bytes": machine["l1_data_cache"], "cores": cores, "node_cores": cores,
        "default_precision": "fp32", "default_zero": 0, "threads": threads, **node,
        "sources": _sources(runs, pings, errors, evict) | (_NODE_SOURCES if node else {}),
    })


_NODE_SOURCES = {
    "node_collectives": "all-reduce, reduce-scatter and all-gather of 4 and 32 MB per rank, "
                        "every rank at once in groups of all and of half the ranks "
                        "[op, members, groups, bytes, s], and a GEMM loop's slowdown while "
                        "all-reduces stream beside it (calibrate/node_probe.py)",
    "node_memory_bandwidth": "ranks x each one's bytes per second in those reduce-scatters "
                             "and all-gathers x memory traffic per byte (3 and 2, NOTE "
                             "[node memory], hw/topology.py)",
    "collective_progress_share": "all-reduce bytes per second finished while every rank ran "
                                 "GEMMs, over their rate waited for alone (NOTE [manual "
                                 "progress], sim/engine.py)",
}


def _sources(runs: list[dict], pings, errors: dict, evict: bool) -> dict:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    return {
        "all": f"measured by `ratrain calibrate` on {stamp} (1-minute load average "
               f"{os.getloadavg()[0]:.2f} at the end); the top-level rates are those of one "
               "rank running all node_cores threads",
        "threads": "per threads of a rank (the simulator picks node_cores // ranks, as the "
                   "runtime sizes OMP_NUM_THREADS): op_costs, op_costs_cold, cache_bytes, "
                   "fp32_flops, bf16_flops, fp16_flops, ddr_bandwidth",
        "op_costs_cold": "as op_costs, every call after a sweep of the last-level cache; "
                         "the simulator charges a kernel call between op_costs and these by "
                         "the share of its operands out of cache_bytes (NOTE [cache "
                         "residency], sim/residency.py)",
        "cache_bytes": "working set a rank keeps in the caches, all ranks copying at once "
                       "(NOTE [cache share], calibrate/probe.py)",
        "op_costs": "per precision (fp32; the GEMMs also bf16 and fp16, NOTE [16-bit GEMM "
                    "cases]), per op: the median seconds `measured` for each case [FLOPs, "
                    "bytes, s] "
                    "(native kernels on the shapes of the tiny and small models, "
                    "ratrain/calibrate/cases.py, and the runtime's own AdamW, prefetch and "
                    "all-reduce finish, all ranks running at once, "
                    + ("each call after streaming last-level-cache bytes through the caches, "
                       "so operands come from DDR (--evict)" if evict else
                       "kernel calls back to back, so operands are warm in the caches as in a "
                       "step of a model whose layers fit in them, the runtime calls and adds "
                       "after streaming last-level-cache bytes through the caches (NOTE "
                       "[warm operands])")
                    + "; FLOPs and bytes as the simulator counts them), and for other shapes "
                    "the fit seconds + FLOPs / "
                    "flop_rate + bytes / byte_rate (non-negative least squares on relative "
                    "error)",
        "fit_error": errors,
        "fp32_flops": "best measured forward GEMM rate (so gemm_efficiency is 1)",
        "bf16_flops": "best measured bf16 forward GEMM rate",
        "fp16_flops": "best measured fp16 forward GEMM rate (half the FP32 rate where the "
                      "probes timed no fp16 GEMM)",
        "ddr_bandwidth": "byte rate fitted to out = a + b over 256 KiB to 16 MiB arrays",
        "link_latency": f"one-way ping-pong time of {pings[0][0]} B between two ranks "
                        "(mpi4py Send/Recv through mpiexec), less its bytes at bandwidth",
        "link_bandwidth": f"from the one-way times of {pings[0][0]} and {pings[-1][0]} B "
                          f"messages; measured {[[n, round(t * 1e6, 2)] for n, t in pings]} "
                          "[bytes, us]",
        "usable_memory": "total memory / node_cores", "gsm_bytes": "last-level cache",
        "am_bytes": "L1 data cache of a core", "sm_bytes": "L1 data cache of a core",
    }


def profile_text(profile: dict) -> str:
    """Indented JSON with every list of numbers on one line (a measured case per line)."""
    text = json.dumps(profile, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: f"[{' '.join(m.group(1).split())}]",
                  text) + "\n"


def write_profile(profile: dict, path: Path) -> None:
    """Atomically, so a `--hw` reader never sees half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(profile_text(profile))
    os.replace(partial, path)


# ---- measuring -------------------------------------------------------------------------

def cache_bytes(level: int, kind: str = "Data") -> int | None:
    """Size of a cache level of cpu0 from sysfs (kind: Data, Unified), None if unknown."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if int((index / "level").read_text()) == level and \
                    (index / "type").read_text().strip() in (kind, "Unified"):
                return _size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def machine_facts() -> dict:
    cpu = this_cpu()
    return {"node_cores": cpu.cores, "cpu_model": cpu.model,
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "last_level_cache": cache_bytes(3) or cache_bytes(2) or 1 << 20,
            "l1_data_cache": cache_bytes(1) or 32 << 10}


def run_probe(ranks: int, threads: int, ops: str | None = None, evict: int = 0,
              evict_kernels: bool = False, node: bool = False, quick: bool = False) -> dict:
    """`mpiexec -n ranks python -m ratrain.calibrate.probe` with `threads` per rank."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "probe.json"
        command = [find_mpiexec(), "-n", str(ranks), *rank_python("ratrain.calibrate.probe"),
                   str(out), "--threads", str(threads),
                   "--evict", str(evict)]
        command += (["--ops", ops] if ops else []) + ["--evict-kernels"] * evict_kernels \
            + ["--node"] * node + ["--quick"] * quick
        done = subprocess.run(command, env=env)
        if done.returncode or not out.is_file():
            raise RuntimeError(f"the calibration probe ({ranks} ranks x {threads} threads) "
                               f"failed with exit code {done.returncode}")
        return json.loads(out.read_text())


# NOTE [warm operands]: calibrate used to sweep the last-level cache before every timed
# call, assuming every kernel's operands come from DDR. On the models this machine trains a
# layer's weights and a micro-batch's activations fit in the 32 MB cache, so a step's
# kernels find them there: with swept caches the profile predicted PP=2 and DP=2 steps of
# the tiny model on 2 ranks x 1 thread 15-18% too long, with warm kernels +1.9% and -0.2%
# against the same runs. The calls that walk the whole model's state (AdamW, prefetch,
# all-reduce finish) and the DDR adds stay swept: a model's optimizer state does not fit,
# and timing them warm too put the DP=2 step 18% short. `--evict` sweeps before the
# kernels too. Since NOTE [cache residency] (sim/residency.py) the probes time each kernel
# both ways and the simulator picks per call; `--evict` then charges every call cold.

# NOTE [sweep share]: a cold timing streams bytes through the caches first (probe.Evictor),
# and the ranks of a probe stream them at the same time (a barrier before each case, then
# the same calls), through one last-level cache. Together they need to stream it once to
# leave every operand cold, so each streams twice its share of it, at most all of it:
# last_level_cache x min(ranks, 2) / ranks. On 2 cores that is the whole cache per rank, as
# before. A probe sweeps about 4,900 times (counted on 2 ranks here); on a 16-core node
# whose 300 MiB cache every rank swept whole, that was 5 GB through the node's memory
# per sweep (56-86 GB/s measured there, so about 60-90 ms each), and calibrate took 429 s
# where node16.sh allows 300; with the shares it took 146 s on a machine of the same kind.
def sweep_bytes(last_level_cache: int, ranks: int) -> int:
    """Bytes each of `ranks` ranks sweeping at once streams before a cold call (NOTE
    [sweep share])."""
    return last_level_cache * min(ranks, 2) // max(1, ranks)


def calibrate(progress: Callable[[str], None] = print, evict: bool = False) -> dict:
    """Measure this machine (about 1.5 minutes on 2 cores) and return its profile;
    `evict`: sweep the last-level cache before every timed call (NOTE [warm operands])."""
    machine = machine_facts()
    cores, runs = machine["node_cores"], []
    for ranks, threads in sorted({(max(cores, 2), 1), (1, cores)}):
        progress(f"measuring {ranks} rank{'s' * (ranks > 1)} x {threads} "
                 f"thread{'s' * (threads > 1)}:")
        runs.append(run_probe(ranks, threads,
                              evict=sweep_bytes(machine["last_level_cache"], ranks),
                              evict_kernels=evict, node=ranks > 1))
    return build_profile(runs, machine, evict)
