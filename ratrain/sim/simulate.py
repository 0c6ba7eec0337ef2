"""simulate: one training step of a compiled Program on a hardware profile.

Replays the ranks of DP replica 0, one per pipeline stage, with calls.ProfileCosts; the
other replicas run the same tasks at the same times, so their share of every DP
collective is costed from the DP degree (collectives.py) and a job of thousands of ranks
costs one pipeline to simulate. Memory comes from plan_memory's per-task timeline, laid
on the simulated times. A profile measured at several thread counts (`ratrain calibrate`)
is first narrowed to the thread count each rank of the job runs (rank_profile).
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.hw.profiles import Profile
from ratrain.hw.topology import node_of
from ratrain.sim.calls import ProfileCosts
from ratrain.sim.kernels import rank_profile  # noqa: F401  (callers import it from here)
from ratrain.sim.replay import Replay, replay


@dataclass(frozen=True)
class Simulation:
    program: object                     # the compiled Program
    profile: Profile                    # the hardware profile it ran on, narrowed
    replay: Replay                      # times of every task, compute and transfer
    rotations: tuple[float, ...] = ()   # the step of each stage speed rotation replayed
                                        # (NOTE [rank spread]); `replay` is the one nearest
                                        # their mean

    @property
    def step_time(self) -> float:
        """The replayed step, the mean over the rotations where there are several."""
        return sum(self.rotations) / len(self.rotations) if self.rotations else \
            self.replay.step_time

    @property
    def tokens_per_step(self) -> int:
        o = self.program.options
        return o.dp * o.micro_batches * o.micro_batch_size * o.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def bubble_fraction(self) -> float:
        return self.replay.bubble_fraction

    @property
    def exposed_tail(self) -> float:
        return self.replay.exposed_tail

    def stage_of(self, rank: int) -> int:
        return self.program.coords(rank)[0]

    def memory_timeline(self, rank: int) -> list[tuple[float, int]]:
        """(time, live bytes) from each task's start on: plan_memory's per-task rows."""
        rows = self.program.memory.stages[self.stage_of(rank)].timeline
        return [(span.reached, sum(row.values()))
                for span, row in zip(self.replay.spans[rank], rows)]

    def memory_peaks(self) -> dict[int, int]:
        """rank -> most bytes live at any simulated time."""
        return {rank: max((b for _, b in self.memory_timeline(rank)), default=0)
                for rank in self.replay.spans}


def simulate(program, profile: dict, *, overlap: bool = True,
             algorithm: str | None = None, steady: bool = True) -> Simulation:
    """One step of `program` (lowered, with a memory plan) on `profile`.

    overlap=False waits for every DP collective as soon as it starts (the serialized
    reference); `algorithm` (ring, tree, auto) overrides the profile's collective_algorithm;
    steady=False times one step alone instead of a step of a run (NOTE [steady state],
    sim/replay.py).
    """
    if program.memory is None or program.lowered is None:
        raise ValueError("simulate needs a compiled program (memory plan and lowered calls)")
    profile = rank_profile(profile, program.options.world_size)
    pipeline = {program.rank(stage, 0): tasks for stage, tasks in program.tasks.items()}
    node = node_of(profile)
    costs = ProfileCosts(program, profile, algorithm)
    replays = [replay(pipeline, costs.paced(paces), bandwidth=profile.link_bandwidth,
                      overlap=overlap, steady=steady, progress_share=node.progress_share,
                      kernel_slowdown=node.kernel_slowdown)
               for paces in costs.rotations]
    if len(replays) == 1:
        return Simulation(program, profile, replays[0])
    steps = tuple(r.step_time for r in replays)
    mean = sum(steps) / len(steps)
    nearest = min(replays, key=lambda r: abs(r.step_time - mean))
    return Simulation(program, profile, nearest, steps)
