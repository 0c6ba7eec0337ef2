"""Periodic steps: the simulated step of M micro-batches from instances of a few.

A non-interleaved 1F1B step is a warm-up, a steady state that repeats one period per
micro-batch, and a cool-down. The planner compiles and replays instances of the step with
n, n + 1 and n + 2 micro-batches (Program.built_micro_batches; every constant of the step
stays that of M) and extends the period to M, so planning costs O(P + layers) compiles and
replays, not O(M x layers) (NOTE [periodic steps]).
"""
from __future__ import annotations

from dataclasses import dataclass

from ratrain.sim.simulate import Simulation, simulate

# NOTE [periodic steps]: with n >= P micro-batches every stage holds its most micro-batches
# in flight, so one more micro-batch adds one more steady-state round (an F, its REC, a B and
# their messages) to every stage, while the warm-up and the cool-down (the drained tail, the
# syncs, updates and prefetches) stay the same. The replay is deterministic, so once the
# rounds repeat, every later one does: the step time grows by the same amount per round and
# the exposed tail does not change. Two things can look like a repeat and are not:
# - A round may span k > 1 micro-batches: insert_recovery's auto escalates (layer,
#   micro-batch) pairs in a fixed order until the packed arena fits, and plan_memory's
#   packing cycles with the micro-batches in flight on a stage (P - s), so a stage can
#   recompute one pair more or less in some micro-batches.
# - The step can grow by less than a stage's work per micro-batch for many micro-batches
#   while that stage's idle time at the pipeline's ends absorbs the extra (LLaMA-2-7B, pp 8:
#   2.431 s per micro-batch from 11 to 16 micro-batches, 2.624 s from 24 to 32, the rate of
#   stage 0's work). That is a transient: it ends when the idle time is used up.
# So the instances n, n + 1, ... (at most WINDOW of them) must show, for some k <=
# MAX_PERIOD, one step-time growth over every k consecutive micro-batches in the last 2 k + 1
# (to PERIOD_TOLERANCE), a growth no smaller than any rank's busy time grew by, and one
# tail; else n doubles, at once when three show the transient (one growth, a rank's busy
# time growing by more: _absorbing) and the doubled window still fits. The step of M is
# then the instance with M's residue mod k plus whole rounds. Past M / 2 micro-batches
# the whole step is replayed. The busy time (the bubble) is extended the same way; each
# rank's memory peak is its largest over the window (exact when the recompute choices
# repeat too). Tested against full replays (tests/sim/test_periodic.py).
PERIOD_TOLERANCE = 1e-9                 # relative: float sums of the same costs in a new order
MAX_PERIOD = 4                          # micro-batches a repeating round may span
WINDOW = 2 * MAX_PERIOD + 1             # consecutive instances tried before n doubles


@dataclass(frozen=True)
class PeriodicSimulation:
    """One step of M micro-batches, extended from replays of instances of the step."""
    instance: Simulation                # the replay of the smallest instance used
    micro_batches: int                  # M of the step
    built: int                          # micro-batches of that instance (M if full)
    step_time: float                    # of the M micro-batches
    exposed_tail: float                 # the same for every instance
    busy: float                         # compute seconds of all replayed ranks, extended
    peaks: dict                         # rank -> bytes: its most in the window

    @property
    def program(self):
        return self.instance.program

    @property
    def tokens_per_s(self) -> float:
        return self.instance.tokens_per_step / self.step_time

    @property
    def bubble_fraction(self) -> float:
        total = len(self.peaks) * self.step_time
        return 1 - self.busy / total if total else 0.0


def _facts(sim: Simulation) -> tuple:
    """(step time, exposed tail, busy seconds by rank, peak bytes by rank)."""
    replay = sim.replay
    return (sim.step_time, sim.exposed_tail, {r: replay.busy(r) for r in replay.ends},
            sim.memory_peaks())


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= PERIOD_TOLERANCE * max(scale, 1e-30)


