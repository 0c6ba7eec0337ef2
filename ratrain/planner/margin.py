"""How much slower than the best simulated candidate the planner's estimate may put a
candidate before it is not compiled (planner/search.py). Its own module, free of jax and
the passes, so the command line can print it in `--simulate`'s help.
"""

# NOTE [simulation margin]: the estimate has been within about 5% of the simulator on
# LLaMA-2-7B and Baichuan2-13B from 8 to 1024 mt3000 clusters, and within 10% on the
# calibrated cpu profile (it is exact for neither recompute placement, port sharing nor
# cache residency; tests/planner/test_search_rules.py, test_estimate_accuracy.py), so
# a candidate estimated more than this much slower than the best simulated one so far
# is not worth a compile; nor is one whose compute alone (Estimator.compute_bound)
# cannot beat it.
SIMULATION_MARGIN = 0.15
