"""The profile that stands for this machine where no --hw names one: the one function every
default goes through (`default_hw`: `ratrain train`'s program and MFU, `plan` and `compile`
without --hw or a machine file's profile, the test cluster's link scaling), and the quick
calibration that makes it on first use (calibrate/quick.py).
"""
from __future__ import annotations

import os
import sys
import time

from ratrain.calibrate.profile import BUSY_LOAD, write_profile
from ratrain.calibrate.quick import calibrate_quick
from ratrain.hw.identity import SHIPPED, SHIPPED_LABEL, cached_profile_path, this_cpu
from ratrain.hw.profiles import ProfileError, load_profile
from ratrain.settings import default_hw_setting

# NOTE [this machine's profile]: the shipped cpu.json was calibrated on another machine;
# taken as this one's, it put the 58M LLaMA's MFU at 137% on an AMD Zen 5 (the peak was
# the other CPU's) and shaped the test cluster's links from the other CPU's rate. So where
# no --hw is given, a profile of this machine is used:
#   1. $RATRAIN_DEFAULT_HW, a name or a path, if set (the tests pin the shipped `cpu`, so
#      they read the same numbers on every machine);
#   2. else the profile cached for this CPU model and core count
#      ($RATRAIN_CACHE/profiles/<model>-<N>-cores.json), which `ratrain calibrate` writes
#      by default (every field measured here);
#   3. else a quick calibration of a few seconds, made now and cached there: the GEMM
#      peaks (fp32, bf16, fp16) and DDR bandwidth at 1, each power of two below N and N
#      threads per rank (N // threads ranks, all at once: `ratrain train`'s layouts give
#      a rank cores // ranks threads, 2 of them on 16 cores), over the shipped profile's
#      other fields (the per-kernel costs, the link, the node), marked "calibration":
#      "quick". Only the thread counts measured keep their entries: another machine's
#      rates at a count not measured here would be taken for this machine's (a count in
#      between reads the nearest measured below, sim/simulate.rank_profile);
#   4. if that fails (no mpiexec), the shipped profile, with a note saying so.
# `--hw cpu` still names the shipped profile. Every output that uses a profile names it
# (hw/identity.profile_label): "this machine's profile (quick calibration, <model>, N
# cores)" or "the shipped cpu profile (measured on another machine)".


def note(line: str) -> None:
    """Progress of the quick calibration, on stderr (stdout may be `plan --json`)."""
    print(line, file=sys.stderr, flush=True)


def default_hw(progress=note) -> str:
    """The --hw name or path that stands for this machine (NOTE [this machine's
    profile]), made by the quick calibration the first time."""
    pinned = default_hw_setting()
    if pinned:
        return pinned
    path = cached_profile_path(this_cpu())
    if path.is_file():
        return str(path)
    try:
        write_quick_profile(path, progress)
    except (RuntimeError, OSError, ValueError, ProfileError) as e:
        progress(f"ratrain: note: the quick calibration failed ({e}); using "
                 f"{SHIPPED_LABEL}")
        return SHIPPED
    return str(path)


def write_quick_profile(path, progress) -> None:
    """Measure this machine quickly and write its profile to `path` (calibrate/quick.py)."""
    cpu = this_cpu()
    load = os.getloadavg()[0]
    progress(f"measuring this machine once ({cpu.model}, {cpu.cores} cores; 1-minute load "
             f"average {load:.2f}): a quick calibration of its GEMM peaks and memory "
             "bandwidth, for MFU and the cost model (`ratrain calibrate` measures it in "
             "full)")
    started = time.perf_counter()
    profile = calibrate_quick(load_profile(SHIPPED), progress)
    write_profile(profile, path)
    load_profile(path)
    busy = os.getloadavg()[0] > BUSY_LOAD
    progress(f"wrote {path} in {time.perf_counter() - started:.1f} s"
             + ("; other processes were running, so the peaks may read low and MFU high: "
                "`ratrain calibrate` on an idle machine measures it again" if busy else ""))
