"""RoPE as Hugging Face configs describe it: `rope_spec` reads any form transformers 4.x
or 5.x writes (top-level `rope_theta`, 4.x `rope_scaling`, 5.x `rope_parameters`) into a
small hashable RopeSpec; `inv_freq` and `attention_scaling` are the one numpy place its
math lives (ops/rope.py, the native kernels' tables and codegen all read them).
Numpy only: the runtime reads configs without importing JAX.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_THETA = 10000.0
FAMILY_THETA: dict[str, float] = {}     # none: transformers 5 defaults every family to 1e4

# Per supported rope_type: the fields it requires and the ones it may have (besides
# rope_type/type, rope_theta and partial_rotary_factor), as transformers 5.23 validates them.
REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
OPTIONAL = {
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "truncate"),
}
# original_max_position_embeddings falls back to max_position_embeddings (HF's
# standardize_rope_params) for these types
TAKES_ORIGINAL_MAX = ("llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    theta: float                          # RoPE base (rope_theta)
    rope_type: str = "default"            # default | linear | llama3 | yarn
    params: tuple = ()                    # sorted (field, value) pairs, resolved (see rope_spec)

    @property
    def scaled(self) -> bool:             # anything but plain RoPE
        return self.rope_type != "default"

    def param(self, name: str):
        return dict(self.params)[name]

    def __str__(self) -> str:
        fields = "".join(f" {k}={v!r}" for k, v in self.params)
        return f"rope[theta={self.theta!r} type={self.rope_type}{fields}]"


def op_params(spec: RopeSpec) -> dict:
    """The IR params of a rope op: `theta`, plus `type` and `scaling` unless plain RoPE
    (so plain RoPE prints `rope[theta=10000.0]`)."""
    if not spec.scaled:
        return {"theta": float(spec.theta)}
    return {"theta": float(spec.theta), "type": spec.rope_type, "scaling": spec.params}


def spec_of(theta: float, type: str = "default", scaling: tuple = ()) -> RopeSpec:
    """The RopeSpec a rope op's params describe: spec_of(**op_params(spec)) == spec."""
    return RopeSpec(float(theta), type, tuple(tuple(p) for p in scaling))


# --- reading a config -----------------------------------------------------------------

def rope_spec(config: dict, source: str = "config") -> RopeSpec:
    """The RoPE of an HF config dict in any 4.x/5.x form; ValueError (naming the field and
    value) for anything whose math ratrain would not reproduce exactly."""
    key, fields = _scaling_fields(config, source)
    where = f"{source}: {key}" if key else source
    rope_type = _rope_type(fields, where)
    theta = _theta(config, fields, where)
    _check_partial_rotary(config, fields, where)
    if rope_type not in REQUIRED:
        raise ValueError(f"{where}: rope_type={rope_type!r} is not supported "
                         f"(supported: {', '.join(REQUIRED)})")
    if rope_type in TAKES_ORIGINAL_MAX:
        fields["original_max_position_embeddings"] = _original_max(config, fields, where)
    _check_fields(rope_type, fields, where)
    resolve = {"default": lambda f, c, w: {}, "linear": _linear, "llama3": _llama3,
               "yarn": _yarn}[rope_type]
    params = resolve(fields, config, where)
    return RopeSpec(theta, rope_type, tuple(sorted(params.items())))


def _scaling_fields(config: dict, source: str) -> tuple[str, dict]:
    """The key and a copy of the scaling dict: 5.x `rope_parameters` or 4.x `rope_scaling`
    ("" and {} when there is none)."""
    new, old = config.get("rope_parameters"), config.get("rope_scaling")
    if new and old and new != old:
        raise ValueError(f"{source}: both rope_parameters={new!r} and rope_scaling={old!r} "
                         f"are given and differ; keep one")
    key = "rope_parameters" if new else "rope_scaling" if old else ""
    fields = new or old or {}
    if not isinstance(fields, dict):
        raise ValueError(f"{source}: {key}={fields!r} is not a dict")
    nested = [k for k, v in fields.items() if isinstance(v, dict)]
    if nested:
        raise ValueError(f"{source}: {key} per layer type ({', '.join(nested)}) "
                         f"are not supported")
    return key, dict(fields)


