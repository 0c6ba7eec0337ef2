"""Exposed tail under the two update rules (NOTE [commit rule], passes/insert_update.py):
LLaMA-2-7B on the `mt3000` profile, fp16, sequence 2048, 20 GB per cluster, each layout
compiled with --update-rule after-norm and commit and simulated. The tail is the time
from the pipeline's last backward to the end of the steady-state step.

Usage: python bench/tail.py [PP,DP,ZERO,MBS,M ...]; default: the layouts of issue 16 at
1024 clusters (global batch 4096).
"""
import argparse
import sys

from ratrain.cli_compile import load_hw, load_model, trace_for
from ratrain.passes.options import CompileOptions
from ratrain.passes.pipeline import run_pipeline
from ratrain.passes.program import Program
from ratrain.sim import simulate
from ratrain.units import format_bytes

LAYOUTS = ("1,1024,3,2,2", "1,1024,2,1,4", "2,512,2,1,8", "4,256,1,1,16")
RULES = ("after-norm", "commit")


def simulated(config: dict, name: str, layout: str, rule: str):
    pp, dp, zero, mbs, m = map(int, layout.split(","))
    options = CompileOptions(pp=pp, dp=dp, zero=zero, micro_batches=m, micro_batch_size=mbs,
                             seq_len=2048, precision="fp16", hw="mt3000", recompute="auto",
                             budget=20 * 10**9, update_rule=rule)
    program = run_pipeline(Program(trace_for(config, name, options), options),
                           verify=False, record=False)[0]
    return simulate(program, load_hw("mt3000"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layouts", nargs="*", default=LAYOUTS,
                        help="PP,DP,ZERO,MBS,M (default: %(default)s)")
    args = parser.parse_args()
    config, name = load_model("llama2-7b")
    print(f"{'layout (pp,dp,zero,mbs,M)':<26} {'rule':<11} {'step s':>8} {'tail s':>7} "
          f"{'tokens/s':>9} {'peak':>10}")
    for layout in args.layouts:
        tails = {}
        for rule in RULES:
            sim = simulated(config, name, layout, rule)
            tails[rule] = sim.exposed_tail
            print(f"{layout:<26} {rule:<11} {sim.step_time:>8.3f} {sim.exposed_tail:>7.3f} "
                  f"{sim.tokens_per_s:>9,.0f} {format_bytes(max(sim.memory_peaks().values())):>10}")
        print(f"{'':<26} after-norm / commit tail: {tails['after-norm'] / tails['commit']:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
