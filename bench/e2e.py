"""End-to-end training throughput (issue 5), each figure against a peer measured in the same run:
1. tokens/s of a compiled program on 1 rank x 2 threads and on PP=2 (2 ranks x 1 thread) vs a
   jax.jit train step (value_and_grad of ratrain.models.loss_fn + AdamW in jax.numpy) on the
   same 2 cores: same model, global batch and sequence length, FP32, XLA's own CPU threads;
2. ratrain in bf16 (--precision bf16: bf16 activations and views, fp32 master state) on the
   same layouts, and both against PyTorch + transformers (the model's AutoModelForCausalLM
   from the same config, torch.optim.AdamW, torch's threads = the same 2 cores) in fp32 and
   in bf16 autocast (oneDNN's bf16 kernels), when torch is installed;
3. the ratrain schedule vs --schedule baseline, PP=2, recompute auto, under a --budget that
   keeping every activation does not fit (computed from the compiled peaks, not hard-coded);
4. --pipeline-schedule zb1 vs 1f1b at PP=2 with --micro-batches, for --model (the default
   `ratrain train` layout) and for --large-model (the 58M LLaMA of the node16 measurement,
   when present), every activation kept; and that 58M LLaMA with --vocab-parallel (both:
   the LM head's and the embedding's rows on both stages, issue 43) vs plain 1f1b.
Step time is the median after warm-up steps (ratrain: step_seconds of the runtime's --metrics
JSONL; JAX: wall time to block_until_ready), best of --rounds rounds run in alternation so a
burst of load from other processes does not land on one side only.
Usage: python bench/e2e.py [--model tiny] [--large-model CONFIG] [--seq-len 256]
[--global-batch 4] [--steps 12] [--warmup 2] [--rounds 3] [--budget-at 0.5] [--keep DIR]; about 1.5 minutes on 2 idle cores."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench_common import cpu_flags

CORES = 2       # the setting: every side gets the same two cores
# the 2-stage 58M LLaMA of the zb1 comparison: the node16 measurement's model, beside the clone
LARGE_MODEL = Path(__file__).resolve().parents[2] / "shared/measurements/node16-xeon/model.json"


def fail(message):
    sys.exit(f"bench/e2e: {message}")


def run(command, env=None, cores=None):
    """Run a command pinned to `cores`; its stdout, or exit with its last error line."""
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    done = subprocess.run([str(c) for c in command], env=env, preexec_fn=pin,
                          capture_output=True, text=True)
    if done.returncode:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        last = [l for l in lines if "MPI_Abort" not in l][-1:] or lines[-1:]   # the cause
        fail(f"`{' '.join(str(c) for c in command[:4])} ...` exited {done.returncode}: {last[0]}")
    return done.stdout


def beside_python(tool):
    """The tool installed next to this Python (the mpich wheel's mpiexec, ratrain's script),
    as `ratrain run` finds mpiexec; else the one on PATH."""
    beside = Path(sys.executable).parent / tool
    found = str(beside) if beside.is_file() else shutil.which(tool)
    if found is None:
        fail(f"no {tool} found next to {sys.executable} or on PATH")
    return found


# ---- compiling -----------------------------------------------------------------------------

def compile_program(out, model, seq_len, micro_batches, micro_batch_size, *flags,
                    precision="fp32"):
    """`ratrain compile MODEL ... -o out`; the program directory and its stdout (the report)."""
    text = run([beside_python("ratrain"), "compile", model, "--seq-len", seq_len,
                "--micro-batches", micro_batches, "--micro-batch-size", micro_batch_size,
                "--precision", precision, *flags, "-o", out, "--force"])
    return out, text


def stage_peaks(program):
    return [s["peak_bytes"] for s in json.loads((program / "program.json").read_text())["stages"]]


def recovery_choice(program):
    """What insert_recovery chose: the policies with their counts and how many REC tasks run
    before the RECV_B of their micro-batch (forward side, in the wait for the gradient)."""
    text = next((program / "passes").glob("*_insert_recovery.txt")).read_text()
    choices = Counter(item.split("=")[1] for line in text.splitlines()
                      if line.startswith("recompute:") for item in line.split()[1:])
    rec = early = 0
    for line in (l for l in text.splitlines() if l.startswith("rank ")):
        tasks = line.split(":")[1].split()
        for i, task in enumerate(tasks):
            if "REC[" in task:
                stage, mb = task.split("REC[")[0], task.split("]")[1]
                rec += 1
                early += tasks.index(f"{stage}RECV_B{mb}") > i
    policies = ", ".join(f"{p} x{n}" for p, n in sorted(choices.items())) or "none (all kept)"
    return f"{policies}; {early} of {rec} REC before their RECV_B"


def mib(nbytes):
    return f"{nbytes / 2 ** 20:.2f} MiB"


# ---- running ---------------------------------------------------------------------------------

def thread_env(threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_WAIT_POLICY", "passive")     # as bench/kernels.py: no spinning waiters
    return env


def ratrain_steps(program, ranks, threads, steps, metrics, cores):
    """Step seconds of `mpiexec -n ranks python -m ratrain.rt program`, from its metrics."""
    metrics.unlink(missing_ok=True)
    run([beside_python("mpiexec"), "-n", ranks, sys.executable, "-m", "ratrain.rt", program,
         "--steps", steps, "--metrics", metrics, "--quiet"], env=thread_env(threads), cores=cores)
    return [json.loads(l)["step_seconds"] for l in metrics.read_text().splitlines() if l.strip()]


def jax_steps(args, cores):
    """Step seconds of the jax.jit peer, run in a fresh process pinned to `cores`."""
    out = run([sys.executable, __file__, "--jax-child", "--model", args.model, "--seq-len",
               args.seq_len, "--global-batch", args.global_batch, "--steps", args.steps],
              cores=cores)
    return json.loads(out.splitlines()[-1])


def torch_steps(args, cores, autocast: bool):
    """Step seconds of the PyTorch peer (fp32, or bf16 autocast), in a fresh process pinned
    to `cores`; None if torch or transformers is not installed."""
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        return None
    out = run([sys.executable, __file__, "--torch-child", "--model", args.model, "--seq-len",
               args.seq_len, "--global-batch", args.global_batch, "--steps", args.steps,
               *(["--autocast"] if autocast else [])], cores=cores)
    return json.loads(out.splitlines()[-1])


def run_torch_child(args):
    """transformers' model of the config, AdamW with the runtime's hyper-parameters, one
    step = forward (under bf16 autocast with --autocast), backward, optimizer step."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ratrain.models import get_config
    torch.set_num_threads(CORES)
    torch.manual_seed(0)
    config = {k: v for k, v in get_config(args.model).items() if not k.startswith("_")}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config),
                                             dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(args.steps):
        tokens = torch.from_numpy(rng.integers(0, config["vocab_size"],
                                               (args.global_batch, args.seq_len + 1)))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def adamw(params, grads, m, v, step, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, decay=0.1):
    """The runtime's default AdamW (ratrain/optim.py): decay only on 2+-dimensional params."""
    import jax.numpy as jnp
    new = {}
    for k, p in params.items():
        p = p - lr * decay * p if p.ndim >= 2 else p
        mk = beta1 * m[k] + (1 - beta1) * grads[k]
        vk = beta2 * v[k] + (1 - beta2) * grads[k] * grads[k]
        denom = jnp.sqrt(vk) / jnp.sqrt(1 - beta2 ** step) + eps
        new[k] = (p - lr / (1 - beta1 ** step) * mk / denom, mk, vk)
    return tuple({k: t[i] for k, t in new.items()} for i in range(3))


