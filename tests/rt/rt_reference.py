"""What the runtime's end-to-end tests share: a single-process JAX reference trainer (the
whole global batch per step through jax.value_and_grad(models.loss_fn) and AdamW with
PyTorch's semantics, ratrain.optim), the tiny model they train, learnable token rows, and
running `mpiexec -n W python -m ratrain.rt`. MPI runs must reproduce the reference's loss.
"""
import json
import subprocess
import sys

import jax
import numpy as np

from ratrain import models
from ratrain.optim import AdamW, adamw_step
from tiny_model import tiny_config

CONFIG = tiny_config()
SEED = 3
OPTIMIZER = AdamW(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1)
HYPER = ["--lr", "0.01", "--lr-schedule", "constant", "--eps", "1e-6", "--weight-decay", "0.1",
         "--seed", str(SEED)]  # the reference trains at a constant lr


def reference(config: dict, seed: int, rows: np.ndarray, global_batch: int, steps: int,
              optimizer: AdamW, clip: float | None = None) -> tuple[list[float], dict]:
    """(loss of every step, final params) of training from models.init_params(config,
    seed) on the rows of a --no-shuffle run: step k (0-based) takes rows [k*G, (k+1)*G),
    wrapping. Weight decay applies to parameters of 2 or more dimensions, as in the runtime."""
    params = {k: np.array(v) for k, v in models.init_params(config, seed).items()}
    moments = {k: (np.zeros(v.size, np.float32), np.zeros(v.size, np.float32))
               for k, v in params.items()}
    loss_and_grad = jax.jit(jax.value_and_grad(models.loss_fn(config)))
    losses = []
    for step in range(1, steps + 1):
        at = ((step - 1) * global_batch + np.arange(global_batch)) % len(rows)
        loss, grads = loss_and_grad(params, rows[at].astype(np.int32))
        grads = {k: np.asarray(g, np.float32) for k, g in grads.items()}
        coef = 1.0 if clip is None else min(1.0, clip / (_global_norm(grads) + 1e-6))
        for k, p in params.items():
            decay = np.full(p.size, float(p.ndim >= 2), np.float32)
            adamw_step(optimizer, step, p.reshape(-1), grads[k].reshape(-1) * np.float32(coef),
                       *moments[k], decay)
        losses.append(float(loss))
    return losses, params


def _global_norm(grads: dict) -> float:
    return float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads.values())))


def progression_rows(n: int, seq_len: int, vocab: int) -> np.ndarray:
    """n rows of seq_len + 1 tokens, each an arithmetic progression mod vocab (random start,
    one of four strides): learnable without memorising rows, so the loss falls steadily
    over a hundred steps. Random rows are only learnt by memorising a few of them, and that
    regime amplifies fp32 rounding differences between summation orders past 1e-4."""
    rng = np.random.default_rng(0)
    start, stride = rng.integers(0, vocab, (n, 1)), rng.choice([1, 3, 5, 7], (n, 1))
    return (start + stride * np.arange(seq_len + 1)) % vocab


def write_workdir(root, config: dict, rows: int, seq_len: int):
    """`root` holding config.json and tokens.npy (progression rows) for a training test."""
    (root / "config.json").write_text(json.dumps(config))
    np.save(root / "tokens.npy", progression_rows(rows, seq_len, config["vocab_size"]))
    return root


def random_workdir(root, seq_len: int):
    """`root` holding CONFIG's config.json and 40 random token rows of seq_len + 1."""
    (root / "config.json").write_text(json.dumps(CONFIG))
    rows = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (40, seq_len + 1))
    np.save(root / "tokens.npy", rows)
    return root


def mpirun(ranks: int, *args, timeout=120) -> subprocess.CompletedProcess:
    """`mpiexec -n ranks python -m ratrain.rt *args`, output captured."""
    return subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, "-m", "ratrain.rt",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout)


def read_metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_checkpoint(a, b, ignored=("elapsed_s",)) -> None:
    """Checkpoint directories `a` and `b` hold the same files, byte for byte, except
    trainer_state.json's `ignored` keys (by default the run's wall time, which differs
    between any two runs)."""
    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    for name in names:
        x, y = (d.joinpath(name).read_bytes() for d in (a, b))
        if name == "trainer_state.json":
            x, y = ({k: v for k, v in json.loads(t).items() if k not in ignored} for t in (x, y))
        assert x == y, name
