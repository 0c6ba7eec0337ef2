"""Checkpoints of a run: the model as a Hugging Face directory (the user's config.json,
model.safetensors and the tokenizer files, loadable by --init-from and by transformers),
AdamW moments in optimizer.safetensors, and the step, data order, loss scale and
skipped-step count (which AdamW's bias correction needs) in trainer_state.json. Each
stage writes its own shard files (NOTE [checkpoints without gathering]) into a temporary
directory that rank 0 renames into place: a crash never leaves a half-written checkpoint
under its name.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

from ratrain.atomic import replace_dir
from ratrain.ir.vocab import parse_shard
from ratrain.models.checkpoint import CONFIG_FILE, INDEX_FILE, config_text

STATE_FILE = "trainer_state.json"
MOMENTS = ("exp_avg", "exp_avg_sq")     # torch.optim.AdamW's state names
STEP_DIR = re.compile(r"step-(\d+)")    # checkpoint_name's directories, and nothing else
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer.model", "generation_config.json")


# NOTE [checkpoints without gathering]: every stage's replica 0 writes its own layers
# into its own shard files (model-SSSSS-of-PPPPP.safetensors and optimizer-..., or
# model.safetensors and optimizer.safetensors with one stage), streaming each tensor from
# its arena view (models/safetensors_writer.py). Under ZeRO a layer's shards are first
# gathered over the DP group, one layer at a time. So saving holds at most one layer's
# state beyond the arena, where gathering the whole model on rank 0 and serialising it
# there held the model's weights and moments twice (a qwen2.5-0.5b run at pp 2 was killed
# for memory by its first save). Rank 0 then writes the index, config.json, the tokenizer
# files and trainer_state.json and renames the staging directory into place. A tied
# weight is written by the stage of its first layer only (NOTE [tied weights]). The row
# shards of a vocabulary-parallel head (and embedding) are gathered over the pipeline
# group onto stage 0, which writes each whole weight (NOTE [vocabulary-parallel head],
# NOTE [vocabulary-parallel embedding]): the checkpoint is the unsplit run's; stage 0
# holds each weight's master and moments whole while it writes it.


def shard_file(kind: str, stage: int, stages: int) -> str:
    """`kind` (model or optimizer) file of a stage's tensors."""
    return f"{kind}.safetensors" if stages == 1 else \
        f"{kind}-{stage + 1:05d}-of-{stages:05d}.safetensors"


def stage_tensors(program, stage: int) -> list[tuple[int, str, tuple, int]]:
    """(layer, HF name, shape, offset in the layer's flat state) of every tensor the stage
    writes, in model order: each tied weight only at its first layer; a weight split in
    row shards (NOTE [vocabulary-parallel head]) whole, by the stage of its first rows
    (at the first layer binding them), unless a layer binds it whole."""
    owner: dict[str, int] = {}
    for layer in range(program.num_layers):
        for name, _ in program.layer_params(layer):
            owner.setdefault(name, layer)
    out = []
    for layer in program.stages[stage]:
        offset = 0
        for name, shape in program.layer_params(layer):
            shard = parse_shard(name)
            if shard is None and owner[name] == layer:
                out.append((layer, name, tuple(shape), offset))
            elif shard is not None and shard[1] == 0 and shard[0] not in owner and \
                    owner[name] == layer:  # tied shards (NOTE [vocabulary-parallel embedding])
                rows = int(program.graph.config["vocab_size"])
                out.append((layer, shard[0], (rows, *shape[1:]), offset))
            offset += math.prod(shape)
    return out