def run_jax_child(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from ratrain.models import get_config, init_params, loss_fn

    config = get_config(args.model)
    loss = loss_fn(config)

    def train_step(params, m, v, step, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return (*adamw(params, grads, m, v, step), value)

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    params = {k: jnp.asarray(p) for k, p in init_params(config, 0).items()}
    m, v = ({k: jnp.zeros_like(p) for k, p in params.items()} for _ in range(2))
    rng = np.random.default_rng(0)
    times = []
    for step in range(1, args.steps + 1):
        tokens = jnp.asarray(rng.integers(0, config["vocab_size"],
                                          (args.global_batch, args.seq_len + 1), np.int32))
        t0 = time.perf_counter()
        params, m, v, value = jax.block_until_ready(step_fn(params, m, v, float(step), tokens))
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))


# ---- the benchmark -----------------------------------------------------------------------------

def line(case, ours, peer, peer_name, target):
    ratio = ours / peer
    mark = "ok" if ratio >= target else "MISS"
    print(f"{case:<40} ours {ours:9,.0f} tokens/s  {peer_name} {peer:9,.0f} tokens/s  "
          f"ratio {ratio:5.2f}x  (target >= {target}x: {mark})", flush=True)


def print_tight_setup(budget, keep_all, floor, tight, report):
    """How the budget was found and what each schedule chose under it (--report, passes)."""
    print(f"# budget {mib(budget)} per rank: peak {mib(keep_all)} keeping every activation, "
          f"{mib(floor)} with full recompute; ratrain compile --report:", flush=True)
    report = report.splitlines()
    start = report.index("ratrain vs baseline (same configuration):") + 1
    print("\n".join(f"#   {l.strip()} (dry run)" for l in report[start:]), flush=True)
    for schedule, program in tight.items():
        print(f"#   {schedule:<9} recompute auto chose: {recovery_choice(program)}", flush=True)


