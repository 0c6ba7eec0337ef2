"""The training strategies `ratrain plan --schedule` compares: ratrain's lifecycle
scheduling and the GPU-style strategies the RATrain paper measures it against.

A strategy is a filter on the planner's candidates (schedule, recompute policies, ZeRO
stages) plus compile options, so every one is compiled by the same passes and timed by
the same simulator; the planner searches each one's own best configuration.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ratrain.planner.candidates import Candidate


@dataclass(frozen=True)
class Strategy:
    name: str                           # the `--schedule` value
    schedule: str                       # the compiler's schedule (CompileOptions.schedule)
    policies: tuple[str, ...]           # recompute policies it may use
    zero: tuple[int, ...] | None        # ZeRO stages it may use; None: those searched
    zero3_prefetch: int | None = None   # CompileOptions.zero3_prefetch (0: gather at use)
    paper: str = ""                     # how the paper describes it

    @property
    def simulated_policy(self) -> str:
        """The policy whose candidates are compiled: auto where allowed (it recomputes
        the least that fits, so no other policy of a configuration beats it)."""
        return "auto" if "auto" in self.policies else self.policies[0]

    def allows(self, c: Candidate) -> bool:
        return (c.schedule == self.schedule and c.recompute in self.policies
                and (self.zero is None or c.zero in self.zero))

    def candidates(self, searched: list[Candidate]) -> list[Candidate]:
        """Its candidates among `searched` (generated for its schedule); a strategy with
        its own ZeRO-3 prefetch takes each ZeRO-2 candidate to ZeRO-3 with it."""
        if self.zero3_prefetch is None:
            return [c for c in searched if self.allows(c)]
        stage = self.zero[0]
        moved = [replace(c, zero=stage, zero3_prefetch=self.zero3_prefetch)
                 for c in searched if c.zero == 2 and c.dp > 1]
        return [c for c in moved if self.allows(c)]


# NOTE [strategies]: the paper (RATrain, arXiv 2606.10415) compares lifecycle scheduling
# with the strategies GPU trainers use, run on the same MT-3000 clusters. "baseline" is
# the compiler's GPU-style schedule: 1F1B with every gradient sync and parameter update
# at the step's end, and recompute (where chosen) at backward time, layer by layer. The
# GPU-style strategies keep to ZeRO 0-2 (Megatron's distributed optimizer); ZeRO-3 with
# views gathered ahead of their use is lifecycle prefetch, ratrain's; the paper's ZeRO-3
# strategy is zero3-heavy, which gathers at each use.
GPU_ZERO = (0, 1, 2)
STRATEGIES = {s.name: s for s in (
    Strategy("ratrain", "ratrain", ("auto", "full", "selective", "none"), None,
             paper="lifecycle scheduling: sync, update and prefetch of each layer placed "
                   "as soon as its gradient is complete, recompute on the forward side in "
                   "the wait for the gradient, the least recompute that fits"),
    Strategy("tuned", "baseline", ("auto", "full", "selective", "none"), GPU_ZERO,
             paper="the GPU-style schedule with its best pipeline, data-parallel, ZeRO and "
                   "recompute configuration (the strongest baseline)"),
    Strategy("backward-checkpointing", "baseline", ("full",), GPU_ZERO,
             paper="backward-time activation checkpointing: every layer's activations "
                   "recomputed right before its backward, sync and update at the step end"),
    Strategy("keep-all", "baseline", ("none",), GPU_ZERO,
             paper="no recompute: every activation kept from forward to backward"),
    Strategy("zero3-heavy", "baseline", ("auto",), (3,), zero3_prefetch=0,
             paper="ZeRO-3 (FSDP-style): parameters sharded over the DP group and "
                   "all-gathered at each use, no lifecycle prefetch"),
)}
OURS = "ratrain"
