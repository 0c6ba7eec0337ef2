"""Model configs: Hugging Face config.json dictionaries, presets, and the derived facts.

`get_config` resolves a preset name, a config.json path or a checkpoint directory and
fills the defaults a config may omit, in one place. `ModelDims` is the small frozen view
of a config that parameter shapes and layer functions are computed from.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ratrain.models.rope import RopeSpec, rope_spec

PRESET_DIR = Path(__file__).parent / "presets"
FAMILIES = ("llama", "qwen2", "baichuan")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def _config_file(name_or_path) -> Path:
    """An existing config.json (or a directory holding one) first, else a preset."""
    path = Path(os.fspath(name_or_path))
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file():
        return path
    if str(name_or_path) in preset_names():
        return PRESET_DIR / f"{name_or_path}.json"
    raise ValueError(f"unknown model {str(name_or_path)!r}: not a preset, a config.json "
                     f"or a directory holding one; presets: {', '.join(preset_names())}")


def get_config(name_or_path) -> dict:
    """The HF config dict of a preset, a config.json path or a directory, with defaults."""
    path = _config_file(name_or_path)
    with open(path) as f:
        return fill_defaults(json.load(f), source=str(path))


def fill_defaults(config: dict, source: str = "config") -> dict:
    """A copy of `config` with every field the models read present (HF defaults)."""
    c = dict(config)
    family = c.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"{source}: model_type {family!r} not supported ({', '.join(FAMILIES)})")
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("initializer_range", 0.02)
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("max_position_embeddings", c.get("model_max_length", 4096))
    c.setdefault("rope_theta", rope_spec(c, source).theta)  # refuses RoPE ratrain can't do
    _check_supported(c, source)
    return c


def _check_supported(c: dict, source: str) -> None:
    """Refuse config features the layer functions would otherwise silently ignore."""
    unsupported = {
        "tie_word_embeddings": c["tie_word_embeddings"],   # the head owns its lm_head.weight
        "hidden_act": c.get("hidden_act", "silu") != "silu",
        "attention_bias": c["model_type"] == "llama" and bool(c.get("attention_bias")),
        "use_sliding_window": bool(c.get("use_sliding_window")),
    }
    bad = [k for k, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"{source}: unsupported config fields {bad} "
                         f"({', '.join(f'{k}={c.get(k)!r}' for k in bad)})")


@dataclass(frozen=True)
class ModelDims:
    family: str                 # HF model_type: llama | qwen2 | baichuan
    vocab: int                  # vocab_size
    hidden: int                 # hidden_size
    heads: int                  # num_attention_heads (query heads)
    kv_heads: int               # num_key_value_heads
    head_dim: int               # hidden // heads
    intermediate: int           # MLP inner width
    layers: int                 # num_hidden_layers
    eps: float                  # RMSNorm epsilon
    rope: RopeSpec              # RoPE base and scaling (unused by ALiBi models)

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @property
    def alibi(self) -> bool:    # Baichuan2-13B: ALiBi instead of RoPE
        return self.family == "baichuan"

    @property
    def qkv_bias(self) -> bool:  # Qwen2: biases on q/k/v, none on o
        return self.family == "qwen2"

    @property
    def packed_qkv(self) -> bool:  # Baichuan: one W_pack [3H, H]
        return self.family == "baichuan"

    @property
    def norm_head(self) -> bool:  # Baichuan2: lm_head rows L2-normalised
        return self.family == "baichuan"


def model_dims(config: dict) -> ModelDims:
    c = fill_defaults(config)
    heads = c["num_attention_heads"]
    return ModelDims(c["model_type"], c["vocab_size"], c["hidden_size"], heads,
                     c["num_key_value_heads"], c.get("head_dim") or c["hidden_size"] // heads,
                     c["intermediate_size"], c["num_hidden_layers"], float(c["rms_norm_eps"]),
                     rope_spec(c))