def compile_all(args, work):
    """The programs (fp32 and bf16 on 1 rank and PP=2, and the recompute comparison's two
    under a budget from compiled peaks)."""
    g, t, m = args.global_batch, args.seq_len, args.micro_batches
    pp2 = lambda name, *flags: compile_program(work / name, args.model, t, m, g // m,
                                               "--pp", 2, *flags)
    pp1, _ = compile_program(work / "pp1", args.model, t, 1, g, "--recompute", "none")
    keep_all_program, _ = pp2("pp2", "--recompute", "none")
    bf16 = {"bf16-pp1": compile_program(work / "bf16-pp1", args.model, t, 1, g, "--recompute",
                                        "none", precision="bf16")[0],
            "bf16-pp2": compile_program(work / "bf16-pp2", args.model, t, m, g // m, "--pp", 2,
                                        "--recompute", "none", precision="bf16")[0]}
    full, _ = pp2("full", "--recompute", "full")
    keep_all, floor = max(stage_peaks(keep_all_program)), max(stage_peaks(full))
    budget = floor + int(args.budget_at * (keep_all - floor))
    if budget >= keep_all:
        fail(f"recompute saves nothing here (peak {mib(keep_all)} with every activation kept, "
             f"{mib(floor)} with full recompute): use a longer --seq-len")
    tight, reports = {}, {}
    for schedule in ("ratrain", "baseline"):
        tight[schedule], reports[schedule] = pp2(schedule, "--schedule", schedule, "--recompute",
                                                 "auto", "--budget", budget, "--report")
    print_tight_setup(budget, keep_all, floor, tight, reports["ratrain"])
    pipelines = {"zb1-pp2": pp2("zb1-pp2", "--recompute", "none", "--pipeline-schedule",
                                "zb1")[0]}
    if Path(args.large_model).is_file():
        for schedule in ("1f1b", "zb1"):
            pipelines[f"large-{schedule}"] = compile_program(
                work / f"large-{schedule}", args.large_model, t, m, g // m, "--pp", 2,
                "--recompute", "none", "--pipeline-schedule", schedule)[0]
        pipelines["large-vp"] = compile_program(  # issue 43: the head's and the embedding's
            # rows on both stages
            work / "large-vp", args.large_model, t, m, g // m, "--pp", 2, "--recompute",
            "none", "--vocab-parallel")[0]
    return pp1, keep_all_program, tight, bf16, pipelines


def cases(args, programs, cores):
    """name -> run(round) giving that run's step seconds; every ratrain run keeps its metrics."""
    pp1, pp2, tight, bf16, pipelines = programs
    layouts = {"pp1": (pp1, 1, CORES), "pp2": (pp2, 2, 1), "bf16-pp1": (bf16["bf16-pp1"], 1, CORES),
               "bf16-pp2": (bf16["bf16-pp2"], 2, 1),
               **{name: (program, 2, 1) for name, program in pipelines.items()},
               **{schedule: (program, 2, 1) for schedule, program in tight.items()}}

    def ratrain_case(name):
        program, ranks, threads = layouts[name]
        metrics = lambda r: pp1.parent / f"metrics-{name}-{r}.jsonl"
        return lambda r: ratrain_steps(program, ranks, threads, args.steps, metrics(r), cores)
    torch_cases = {} if args.no_torch else {
        "torch": lambda r: torch_steps(args, cores, False),
        "torch-bf16": lambda r: torch_steps(args, cores, True)}
    return {"jax": lambda r: jax_steps(args, cores), **torch_cases,
            **{n: ratrain_case(n) for n in layouts}}


