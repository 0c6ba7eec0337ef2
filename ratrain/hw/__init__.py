"""Hardware profiles (mt3000, cpu): per-rank compute, memory and link numbers as JSON.

`load_profile(name_or_path)` reads one; `task_cost_model` turns a Program's tasks into
seconds on it. The field table is in profiles.py.
"""
from ratrain.hw.profiles import ProfileError, known_profiles, load_profile, task_cost_model

__all__ = ["ProfileError", "known_profiles", "load_profile", "task_cost_model"]
