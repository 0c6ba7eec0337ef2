"""Exposed tail under the two update rules (NOTE [commit rule], passes/insert_update.py):
LLaMA-2-7B on the `mt3000` profile, fp16, sequence 2048, 20 GB per cluster, each layout
compiled with --update-rule after-norm and commit and simulated. The tail is the time
from the pipeline's last backward to the end of the steady-state step.

Usage: python bench/tail.py [PP,DP,ZERO,MBS,M ...]; default: the layouts of issue 16 at
1024 clusters (global batch 4096).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paper import Runs  # noqa: E402

from ratrain.planner import Candidate  # noqa: E402
from ratrain.sim import simulate  # noqa: E402
from ratrain.units import format_bytes  # noqa: E402

LAYOUTS = ("1,1024,3,2,2", "1,1024,2,1,4", "2,512,2,1,8", "4,256,1,1,16")
RULES = ("after-norm", "commit")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layouts", nargs="*", default=LAYOUTS,
                        help="PP,DP,ZERO,MBS,M (default: %(default)s)")
    args = parser.parse_args()
    runs = Runs(simulate_best=1)
    print(f"{'layout (pp,dp,zero,mbs,M)':<26} {'rule':<11} {'step s':>8} {'tail s':>7} "
          f"{'tokens/s':>9} {'peak':>10}")
    for layout in args.layouts:
        pp, dp, zero, mbs, m = map(int, layout.split(","))
        tails = {}
        for rule in RULES:
            c = Candidate(pp, dp, zero, mbs, m, "auto", "ratrain", update_rule=rule)
            program = runs.compile("llama2-7b", c)
            if isinstance(program, str):
                print(f"{layout:<26} {rule:<11} does not fit: {program}")
                continue
            sim = simulate(program, runs.profile)
            tails[rule] = sim.exposed_tail
            print(f"{layout:<26} {rule:<11} {sim.step_time:>8.3f} {sim.exposed_tail:>7.3f} "
                  f"{sim.tokens_per_s:>9,.0f} {format_bytes(max(sim.memory_peaks().values())):>10}")
        if len(tails) == len(RULES):
            print(f"{'':<26} after-norm / commit tail: "
                  f"{tails['after-norm'] / tails['commit']:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