def measure(args, programs, cores):
    """Median step seconds of every case in every round, cases alternating within a round;
    prints them all and returns each case's best round."""
    runs = cases(args, programs, cores)
    medians = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, run_case in runs.items():
            times = run_case(r)
            if times is not None:  # None: the peer is not installed
                medians[name].append(statistics.median(times[args.warmup:]))
    medians = {name: ms for name, ms in medians.items() if ms}
    print("# median step seconds per round: " + "; ".join(
        f"{name} " + " ".join(f"{m:.3f}" for m in ms) for name, ms in medians.items()), flush=True)
    return {name: min(ms) for name, ms in medians.items()}


def header(args, cores):
    return (f"# {args.model}, global batch {args.global_batch} x {args.seq_len} tokens, fp32, "
            f"cores {sorted(cores)}, {args.steps} steps per run ({args.warmup} warm-up), best of "
            f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f} | peers: jax.jit "
            f"value_and_grad + AdamW (jnp), XLA CPU threads; PyTorch + transformers, fp32 "
            f"and bf16 autocast | {cpu_flags()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="model preset (default: tiny)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--global-batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches of the PP=2 runs")
    ap.add_argument("--steps", type=int, default=12, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best is kept)")
    ap.add_argument("--budget-at", type=float, default=0.5, metavar="F", help="budget of the "
                    "schedule comparison: F of the way from the full-recompute peak to the "
                    "keep-all peak (default: 0.5, some recompute needed and auto has a choice)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="write the programs and "
                    "metrics here and keep them (default: a temporary directory)")
    ap.add_argument("--no-torch", action="store_true", help="leave the PyTorch peers out")
    ap.add_argument("--large-model", default=str(LARGE_MODEL), metavar="CONFIG",
                    help="config.json of the zb1 comparison's larger model (default: the "
                    "58M LLaMA of ../shared/measurements/node16-xeon)")
    ap.add_argument("--jax-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.jax_child:
        return run_jax_child(args)
    if args.torch_child:
        return run_torch_child(args)
    if args.global_batch % args.micro_batches or args.steps <= args.warmup:
        fail("--micro-batches must divide --global-batch and --steps exceed --warmup")
    if not 0 <= args.budget_at < 1:
        fail("--budget-at must be in [0, 1): at 1 every activation fits")
    cores = set(sorted(os.sched_getaffinity(0))[:CORES])
    if len(cores) < CORES:
        fail(f"needs {CORES} cores, this process may use {len(cores)}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.keep or scratch)
        work.mkdir(parents=True, exist_ok=True)
        print(header(args, cores), flush=True)
        best = measure(args, compile_all(args, work), cores)
    tokens = args.global_batch * args.seq_len
    rate = {name: tokens / seconds for name, seconds in best.items()}
    line("train 1 rank x 2 threads vs jax", rate["pp1"], rate["jax"], "jax", 1.0)
    line("train PP=2 (2 ranks x 1 thread) vs jax", rate["pp2"], rate["jax"], "jax", 1.0)
    best_ratrain = max(rate["pp1"], rate["pp2"])
    best_bf16 = max(rate["bf16-pp1"], rate["bf16-pp2"])
    line("ratrain bf16 (best layout) vs ratrain fp32", best_bf16, best_ratrain, "fp32", 1.0)
    if "torch" in rate:
        line("ratrain fp32 (best layout) vs torch fp32", best_ratrain, rate["torch"], "torch", 1.0)
        line("ratrain bf16 (best layout) vs torch fp32", best_bf16, rate["torch"], "torch", 1.5)
        line("ratrain bf16 (best layout) vs torch bf16 autocast", best_bf16, rate["torch-bf16"],
             "torch-bf16", 1.0)
    else:
        print("# no PyTorch peer: torch and transformers are not installed (or --no-torch)")
    line("PP=2 tight budget: ratrain vs baseline", rate["ratrain"], rate["baseline"], "baseline",
         1.2)
    line(f"PP=2 M={args.micro_batches}: zb1 vs 1f1b", rate["zb1-pp2"], rate["pp2"], "1f1b", 1.08)
    if "large-zb1" in rate:
        line(f"58M LLaMA PP=2 M={args.micro_batches}: zb1 vs 1f1b", rate["large-zb1"],
             rate["large-1f1b"], "1f1b", 1.08)
        line(f"58M LLaMA PP=2 M={args.micro_batches}: --vocab-parallel vs 1f1b",
             rate["large-vp"], rate["large-1f1b"], "1f1b", 1.0)
    else:
        print(f"# no 58M LLaMA zb1 line: {args.large_model} is not there (--large-model)")
    print(f"# total {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()[0]:.1f} "
          f"(other processes on these cores make every figure noisier)")


if __name__ == "__main__":
    main()
