"""Hardware profiles: what one rank's device and links can do, loaded from JSON.

A profile is a JSON file (`ratrain/hw/<name>.json`, or any path), all fields per rank
(one MPI rank drives one MT-3000 cluster, or one CPU process); its fields, units and
readers are the table of docs/DESIGN.md section 7.1, their one list. The compiler reads
`usable_memory` as the default --budget; the one cost model (ratrain/sim/costs.py) turns
tasks and calls into seconds on it for `ratrain compile --report`, the pictures, the
planner and the simulator. This module imports nothing else of ratrain.
"""
from __future__ import annotations

import json
from pathlib import Path

PROFILE_DIR = Path(__file__).parent
NUMBER_FIELDS = ("fp16_flops", "fp32_flops", "gemm_efficiency", "ddr_bandwidth",
                 "link_bandwidth", "link_latency", "usable_memory", "gsm_bytes", "am_bytes",
                 "cores")
ALGORITHMS = ("ring", "tree", "auto")


class ProfileError(ValueError):
    """An unknown profile name, an unreadable file or a profile missing a field."""


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path) -> dict:
    """The profile dict of a built-in name (`mt3000`, `cpu`) or of a JSON file path."""
    path = Path(name_or_path)
    if path.suffix != ".json" or not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ProfileError(f"unknown hardware profile {str(name_or_path)!r}: known profiles "
                           f"are {', '.join(known_profiles())}, or give a path to a .json file")
    try:
        profile = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"cannot read hardware profile {path}: {e}") from None
    _check_profile(profile, path)
    return profile


def _check_profile(profile: dict, path: Path) -> None:
    missing = [f for f in ("name",) + NUMBER_FIELDS if f not in profile]
    bad = [f for f in NUMBER_FIELDS if f in profile and not
           (isinstance(profile[f], (int, float)) and profile[f] > 0)]
    problems = ([f"missing {', '.join(missing)}"] if missing else []) \
        + ([f"{', '.join(bad)} must be positive numbers"] if bad else []) \
        + _simulator_problems(profile)
    if problems:
        raise ProfileError(f"hardware profile {path}: " + "; ".join(problems))


def _simulator_problems(profile: dict) -> list[str]:
    problems = []
    curve = profile.get("gemm_shape_curve", [])
    if not (isinstance(curve, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and v > 0
                                                        for v in p) for p in curve)):
        problems.append("gemm_shape_curve must be a list of [dimension, factor] pairs of "
                        "positive numbers")
    if profile.get("collective_algorithm", "ring") not in ALGORITHMS:
        problems.append(f"collective_algorithm must be one of {', '.join(ALGORITHMS)}")
    return problems
