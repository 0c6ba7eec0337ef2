"""The planner: search pipeline and data-parallel degrees, ZeRO stage, micro-batching,
recompute policy and schedule for a model on N ranks under a memory budget.

Candidates (candidates.py) pass a memory screen (screen.py), the survivors are ordered
by a closed-form estimate (estimate.py), and the best few are compiled by the pass
pipeline and timed by the simulator (ratrain/sim); search.py ranks the rows.
`ratrain plan` and `ratrain compile --plan` (cli/plan.py) are its commands.
The names below load on first use, so that the command line can read the strategy
names (strategies.py) to build its parser without importing jax.
"""
from __future__ import annotations

import importlib

_HOMES = {"Candidate": "candidates", "Plan": "search", "Planner": "search", "Row": "search",
          "Search": "search"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'ratrain.planner' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ratrain.planner.{_HOMES[name]}"), name)