def _rope_type(fields: dict, source: str) -> str:
    """`rope_type` (5.x, and 4.x since 4.45) or `type` (older 4.x); both must agree."""
    new, old = fields.pop("rope_type", None), fields.pop("type", None)
    if new is not None and old is not None and new != old:
        raise ValueError(f"{source}: rope_type={new!r} and type={old!r} disagree")
    return new if new is not None else old if old is not None else "default"


def _theta(config: dict, fields: dict, source: str) -> float:
    """rope_theta from rope_parameters or the top level (both given: they must agree);
    the family default only when neither gives one."""
    inner, outer = fields.pop("rope_theta", None), config.get("rope_theta")
    if inner is not None and outer is not None and float(inner) != float(outer):
        raise ValueError(f"{source}.rope_theta={inner!r} and the top-level "
                         f"rope_theta={outer!r} disagree")
    theta = inner if inner is not None else outer
    if theta is None:
        return FAMILY_THETA.get(config.get("model_type"), DEFAULT_THETA)
    return _number("rope_theta", theta, source)


def _check_partial_rotary(config: dict, fields: dict, source: str) -> None:
    for value in (fields.pop("partial_rotary_factor", None),
                  config.get("partial_rotary_factor")):
        if value is not None and value != 1:
            raise ValueError(f"{source}: partial_rotary_factor={value!r} is not supported "
                             f"(ratrain rotates the whole head)")


def _original_max(config: dict, fields: dict, source: str) -> int:
    """HF: a top-level original_max_position_embeddings wins (Phi3), then the field, then
    max_position_embeddings. Two given values must agree."""
    inner = fields.get("original_max_position_embeddings")
    outer = config.get("original_max_position_embeddings")
    if inner is not None and outer is not None and inner != outer:
        raise ValueError(f"{source}.original_max_position_embeddings={inner!r} and the "
                         f"top-level original_max_position_embeddings={outer!r} disagree")
    value = outer if outer is not None else inner
    if value is None:
        value = config.get("max_position_embeddings")
    if value is None:
        raise ValueError(f"{source}: original_max_position_embeddings is missing "
                         f"(nor is max_position_embeddings given)")
    return int(_number("original_max_position_embeddings", value, source))


def _check_fields(rope_type: str, fields: dict, source: str) -> None:
    known = REQUIRED[rope_type] + OPTIONAL.get(rope_type, ())
    for name, value in sorted(fields.items()):
        if name not in known:
            raise ValueError(f"{source}: rope field {name}={value!r} is not understood for "
                             f"rope_type={rope_type!r} (known: {', '.join(known) or 'none'})")
    for name in REQUIRED[rope_type]:
        if name not in fields:
            raise ValueError(f"{source}: rope_type={rope_type!r} needs the field {name}")


def _number(name: str, value, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source}: rope field {name}={value!r} is not a number")
    return float(value)


def _linear(fields: dict, config: dict, where: str) -> dict:
    return {"factor": _number("factor", fields["factor"], where)}


def _llama3(fields: dict, config: dict, where: str) -> dict:
    out = {k: _number(k, fields[k], where) for k in REQUIRED["llama3"]}
    out["original_max_position_embeddings"] = fields["original_max_position_embeddings"]
    return out


def _yarn(fields: dict, config: dict, where: str) -> dict:
    """Resolved as transformers 5.23's _compute_yarn_parameters does: factor None means
    max_position_embeddings / original; attention_factor from mscale/mscale_all_dim when
    absent; beta_fast/beta_slow default (`or`) to 32/1; truncate to True."""
    original = fields["original_max_position_embeddings"]
    factor = fields["factor"]
    factor = (config["max_position_embeddings"] / original if factor is None
              else _number("factor", factor, where))
    attention = fields.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = fields.get("mscale"), fields.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    truncate = fields.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"{where}: rope field truncate={truncate!r} is not a bool")
    return {"factor": factor, "original_max_position_embeddings": original,
            "attention_factor": _number("attention_factor", attention, where),
            "beta_fast": _number("beta_fast", fields.get("beta_fast") or 32, where),
            "beta_slow": _number("beta_slow", fields.get("beta_slow") or 1, where),
            "truncate": truncate}


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


