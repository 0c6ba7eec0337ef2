"""Model configs: Hugging Face config.json dictionaries, presets, and the derived facts.

`get_config` resolves a preset name, a config.json path or a checkpoint directory and
fills the defaults a config may omit, in one place. `ModelDims` is the small frozen view
of a config that parameter shapes and layer functions are computed from.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ratrain.models.rope import RopeSpec, rope_spec
from ratrain.program_format.options import DEFAULT_SEQ_LEN

PRESET_DIR = Path(__file__).parent / "presets"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "baichuan")
# The integer fields every config must give, and what each one is (for the error message).
REQUIRED = {"vocab_size": "the number of token ids", "hidden_size": "the model width",
            "intermediate_size": "the MLP inner width",
            "num_hidden_layers": "the number of decoder layers",
            "num_attention_heads": "the number of query heads"}
OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "max_position_embeddings",
                 "model_max_length", "sliding_window")
OPTIONAL_FLOATS = ("rms_norm_eps", "initializer_range")
OPTIONAL_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
QWEN3_HEAD_DIM = 128   # Qwen3Config's default when config.json has no head_dim
MISTRAL_WINDOW = 4096  # MistralConfig's default sliding_window


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
    text = str(name_or_path)
    reason = missing_model(text)
    if reason is not None:
        raise ValueError(f"model {text!r} {reason}")
    raise ValueError(f"unknown model {text!r}: not a preset, a config.json "
                     f"or a directory holding one; presets: {', '.join(preset_names())}")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")   # organisation/name, as the Hub spells ids


def missing_model(text: str) -> str | None:
    """Why `text`, naming no preset nor config, names no model, when it says more than
    "unknown" (a directory without config.json, a Hugging Face hub id, a path that does
    not exist); the words after the name, with the fix. None for a plain unknown name."""
    path = Path(text)
    if path.is_dir():
        return ("is a directory without config.json: point at the directory holding the "
                "model's config.json (a saved Hugging Face model or a ratrain checkpoint)")
    if HUB_ID.fullmatch(text) and not path.parent.exists():
        return ("is not a local path, and ratrain does not download models: if it is a "
                f"Hugging Face hub id, fetch it first (`hf download {text} "
                "--local-dir DIR`) and pass DIR")
    if os.sep in text or text.endswith(".json"):
        return ("does not exist: pass a preset name, a config.json or a directory holding "
                "one")
    return None


def get_config(name_or_path) -> dict:
    """The HF config dict of a preset, a config.json path or a directory, with defaults."""
    path = _config_file(name_or_path)
    with open(path) as f:
        return fill_defaults(json.load(f), source=str(path))


def fill_defaults(config: dict, source: str = "config") -> dict:
    """A copy of `config` with every field the models read present (HF defaults)."""
    c = dict(config)
    validate_config(c, source)
    family = c["model_type"]
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("initializer_range", 0.02)
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("max_position_embeddings", c.get("model_max_length", 4096))
    if family == "qwen3":
        c.setdefault("head_dim", QWEN3_HEAD_DIM)
    if family == "mistral":
        c.setdefault("sliding_window", MISTRAL_WINDOW)
    c.setdefault("rope_theta", rope_spec(c, source).theta)  # refuses RoPE ratrain can't do
    return c


def validate_config(c: dict, source: str = "config") -> None:
    """Refuse, with one line naming `source`, the field and the fix, any config the
    models would misread: unknown family, missing or mistyped fields, head counts that
    do not divide, odd RoPE head_dim, and features the layer functions do not implement.
    Reads the config as given (before defaults); absent optional fields are fine."""
    family = c.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"{source}: model_type {family!r} not supported ({', '.join(FAMILIES)})")
    for field, meaning in REQUIRED.items():
        if field not in c:
            raise ValueError(f"{source}: required field {field} is missing: add it "
                             f"({meaning}) as a positive integer")
    for field in (*REQUIRED, *OPTIONAL_INTS):
        _check_int(c, field, source)
    for field in OPTIONAL_FLOATS:
        _check_positive_number(c, field, source)
    for field in OPTIONAL_BOOLS:
        if c.get(field) not in (None, True, False):
            raise ValueError(f"{source}: {field} must be true or false, got {c[field]!r} "
                             f"({type(c[field]).__name__}); write it as a JSON boolean")
    _check_heads(c, source)
    _check_supported(c, source)


# Fields transformers may save as null, per family (null head_dim: hidden/heads).
_NULLABLE = {f: ("head_dim", "sliding_window") for f in FAMILIES} | {"qwen3": ("sliding_window",)}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(c: dict, field: str, source: str) -> None:
    """A present integer field is an int > 0 (num_hidden_layers >= 0; sliding_window and
    head_dim may be null, as transformers writes them)."""
    if field not in c or (c[field] is None and field in _NULLABLE.get(c["model_type"], ())):
        return
    v, least = c[field], 0 if field == "num_hidden_layers" else 1
    if not _is_int(v) or v < least:
        raise ValueError(f"{source}: {field} must be an integer >= {least}, got {v!r} "
                         f"({type(v).__name__}); write it as a JSON number, e.g. "
                         f"\"{field}\": {max(least, 1)}")


def _check_positive_number(c: dict, field: str, source: str) -> None:
    v = c.get(field, 1.0)
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
        raise ValueError(f"{source}: {field} must be a positive number, got {v!r} "
                         f"({type(v).__name__}); write it as a JSON number, e.g. "
                         f"\"{field}\": 1e-06")


def _check_heads(c: dict, source: str) -> None:
    """Query heads split the width (unless head_dim is given), key/value heads split the
    query heads, and RoPE rotates pairs of dims (even head_dim)."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads)
    if heads % kv:
        raise ValueError(f"{source}: num_key_value_heads={kv} does not divide "
                         f"num_attention_heads={heads}: each key/value head serves a group "
                         f"of query heads; choose a divisor of {heads}")
    head_dim = c.get("head_dim")
    if head_dim is None and c["model_type"] == "qwen3":
        head_dim = QWEN3_HEAD_DIM
    if head_dim is None:
        if hidden % heads:
            raise ValueError(f"{source}: num_attention_heads={heads} does not divide "
                             f"hidden_size={hidden}: choose a divisor of {hidden} or give "
                             f"head_dim explicitly")
        head_dim = hidden // heads
    if head_dim % 2 and c["model_type"] != "baichuan":   # Baichuan2-13B uses ALiBi
        raise ValueError(f"{source}: head_dim={head_dim} is odd (hidden_size/"
                         f"num_attention_heads unless head_dim is given): RoPE rotates pairs "
                         f"of dims; choose an even head_dim")