def _period(facts: list[tuple]) -> int | None:
    """The smallest k <= MAX_PERIOD such that the last 2 k + 1 replays (of consecutive
    instance sizes) grow by one step time every k micro-batches, no less than any rank's
    busy time grows, with one tail (NOTE [periodic steps]); None if there is none yet."""
    times, tails, busy = ([f[i] for f in facts] for i in range(3))
    j, scale = len(facts) - 1, times[-1]
    for k in range(1, MAX_PERIOD + 1):
        if j < 2 * k:
            break
        growth = [times[i] - times[i - k] for i in range(j - k, j + 1)]
        work = max(busy[i][r] - busy[i - k][r] for i in range(j - k, j + 1) for r in busy[i])
        if all(_close(g, growth[0], scale) for g in growth) and \
                growth[0] >= work - PERIOD_TOLERANCE * scale and \
                all(_close(t, tails[j], scale) for t in tails[j - 2 * k:]):
            return k
    return None


def _absorbing(facts: list[tuple]) -> bool:
    """The transient (see NOTE [periodic steps]): the last three replays grow the step by one
    amount per micro-batch but some rank's busy time by more, so its idle time is still
    absorbing the extra and no window starting here can repeat (n doubles at once)."""
    if len(facts) < 3:
        return False
    times, busy, scale = [f[0] for f in facts[-3:]], [f[2] for f in facts[-2:]], facts[-1][0]
    growth = times[2] - times[1]
    work = max(busy[1][r] - busy[0][r] for r in busy[1])
    return _close(times[1] - times[0], growth, scale) and \
        work > growth + PERIOD_TOLERANCE * scale


def _full(sim: Simulation, micro_batches: int) -> PeriodicSimulation:
    step, tail, busy, peaks = _facts(sim)
    return PeriodicSimulation(sim, micro_batches, micro_batches, step, tail,
                              sum(busy.values()), peaks)


def simulate_periodic(compile_instance, micro_batches: int, pp: int,
                      profile: dict, **how) -> PeriodicSimulation:
    """The step of `micro_batches` on `profile` (NOTE [periodic steps]).

    `compile_instance(n)`: the compiled Program holding n of the step's micro-batches
    (n == micro_batches: the step itself); it may raise, as compiling the step would.
    `pp`: pipeline stages (the first instance holds P + 3 micro-batches). `how`: the
    keywords of simulate (overlap, algorithm).
    """
    n = pp + 3
    while n + WINDOW <= micro_batches // 2:
        sims: list[Simulation] = []
        facts: list[tuple] = []
        while len(sims) < WINDOW:
            sims.append(simulate(compile_instance(n + len(sims)), profile, **how))
            facts.append(_facts(sims[-1]))
            k = _period(facts)
            if k is not None:
                return _extended(sims, facts, n, k, micro_batches)
            if _absorbing(facts) and 2 * n + WINDOW <= micro_batches // 2:
                break
        n *= 2
    return _full(simulate(compile_instance(micro_batches), profile, **how), micro_batches)


def _extended(sims, facts, n: int, k: int, micro_batches: int) -> PeriodicSimulation:
    """The step of `micro_batches` from the replays of instances n, n + 1, ..., whose
    last 2 k + 1 repeat every k micro-batches: from the one of them with M's residue."""
    j = len(facts) - 1
    base = j - (j - (micro_batches - n)) % k        # in (j - k, j], base = M - n (mod k)
    rounds = (micro_batches - n - base) // k
    (t, tail, busy, _), (t_k, _, busy_k, _) = facts[base], facts[base - k]
    busy, busy_k = sum(busy.values()), sum(busy_k.values())
    window = facts[j - 2 * k:]
    peaks = {r: max(f[3][r] for f in window) for r in facts[-1][3]}
    return PeriodicSimulation(sims[base], micro_batches, n + base, t + rounds * (t - t_k),
                              tail, busy + rounds * (busy - busy_k), peaks)