# --- the math -------------------------------------------------------------------------

# NOTE [RoPE tables in float32]: transformers computes inv_freq with float32 torch ops and
# the cos/sin tables as float32(cos(float32(t * inv_freq))) * attention_factor. The powers
# theta^(2i/D) here are float64 pow rounded to float32; torch's float32 pow agrees with
# that for ~99% of exponents and is 1 ulp off for the rest (its vectorised powf is not
# correctly rounded, and differs by CPU), so that 1 ulp is the contract. Every step after
# the powers is float32 in torch's order, where torch's `scalar / tensor` is
# `tensor.reciprocal() * scalar`; tests/models/test_rope_configs.py holds inv_freq to
# transformers' within 1 ulp for every type.

def inv_freq(spec: RopeSpec, head_dim: int) -> np.ndarray:
    """float32 [head_dim/2]: the rotation frequency of each dimension pair."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if spec.rope_type == "yarn":
        return _yarn_inv_freq(spec, head_dim)
    base = _base_inv_freq(spec.theta, head_dim)
    if spec.rope_type == "default":
        return base
    if spec.rope_type == "linear":
        return base / np.float32(spec.param("factor"))
    if spec.rope_type == "llama3":
        return _llama3_inv_freq(spec, base)
    raise ValueError(f"rope_type={spec.rope_type!r} is not supported")


def attention_scaling(spec: RopeSpec) -> float:
    """The factor transformers multiplies cos and sin by (yarn's attention_factor, else 1)."""
    return float(spec.param("attention_factor")) if spec.rope_type == "yarn" else 1.0


def _pos_freqs(theta: float, head_dim: int) -> np.ndarray:
    """float64 theta^(2i/D), theta as the float32 it is in torch and in the kernel."""
    return np.power(np.float64(np.float32(theta)), np.arange(0, head_dim, 2) / head_dim)


def _base_inv_freq(theta: float, head_dim: int) -> np.ndarray:
    return np.float32(1) / _pos_freqs(theta, head_dim).astype(np.float32)


def _llama3_inv_freq(spec: RopeSpec, inv: np.ndarray) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by factor, short kept, a smooth blend between."""
    f32 = np.float32
    factor, low, high = (spec.param(k) for k in ("factor", "low_freq_factor",
                                                  "high_freq_factor"))
    old_context = spec.param("original_max_position_embeddings")
    low_wavelen, high_wavelen = f32(old_context / low), f32(old_context / high)
    wavelen = (f32(1) / inv) * f32(2 * math.pi)
    scaled = np.where(wavelen > low_wavelen, inv / f32(factor), inv)
    smooth = ((f32(1) / wavelen) * f32(old_context) - f32(low)) / f32(high - low)
    smoothed = (f32(1) - smooth) * scaled / f32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_correction_range(spec: RopeSpec, dim: int) -> tuple[float, float]:
    """The dimension range blending extrapolation into interpolation (YaRN's ramp)."""
    original = spec.param("original_max_position_embeddings")

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(spec.theta))
    low, high = correction_dim(spec.param("beta_fast")), correction_dim(spec.param("beta_slow"))
    if spec.param("truncate"):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_inv_freq(spec: RopeSpec, dim: int) -> np.ndarray:
    """YaRN: interpolated (/factor) and extrapolated frequencies blended by a linear ramp
    over the dimension pairs between the beta_fast and beta_slow rotation counts."""
    f32 = np.float32
    pos_freqs = _pos_freqs(spec.theta, dim).astype(np.float32)
    extrapolation = f32(1) / pos_freqs
    interpolation = f32(1) / (pos_freqs * f32(spec.param("factor")))
    low, high = _yarn_correction_range(spec, dim)
    if low == high:
        high += 0.001               # HF: prevent a singular ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - f32(low)) / f32(high - low), 0, 1)
    extrapolation_factor = f32(1) - ramp
    return (interpolation * (f32(1) - extrapolation_factor)
            + extrapolation * extrapolation_factor).astype(np.float32)