# What each refused field must be instead (the fix in the error message).
_SUPPORTED = {"tie_word_embeddings": "false for baichuan (NormHead normalises lm_head)",
              "hidden_act": "'silu'", "mlp_bias": "false",
              "use_sliding_window": "false", "layer_types": "all 'full_attention'",
              "attention_bias": "false for this family"}


def _check_supported(c: dict, source: str) -> None:
    """Refuse config features the layer functions would otherwise silently ignore."""
    family = c["model_type"]
    unsupported = {
        "tie_word_embeddings": family == "baichuan" and bool(c.get("tie_word_embeddings")),
        "hidden_act": c.get("hidden_act", "silu") != "silu",
        "mlp_bias": bool(c.get("mlp_bias")),
        "use_sliding_window": bool(c.get("use_sliding_window")),
        "layer_types": any(t != "full_attention" for t in c.get("layer_types") or ()),
        "attention_bias": family == "baichuan" and bool(c.get("attention_bias")),
    }
    bad = [k for k, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"{source}: unsupported config fields {bad} "
                         f"({', '.join(f'{k}={c.get(k)!r}' for k in bad)}); supported: "
                         f"{', '.join(f'{k}={_SUPPORTED[k]}' for k in bad)}")


@dataclass(frozen=True)
class ModelDims:
    family: str                 # HF model_type: llama | mistral | qwen2 | qwen3 | baichuan
    vocab: int                  # vocab_size
    hidden: int                 # hidden_size
    heads: int                  # num_attention_heads (query heads)
    kv_heads: int               # num_key_value_heads
    head_dim: int               # hidden // heads
    intermediate: int           # MLP inner width
    layers: int                 # num_hidden_layers
    eps: float                  # RMSNorm epsilon
    rope: RopeSpec              # RoPE base and scaling (unused by ALiBi models)
    tied: bool = False          # tie_word_embeddings: lm_head IS model.embed_tokens.weight
    attention_bias: bool = False  # LLaMA/Qwen3 attention_bias: biases on q, k, v and o
    sliding_window: int | None = None  # Mistral: keys further back than this are masked

    @property
    def qk_norm(self) -> bool:  # Qwen3: RMSNorm over head_dim on q and k, before RoPE
        return self.family == "qwen3"

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @property
    def alibi(self) -> bool:    # Baichuan2-13B: ALiBi instead of RoPE
        return self.family == "baichuan"

    @property
    def qkv_bias(self) -> bool:  # Qwen2: biases on q/k/v, none on o
        return self.family == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

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
                     rope_spec(c), tied=bool(c["tie_word_embeddings"]),
                     attention_bias=_attention_bias(c), sliding_window=_sliding_window(c))


def _attention_bias(c: dict) -> bool:
    """transformers reads attention_bias for LLaMA and Qwen3 only (Qwen2 hard-codes
    q/k/v biases, Mistral none), so only those families take it from the config."""
    return c["model_type"] in ("llama", "qwen3") and bool(c.get("attention_bias"))


def _sliding_window(c: dict) -> int | None:
    """Mistral masks every layer to its sliding_window; Qwen2/3 only with
    use_sliding_window (refused), so their sliding_window field is inert."""
    return c.get("sliding_window") if c["model_type"] == "mistral" else None


SEQ_LEN_HELP = f"tokens per sequence (default: {DEFAULT_SEQ_LEN}, or the model's context if smaller)"


def default_seq_len(config: dict) -> int:
    """DEFAULT_SEQ_LEN, or the model's context if that is shorter."""
    return min(DEFAULT_SEQ_LEN, int(config.get("max_position_embeddings", DEFAULT_SEQ_LEN)))


def check_sequence_length(config_or_dims, seq_len: int) -> None:
    """Refuse a sequence longer than the model's sliding window: the attention op is
    plain causal, which equals sliding-window attention only while seq_len <= window."""
    d = config_or_dims if isinstance(config_or_dims, ModelDims) else model_dims(config_or_dims)
    if d.sliding_window is not None and seq_len > d.sliding_window:
        raise ValueError(f"sequence length {seq_len} exceeds the model's sliding_window="
                         f"{d.sliding_window} (ratrain attends over the whole causal window): "
                         f"use a sequence length <= {d.sliding_window}")
