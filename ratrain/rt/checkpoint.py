"""Checkpoints of a run: the model as a Hugging Face directory (config.json +
model.safetensors, loadable by --init-from and by transformers), AdamW moments in
optimizer.safetensors, and the step, data order, loss scale and skipped-step count (which
AdamW's bias correction needs) in trainer_state.json. Ranks send their (shards of) master
params and moments to rank 0, which writes a temporary directory and renames it into
place: a crash never leaves a half-written checkpoint under its name.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ratrain.atomic import replace_dir
from ratrain.rt.calls import unflatten_layer

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MOMENTS = ("exp_avg", "exp_avg_sq")     # torch.optim.AdamW's state names


def rank_state(executor) -> dict:
    """layer -> (master, m, v) of this rank's shard; nothing from replicas that only
    duplicate replica 0 (ZeRO-0)."""
    st, program = executor.state, executor.program
    if program.options.zero == 0 and st.replica != 0:
        return {}
    return {layer: tuple(st.view(slot).copy() for slot in program.state_slots(layer)[:3])
            for layer in program.stages[st.stage]}


def assemble(program, gathered: list[dict]) -> tuple[dict, dict]:
    """(params, moments) by HF name from every rank's rank_state (rank order)."""
    params, moments = {}, {}
    for layer in range(program.num_layers):
        shards = [g[layer] for g in gathered if layer in g]  # replica order
        n = program.state_slots(layer)[3]
        master, m, v = (np.concatenate([s[i] for s in shards])[:n] for i in range(3))
        params |= unflatten_layer(program, layer, master)
        exp_avg, exp_avg_sq = (unflatten_layer(program, layer, x) for x in (m, v))
        moments |= {name: (exp_avg[name], exp_avg_sq[name]) for name in exp_avg}
    return params, moments


def save_checkpoint(path: Path, config: dict, params: dict, moments: dict, state: dict) -> Path:
    """Write the checkpoint directory `path` atomically (temporary sibling, rename)."""
    from ratrain.models.checkpoint import save_pretrained
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_pretrained(staging, config, params)
        save_file({f"{name}.{key}": np.ascontiguousarray(pair[i]) for name, pair in
                   moments.items() for i, key in enumerate(MOMENTS)}, str(staging / OPTIMIZER_FILE))
        (staging / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        os.chmod(staging, 0o755)
        replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def load_checkpoint(path: str) -> tuple[dict, dict, dict]:
    """(params, moments, state) of a checkpoint written by save_checkpoint."""
    from ratrain.models.checkpoint import load_pretrained
    _, params = load_pretrained(path)
    tensors = load_file(str(Path(path) / OPTIMIZER_FILE))
    moments = {name: tuple(tensors[f"{name}.{key}"] for key in MOMENTS) for name in params}
    state = json.loads((Path(path) / STATE_FILE).read_text())
    return params, moments, state


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"
