"""Checkpoints of a run: the model as a Hugging Face directory (the user's config.json,
model.safetensors and the tokenizer files, loadable by --init-from and by transformers),
AdamW moments in optimizer.safetensors, and the step, data order, loss scale and
skipped-step count (which AdamW's bias correction needs) in trainer_state.json. Ranks send
their (shards of) master params and moments to rank 0, which writes a temporary directory
and renames it into place: a crash never leaves a half-written checkpoint under its name.
"""
from __future__ import annotations

import json
import os
import re
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
STEP_DIR = re.compile(r"step-(\d+)")    # checkpoint_name's directories, and nothing else
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer.model", "generation_config.json")


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
    return _as_named(program, params), moments


def _as_named(program, params: dict) -> dict:
    """The tensors model.safetensors holds: exactly those param_shapes names, in its order
    (a tied model's embedding once and no lm_head.weight)."""
    from ratrain.models import param_shapes
    return {name: params[name] for name in param_shapes(program.graph.config)}


def save_checkpoint(path: Path, config: dict, params: dict, moments: dict, state: dict,
                    tokenizer: list[Path] = ()) -> Path:
    """Write the checkpoint directory `path` atomically (temporary sibling, rename), with
    copies of the `tokenizer` files (tokenizer_files)."""
    from ratrain.models.checkpoint import save_pretrained
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        for file in tokenizer:
            shutil.copyfile(file, staging / file.name)
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


def export_config(hf_config: dict) -> dict:
    """The config.json of a checkpoint: the user's dict as read (so a transformers 5.x
    config stays 5.x-shaped), with its dtype saying float32, as the master weights are."""
    config = dict(hf_config)
    dtype_keys = [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]
    return config | dict.fromkeys(dtype_keys, "float32")


def tokenizer_files(*sources: str | None) -> list[Path]:
    """The tokenizer files of the first source that has any: a directory's TOKENIZER_FILES,
    or a tokenizer.json given as a file (sources: --tokenizer, --init-from, --resume)."""
    for source in sources:
        if not source:
            continue
        path = Path(source)
        if path.is_file() and path.name in TOKENIZER_FILES:
            return [path]
        found = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
        if found:
            return found
    return []


# ---- the save directory ---------------------------------------------------------------------

def checkpoint_steps(save_dir) -> dict[int, Path]:
    """step -> directory of the complete checkpoints under save_dir: named step-N (a save
    in progress is a hidden temporary sibling) and holding trainer_state.json."""
    root = Path(save_dir)
    if not root.is_dir():
        return {}
    return {int(m.group(1)): p for p in root.iterdir()
            if (m := STEP_DIR.fullmatch(p.name)) and (p / STATE_FILE).is_file()}


def latest_checkpoint(save_dir) -> Path | None:
    """The newest complete step-N directory under save_dir, if any."""
    steps = checkpoint_steps(save_dir) if save_dir else {}
    return steps[max(steps)] if steps else None


def find_resume_checkpoint(path: str) -> Path:
    """The checkpoint --resume PATH names: PATH itself, the newest under PATH/checkpoints
    (a run directory of `ratrain train`), or the newest under PATH (a --save-dir)."""
    root = Path(path)
    if (root / STATE_FILE).is_file():
        return root
    found = latest_checkpoint(root / "checkpoints") or latest_checkpoint(root)
    if found is None:
        raise ValueError(f"--resume {path}: no checkpoint there (looked for {STATE_FILE} in "
                         f"it, and for step-N directories in it and in its checkpoints/)")
    return found


def prune_checkpoints(save_dir, keep: int, written: Path) -> list[Path]:
    """Remove all but the `keep` newest step-N checkpoints (0 = keep all), never `written`
    (the one just saved); the removed directories."""
    steps = checkpoint_steps(save_dir)
    if keep <= 0 or len(steps) <= keep:
        return []
    old = [steps[s] for s in sorted(steps)[:-keep] if steps[s] != written]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def check_save_dir(save_dir: str, flag: str = "--save-dir") -> str | None:
    """Create save_dir and write and remove a probe file in it; what went wrong, if any
    (one line), so a run finds out before it trains rather than at its first save."""
    root = Path(save_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".probe-", dir=root)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        return f"cannot write checkpoints to {flag} {save_dir}: {e.strerror or e}"
    return None
