"""Which machine a profile describes: this CPU's identity (model name and cores), the file
its profile is cached in, and the label every output that uses a profile names it by
(NOTE [this machine's profile]). Choosing and making the profile is
calibrate/this_machine.py's; this module only reads the machine and the profile.
"""
from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ratrain.hw.profiles import PROFILE_DIR, Profile
from ratrain.settings import cache_root

SHIPPED = "cpu"                         # the shipped cpu.json's name: the labelled fallback
SHIPPED_LABEL = "the shipped cpu profile (measured on another machine)"


@dataclass(frozen=True)
class Cpu:
    model: str                          # /proc/cpuinfo's model name (platform's without it)
    cores: int                          # os.cpu_count(): the cores the runtime shares out


def this_cpu() -> Cpu:
    """This machine's CPU model and core count (tests fake model_name and core_count)."""
    return Cpu(model_name(), core_count())


def core_count() -> int:
    return os.cpu_count() or 1


def model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cached_profile_path(cpu: Cpu) -> Path:
    """Where this CPU's profile is cached: $RATRAIN_CACHE/profiles/<model>-<N>-cores.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu.model.lower()).strip("-") or "cpu"
    return cache_root() / "profiles" / f"{slug}-{cpu.cores}-cores.json"


def is_shipped(identity: str | None) -> bool:
    """Whether a profile named `identity` (a --hw name or a path) is the shipped cpu.json."""
    if identity is None:
        return False
    path = Path(identity)
    return identity == SHIPPED or (path.suffix == ".json" and path.is_file()
                                   and path.resolve() == (PROFILE_DIR / "cpu.json").resolve())


def profile_label(profile: Profile | Mapping, identity: str | None = None) -> str:
    """What a profile is, for the outputs that use it: `this machine's profile (quick
    calibration, <CPU model>, N cores)`, `the shipped cpu profile (measured on another
    machine)`, `the mt3000 profile`; `identity` is the --hw name or path it was read by."""
    if is_shipped(identity):
        return SHIPPED_LABEL
    profile = Profile.of(profile)
    if profile.cpu_model is None:
        where = f" ({identity})" if identity and identity != profile.name else ""
        return f"the {profile.name} profile{where}"
    cores = int(profile.cores if profile.node_cores is None else profile.node_cores)
    whose = "this machine's" if Cpu(profile.cpu_model, cores) == this_cpu() \
        else "another machine's"
    how = "quick calibration" if profile.calibration == "quick" else "calibrated"
    return f"{whose} profile ({how}, {profile.cpu_model}, {cores} cores)"
