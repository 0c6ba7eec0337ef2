"""The simulator: a discrete-event replay of one pipeline's per-rank task lists.

`simulate(program, profile)` times one training step of a compiled Program on a hardware
profile (DESIGN section 7): compute streams, ports shared by pipeline messages and DP
collectives, non-blocking overlap as the runtime does it. `replay(schedule, costs)` is the
engine under it, usable with any cost model (steps.UnitCosts reproduces the dry run).
"""
from ratrain.sim.replay import Replay, replay
from ratrain.sim.simulate import Simulation, simulate
from ratrain.sim.steps import UnitCosts

__all__ = ["Replay", "Simulation", "UnitCosts", "replay", "simulate"]