def write_stage(program, state, comms, staging: Path) -> None:
    """This rank's part of a checkpoint (NOTE [checkpoints without gathering]): replica 0
    of each stage writes its layers' weights and moments; every rank of a ZeRO stage
    takes part in gathering its shards, and every stage in gathering the rows of a
    vocabulary-parallel head (its first rows' stage writes them)."""
    from ratrain.models.safetensors_writer import SafetensorsWriter
    from ratrain.rt import comm
    tensors, stages = stage_tensors(program, state.stage), len(program.stages)
    writes = state.replica == 0
    if writes:
        meta = {"format": "pt"}
        model = SafetensorsWriter(staging / shard_file("model", state.stage, stages),
                                  [(n, "float32", s) for _, n, s, _ in tensors], meta)
        moments = SafetensorsWriter(
            staging / shard_file("optimizer", state.stage, stages),
            [(f"{n}.{key}", "float32", s) for _, n, s, _ in tensors for key in MOMENTS], meta)
    for layer in program.stages[state.stage]:
        slots = program.state_slots(layer)
        local = [state.view(slot) for slot in slots[:3]]
        full = local if program.options.zero == 0 else \
            comm.gather_layer_state(comms, local, slots[3])
        if _is_row_shard(program, layer):
            full = comm.gather_row_shards(comms, full or (None,) * 3)
        if not writes or full is None:
            continue
        master, m, v = full
        for _, name, shape, at in (t for t in tensors if t[0] == layer):
            n = math.prod(shape)
            model.write(name, master[at:at + n].reshape(shape))
            for key, values in zip(MOMENTS, (m, v)):
                moments.write(f"{name}.{key}", values[at:at + n].reshape(shape))
    if writes:
        model.close()
        moments.close()


def _is_row_shard(program, layer: int) -> bool:
    return any(parse_shard(name) for name, _ in program.layer_params(layer))


