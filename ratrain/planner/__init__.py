"""The planner: search pipeline and data-parallel degrees, ZeRO stage, micro-batching,
recompute policy and schedule for a model on N ranks under a memory budget.

Candidates (candidates.py) pass a memory screen (screen.py), the survivors are ordered
by a closed-form estimate (estimate.py), and the best few are compiled by the pass
pipeline and timed by the simulator (ratrain/sim); search.py ranks the rows.
`ratrain plan` and `ratrain compile --plan` (cli_plan.py) are its commands.
"""
from ratrain.planner.candidates import Candidate
from ratrain.planner.search import Plan, Planner, Row, Search

__all__ = ["Candidate", "Plan", "Planner", "Row", "Search"]
