"""ZeRO-3 prefetch figure (issue 16, item 2): Baichuan2-13B and Qwen2.5-32B on 256 mt3000
clusters in fp16 (global batch 4096 x 2048 tokens, 20 GB per rank). The planner's best
ZeRO-3 candidates (recompute auto, ratrain schedule) are compiled with --zero3-prefetch 1
(a layer view gathered one use ahead, NOTE [ZeRO-3 lifecycle]) and simulated; the best
of them is compiled again with prefetch 0 (each gather at its use, GPU style) and
simulated. Usage: python bench/zero3_prefetch.py [--clusters 256] [--candidates 3].
"""
import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paper import COMPARED, Runs, config_text, progress  # noqa: E402

from ratrain.sim import simulate  # noqa: E402
from ratrain.units import format_bytes  # noqa: E402


def best_zero3(runs: Runs, model: str, clusters: int, count: int):
    """(candidate, tokens/s, peak) of the best of the planner's first `count` feasible
    ZeRO-3 auto candidates under prefetch 1."""
    plan = runs.plan(model, clusters, simulate=False)
    rows = [r for r in plan.rows if r.zero == 3 and r.recompute == "auto" and r.feasible]
    best = None
    for row in rows[:count]:
        progress(f"{model}: compiling {config_text(row.candidate)} with prefetch 1")
        program = runs.compile(model, replace(row.candidate, zero3_prefetch=1))
        if isinstance(program, str):
            progress(f"  does not fit: {program}")
            continue
        sim = simulate(program, runs.profile)
        if best is None or sim.tokens_per_s > best[1]:
            best = (row.candidate, sim.tokens_per_s, program.memory.peak_bytes)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=256)
    ap.add_argument("--candidates", type=int, default=3, metavar="C",
                    help="ZeRO-3 candidates compiled per model (default: 3)")
    args = ap.parse_args()
    runs = Runs(args.candidates)
    print(f"ZeRO-3 on {args.clusters} mt3000 clusters, fp16, 4096 x 2048 tokens, 20 GB")
    print(f"{'model':<15} {'best ZeRO-3 plan':<52} {'prefetch 1':>12} {'prefetch 0':>12} "
          f"{'speedup':>8}")
    for model in COMPARED:
        best = best_zero3(runs, model, args.clusters, args.candidates)
        if best is None:
            print(f"{model:<15} no ZeRO-3 candidate fits")
            continue
        candidate, ahead, peak = best
        program = runs.compile(model, replace(candidate, zero3_prefetch=0))
        at_use = None if isinstance(program, str) else simulate(program, runs.profile).tokens_per_s
        text = f"{model:<15} {config_text(candidate):<52} {ahead:>12,.0f} "
        text += f"{at_use:>12,.0f} {ahead / at_use:>7.2f}x" if at_use else f"{'-':>12}"
        print(text + f"   (peak {format_bytes(peak)} with prefetch 1)")


if __name__ == "__main__":
    main()