def finish_checkpoint(program, staging: Path, path: Path, config: dict, state: dict,
                      tokenizer: dict[str, bytes] | None = None) -> Path:
    """Rank 0, after every stage's files are in `staging`: the index (several stages),
    config.json, the tokenizer files (name -> contents, read once by `tokenizer_contents`)
    and trainer_state.json, then the rename into place."""
    stages = len(program.stages)
    if stages > 1:
        weight_map = {name: shard_file("model", s, stages)
                      for s in range(stages) for _, name, _, _ in stage_tensors(program, s)}
        total = sum(4 * math.prod(shape) for s in range(stages)
                    for _, _, shape, _ in stage_tensors(program, s))
        (staging / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    for name, contents in (tokenizer or {}).items():
        (staging / name).write_bytes(contents)
    (staging / CONFIG_FILE).write_text(config_text(config))
    (staging / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
    os.chmod(staging, 0o755)
    replace_dir(staging, path)
    return path


def staging_dir(path: Path) -> Path:
    """A new hidden sibling of checkpoint `path` to write it in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))


def load_checkpoint(path: str, names=None) -> tuple[dict, dict, dict]:
    """(params, moments, state) of a checkpoint written by a run (its one or several
    optimizer files); with `names`, only those parameters and their moments."""
    from ratrain.models.checkpoint import load_pretrained, read_safetensors
    _, params = load_pretrained(path, names)
    keys = {f"{name}.{key}" for name in params for key in MOMENTS}
    tensors = {}
    for file in sorted(Path(path).glob("optimizer*.safetensors")):
        tensors |= read_safetensors(file, keys)
    moments = {name: tuple(tensors[f"{name}.{key}"] for key in MOMENTS) for name in params}
    state = json.loads((Path(path) / STATE_FILE).read_text())
    return params, moments, state


# What must agree between a checkpoint's config.json and the model it starts, beyond the
# shapes (which the tensors' headers give): the family and the attention layout.
ARCHITECTURE_KEYS = ("model_type", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "tie_word_embeddings")


def checkpoint_problem(path, config: dict, flag: str) -> str | None:
    """What keeps checkpoint directory `path` from starting a run of the model `config`,
    as one line naming `flag` (--resume, --init-from or --model); None if it fits. Reads
    only config.json, trainer_state.json and the safetensors headers, checked against the
    files' lengths (NOTE [checking a weights file] in models/checkpoint.py), never a
    tensor, so a run can check it before it compiles or writes anything. --resume also
    needs the AdamW moments of every parameter and the trainer state."""
    from ratrain.models.checkpoint import DamagedWeights
    try:
        return _fit_problem(path, config, flag)
    except DamagedWeights as e:
        return f"{flag} {path}: {e}; copy or save it again, or pass another checkpoint"


def _fit_problem(path, config: dict, flag: str) -> str | None:
    from ratrain.models import param_shapes
    from ratrain.models.checkpoint import DamagedWeights, tensor_shapes
    try:
        shapes = tensor_shapes(path)
        saved = json.loads((Path(path) / CONFIG_FILE).read_text())
    except DamagedWeights:
        raise
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        return (f"{flag} {path} is not a checkpoint directory ({why}); pass a directory "
                f"holding {CONFIG_FILE} and model.safetensors")
    needed = param_shapes(config)
    problem = _shape_problem(shapes, needed, "the checkpoint") or \
        _architecture_problem(saved, config)
    if problem is None and flag == "--resume":
        problem = _state_problem(Path(path), needed)
    return problem and f"{flag} {path} does not fit the model: {problem}"


def _shape_problem(held: dict, needed: dict, where: str) -> str | None:
    for name, shape in needed.items():
        if name not in held:
            return f"{name} is not in {where}; the model needs it as {list(shape)}"
        if list(held[name]) != list(shape):
            return f"{name} is {list(held[name])} in {where}, the model needs {list(shape)}"
    return None


def _architecture_problem(saved: dict, config: dict) -> str | None:
    from ratrain.models import fill_defaults
    try:
        saved = fill_defaults(saved)
    except (ValueError, KeyError, TypeError) as e:
        return f"its {CONFIG_FILE} cannot be read ({e})"
    for key in ARCHITECTURE_KEYS:
        if saved.get(key) != config.get(key):
            return f"its {CONFIG_FILE} has {key} {saved.get(key)}, the model {config.get(key)}"
    return None


def _state_problem(path: Path, needed: dict) -> str | None:
    """The AdamW moments (in the optimizer files' headers) and trainer_state.json."""
    from ratrain.models.checkpoint import DamagedWeights, safetensors_shapes
    moments = {}
    try:
        for file in sorted(path.glob("optimizer*.safetensors")):
            moments |= safetensors_shapes(file)
        state = json.loads((path / STATE_FILE).read_text())
    except DamagedWeights:
        raise
    except (OSError, ValueError) as e:
        return f"its optimizer state cannot be read ({getattr(e, 'strerror', None) or e})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"its {STATE_FILE} has no step"
    return _shape_problem(moments, {f"{name}.{key}": shape for name, shape in needed.items()
                                    for key in MOMENTS}, "its optimizer files")


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
    or a tokenizer.json given as a file under any name (copied as tokenizer.json, so a
    resumed run finds it); sources: --tokenizer, --resume, --init-from, the order in which
    choose_tokenizer looks."""
    for source in sources:
        if not source:
            continue
        path = Path(source)
        if path.is_file():  # --tokenizer FILE: a tokenizer.json, whatever its name
            return [path]
        found = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
        if found:
            return found
    return []


def tokenizer_contents(files) -> dict[str, bytes]:
    """The tokenizer files a run's checkpoints carry, read once when the run starts: their
    names in a checkpoint (a --tokenizer FILE of another name is tokenizer.json) -> bytes.
    NOTE [checkpoints carry their own copy]."""
    return {(f.name if f.name in TOKENIZER_FILES else "tokenizer.json"): f.read_bytes()
            for f in files}


# NOTE [checkpoints carry their own copy]: a resumed run's tokenizer comes from the
# checkpoint it resumed from, and keep-last removes that checkpoint once newer ones exist.
# A save that copied from there failed after the rotation and lost every later save (a
# FileNotFoundError, then MPI_Abort). So the run reads the files into memory when it starts
# and every save writes them from there: no checkpoint depends on another.


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
