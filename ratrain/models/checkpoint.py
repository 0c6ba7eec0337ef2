"""Hugging Face style checkpoints: config.json + model.safetensors, or sharded
model-0000k-of-0000n.safetensors with model.safetensors.index.json (its weight_map).

Files are written to a temporary name and moved into place (os.replace), so a crash
never leaves a half-written checkpoint under the final name.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
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
    float32 (exactly). A file the library refuses is DamagedWeights, naming it."""
    out = {}
    try:
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                if names is None or name in names:
                    out[name] = f.get_tensor(name)
    except SafetensorError as e:
        raise DamagedWeights(f"{file} cannot be loaded: {e}") from None
    return {k: v.astype(np.float32) if v.dtype.name in _WIDENED else v
            for k, v in out.items()}


def _weight_map(path: Path) -> dict[str, str]:
    """tensor name -> file name: the index's weight_map, or everything in one file."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if all(isinstance(v, str) for v in weight_map.values()):
                return weight_map
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise DamagedWeights(f"{index} is not a safetensors index (no weight_map of tensor "
                             "name -> file)")
    if (path / SINGLE_FILE).is_file():
        return dict.fromkeys(safetensors_shapes(path / SINGLE_FILE), SINGLE_FILE)
    raise ValueError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


def tensor_shapes(path) -> dict[str, list[int]]:
    """name -> shape of every model tensor of a checkpoint directory, read from the
    safetensors headers only (no tensor is loaded): what a run checks a --resume or
    --init-from directory against before it compiles anything. A ValueError names a
    missing or unreadable weights file; DamagedWeights one that is cut short or that
    lacks a tensor the index puts in it (NOTE [checking a weights file])."""
    path = Path(path)
    shapes, weight_map = {}, _weight_map(path)
    for file in sorted(set(weight_map.values())):
        held = safetensors_shapes(path / file)
        missing = [name for name, f in weight_map.items() if f == file and name not in held]
        if missing:
            raise DamagedWeights(f"{path / INDEX_FILE} puts {missing[0]} in {file}, which "
                                 "does not hold it")
        shapes |= held
    return shapes


def has_weights(path) -> bool:
    """Whether directory `path` holds weights (model.safetensors or a sharded index)."""
    path = Path(path)
    return path.is_dir() and ((path / INDEX_FILE).is_file() or (path / SINGLE_FILE).is_file())


def weights_files(path) -> list[str]:
    """The names of a checkpoint directory's weights files, model.safetensors or the
    index's shards (a directory tensor_shapes has read)."""
    return sorted(set(_weight_map(Path(path)).values()))


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """name -> shape of the tensors of one .safetensors file, from its header checked
    against the file's length (NOTE [checking a weights file]); no tensor is read."""
    return {name: entry["shape"] for name, entry in read_header(file).items()}


# NOTE [checking a weights file]: a run checks every weights file it starts from (--model
# DIR's, --init-from's, --resume's model and optimizer files) before it compiles or
# writes anything, from the header and the file's length alone, so a checkpoint of many
# GB checks in milliseconds: (1) the header parses, (2) each tensor's byte range holds its
# dtype x shape, (3) the last range ends inside the file. A model.safetensors cut short (a
# copy interrupted, a full disk) used to pass a check of the header alone and fail in the
# ranks' loading with an MPI_Abort, after the run directory was written. The caller
# checks the names and shapes against the model (checkpoint_problem in
# rt/checkpoint.py); a file with a dtype this table does not know skips check (2) only.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
               "BOOL": 1}
MAX_HEADER_BYTES = 100 * 2 ** 20    # the safetensors library's own limit


class DamagedWeights(ValueError):
    """A weights file that is there but is not what a safetensors file says it is (cut
    short, or no header): the message names the file and what is wrong with it."""


def read_header(file: Path) -> dict[str, dict]:
    """The tensor entries of a .safetensors file's JSON header (an 8-byte little-endian
    length, the header, then the tensors' bytes), checked against the file (NOTE [checking
    a weights file]); DamagedWeights if they do not fit it, ValueError if it cannot be read."""
    try:
        with open(file, "rb") as f:
            file_bytes = os.fstat(f.fileno()).st_size
            size = int.from_bytes(f.read(8), "little")
            raw = f.read(size) if 0 < size <= MAX_HEADER_BYTES else None
    except OSError as e:
        raise ValueError(f"cannot read {file}: {e.strerror or e}") from None
    if file_bytes < 8 or raw is None:
        raise DamagedWeights(f"{file} is not a safetensors file (its first 8 bytes are no "
                             "header length)")
    if 8 + size > file_bytes:
        raise DamagedWeights(f"{file} is cut short: its header alone needs {8 + size:,} "
                             f"bytes, the file has {file_bytes:,}")
    entries = _header_entries(file, raw)
    _check_extents(file, entries, file_bytes - 8 - size)
    return entries


def _header_entries(file: Path, raw: bytes) -> dict[str, dict]:
    """name -> {dtype, shape, data_offsets} of a header's tensors (check 1)."""
    try:
        header = json.loads(raw)
        entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
        for entry in entries.values():
            begin, end = entry["data_offsets"]
            shape = entry["shape"]
            if not (isinstance(entry["dtype"], str) and 0 <= begin <= end and
                    all(isinstance(n, int) and n >= 0 for n in shape)):
                raise ValueError
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise DamagedWeights(f"{file} is not a safetensors file (its header does not "
                             "parse)") from None
    return entries


def _check_extents(file: Path, entries: dict[str, dict], data_bytes: int) -> None:
    """NOTE [checking a weights file], checks 2 and 3: each tensor's bytes hold its
    dtype x shape, and the data the header describes lies inside the file."""
    for name, entry in entries.items():
        begin, end = entry["data_offsets"]
        width = DTYPE_BYTES.get(entry["dtype"])
        if width is not None and end - begin != width * math.prod(entry["shape"]):
            raise DamagedWeights(
                f"{file} is damaged: its header gives {name} {end - begin:,} bytes for "
                f"{entry['dtype']} {entry['shape']} ({width * math.prod(entry['shape']):,})")
    needed = max((entry["data_offsets"][1] for entry in entries.values()), default=0)
    if needed > data_bytes:
        raise DamagedWeights(f"{file} is cut short: its tensors need {needed:,} bytes after "
                             f"the header, the file holds {data_bytes:,}")


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
