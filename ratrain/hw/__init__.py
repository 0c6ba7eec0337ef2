"""Hardware profiles (mt3000, cpu): per-rank compute, memory and link numbers as JSON.

`load_profile(name_or_path)` reads one; the field table is in profiles.py. Turning tasks
into seconds on a profile is the cost model's job (ratrain/sim/costs.py).
"""
from ratrain.hw.profiles import ProfileError, known_profiles, load_profile

__all__ = ["ProfileError", "known_profiles", "load_profile"]
