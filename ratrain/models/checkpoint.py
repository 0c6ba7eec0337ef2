"""Hugging Face style checkpoints: config.json + model.safetensors, or sharded
model-0000k-of-0000n.safetensors with model.safetensors.index.json (its weight_map).

Files are written to a temporary name and moved into place (os.replace), so a crash
never leaves a half-written checkpoint under the final name.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from ratrain.models.config import fill_defaults

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"


def _replace_atomically(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_pretrained(path, config: dict, params: dict) -> Path:
    """Write config.json and model.safetensors into directory `path`; returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in params.items()}
    _replace_atomically(path / SINGLE_FILE,
                        lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    _replace_atomically(path / CONFIG_FILE, lambda tmp: tmp.write_text(config_text(config)))
    return path


def config_text(config: dict) -> str:
    """config.json as checkpoints write it."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


_WIDENED = ("bfloat16", "float16")   # HF release dtypes; our reference math is fp32


def read_safetensors(file: Path, names=None) -> dict[str, np.ndarray]:
    """The tensors of one file (only `names`, if given); bf16/fp16 tensors widen to
    float32 (exactly)."""
    out = {}
    with safe_open(str(file), framework="numpy") as f:
        for name in f.keys():
            if names is None or name in names:
                out[name] = f.get_tensor(name)
    return {k: v.astype(np.float32) if v.dtype.name in _WIDENED else v
            for k, v in out.items()}


def _weight_map(path: Path) -> dict[str, str]:
    """tensor name -> file name: the index's weight_map, or everything in one file."""
    if (path / INDEX_FILE).is_file():
        return json.loads((path / INDEX_FILE).read_text())["weight_map"]
    if (path / SINGLE_FILE).is_file():
        return dict.fromkeys(safetensors_shapes(path / SINGLE_FILE), SINGLE_FILE)
    raise ValueError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


def tensor_shapes(path) -> dict[str, list[int]]:
    """name -> shape of every model tensor of a checkpoint directory, read from the
    safetensors headers only (no tensor is loaded): what a run checks a --resume or
    --init-from directory against before it compiles anything. A ValueError names a
    missing or unreadable weights file."""
    path = Path(path)
    shapes = {}
    for file in sorted(set(_weight_map(path).values())):
        shapes |= safetensors_shapes(path / file)
    return shapes


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """name -> shape of the tensors of one .safetensors file, from its JSON header (an
    8-byte little-endian length, then the header); a ValueError if it is not one."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= 100 * 2 ** 20:
                raise ValueError("no safetensors header")
            header = json.loads(f.read(size))
            return {name: entry["shape"] for name, entry in header.items()
                    if name != "__metadata__"}
    except OSError as e:
        raise ValueError(f"cannot read {file}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{file} is not a safetensors file") from None


def load_pretrained(path, names=None) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, params) from a checkpoint directory written by us or by transformers;
    with `names`, only those tensors are read (a rank reads its stage's weights)."""
    path = Path(path)
    config = fill_defaults(json.loads((path / "config.json").read_text()), source=str(path))
    weight_map, params = _weight_map(path), {}
    if names is not None:
        tied_check = config["tie_word_embeddings"] and "model.embed_tokens.weight" in names
        wanted = set(names) | ({"lm_head.weight"} if tied_check else set())
        weight_map = {k: v for k, v in weight_map.items() if k in wanted}
    for file in sorted(set(weight_map.values())):
        params.update(read_safetensors(path / file, set(weight_map)))
    if set(params) != set(weight_map):
        missing = sorted(set(weight_map) - set(params))[:5]
        raise ValueError(f"{path}: shards do not match the index weight_map "
                         f"(missing e.g. {missing})")
    if config["tie_word_embeddings"] and "lm_head.weight" in params:
        _drop_tied_copy(path, params)
    return config, params


def _drop_tied_copy(path: Path, params: dict) -> None:
    """A tied checkpoint that still stores lm_head.weight (some tools write both): the
    copy must equal the embedding, since the model has only one tensor for both uses."""
    head, embed = params.pop("lm_head.weight"), params.get("model.embed_tokens.weight")
    if embed is None or not np.array_equal(head, embed):
        raise ValueError(f"{path}: tie_word_embeddings is true but lm_head.weight differs "
                         f"from model.embed_tokens.weight: set tie_word_embeddings false "
                         f"to train them as two matrices, or drop lm_head.weight")
