"""Hardware profiles (mt3000, cpu): per-rank compute, memory and link numbers as JSON.

`load_profile(name_or_path)` reads one into a typed Profile (profiles.py). Turning tasks
into seconds on a profile is the cost model's job (ratrain/sim/costs.py).
"""
from ratrain.hw.profiles import Profile, ProfileError, known_profiles, load_profile

__all__ = ["Profile", "ProfileError", "known_profiles", "load_profile"]
