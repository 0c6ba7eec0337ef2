"""`ratrain calibrate [-o FILE]`: measure this machine into a hardware profile (DESIGN 7).

Times the native kernels, DDR bandwidth and MPI messages at the thread counts the runtime
uses (ratrain/calibrate) and writes a profile that `ratrain compile --hw FILE` and
`ratrain simulate --hw FILE` read; by default the built-in `cpu` profile.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from ratrain.errors import UserError
from ratrain.hw.profiles import PROFILE_DIR

BUSY_LOAD = 0.5                         # 1-minute load average above which times are noisy


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


def cmd_calibrate(args) -> None:
    from ratrain.calibrate import calibrate
    from ratrain.hw import load_profile
    out = Path(args.output)
    if out.suffix != ".json":
        raise UserError(f"-o {out}: a profile is a .json file")
    load = os.getloadavg()[0]
    print(f"calibrating this machine (1-minute load average {load:.2f}"
          + (": other processes make the times slower and noisier)" if load > BUSY_LOAD
             else ")"), flush=True)
    started = time.perf_counter()
    try:
        profile = calibrate(lambda line: print(line, flush=True), evict=args.evict)
    except (RuntimeError, ValueError) as e:
        raise UserError(str(e)) from None
    write_profile(profile, out)
    load_profile(out)
    print(summary(profile, out, time.perf_counter() - started))


def summary(profile: dict, path: Path, seconds: float) -> str:
    lines = [f"wrote {path} in {seconds:.0f} s: link {profile['link_latency'] * 1e6:.2f} us + "
             f"{profile['link_bandwidth'] / 1e9:.2f} GB/s"]
    for threads, fields in sorted(profile["threads"].items(), key=lambda kv: int(kv[0])):
        sixteen = "".join(f" ({p} {fields[f'{p}_flops'] / 1e9:.1f})" for p in ("bf16", "fp16")
                          if f"{p}_flops" in fields)
        lines.append(f"  {threads} thread{'s' * (threads != '1')} per rank: GEMM up to "
                     f"{fields['fp32_flops'] / 1e9:.1f}{sixteen} GFLOP/s, DDR "
                     f"{fields['ddr_bandwidth'] / 1e9:.1f} GB/s")
    return "\n".join(lines)


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine into a hardware profile",
                       description="Time the native kernels (GEMM in its three layouts, "
                       "attention, norms, RoPE, SwiGLU, embedding, cross-entropy, AdamW) on "
                       "model-sized shapes, with warm and with swept caches, the cache share "
                       "of a rank, DDR bandwidth and MPI latency and bandwidth between two "
                       "ranks, at the threads per rank the runtime uses, and write a profile "
                       "for `--hw`. Takes about 1.5 minutes on 2 cores and 2.5 on 16; run it "
                       "on an idle machine.")
    p.add_argument("-o", "--output", default=str(PROFILE_DIR / "cpu.json"), metavar="FILE",
                   help="profile to write (default: the built-in `cpu` profile, "
                   f"{PROFILE_DIR / 'cpu.json'})")
    p.add_argument("--evict", action="store_true", help="time every kernel call after a "
                   "sweep of the last-level cache only, so the simulator charges every call "
                   "as if its operands came from DDR (default: each kernel timed back to "
                   "back and swept, and the simulator charges a call between the two by how "
                   "much of its operands the rank's cache share still holds; the optimizer "
                   "and other calls over the whole model's state are always swept)")
    p.set_defaults(func=cmd_calibrate)
