"""ratrain.models: LLaMA-2/3, Mistral, Qwen2.5, Qwen3 and Baichuan2 as HF configs, HF-named parameters and
layer functions written with ratrain.ops (what the tracer compiles and jax.grad checks).
"""
from ratrain.models.checkpoint import load_pretrained, save_pretrained
from ratrain.models.config import (ModelDims, check_sequence_length, fill_defaults, get_config,
                                   model_dims, preset_names, validate_config)
from ratrain.models.params import count_params, init_params, param_shapes

_JAX_NAMES = ("LayerSpec", "layer_fn", "layer_specs", "logits_fn", "loss_fn")


def __getattr__(name):
    """The layer functions import JAX; load them on first use, so the runtime (which
    needs configs, parameters and checkpoints only) never imports JAX."""
    if name in _JAX_NAMES:
        from ratrain.models import layers
        return getattr(layers, name)
    raise AttributeError(f"module 'ratrain.models' has no attribute {name!r}")

__all__ = ["LayerSpec", "ModelDims", "check_sequence_length", "count_params",
           "fill_defaults", "get_config", "init_params", "layer_fn", "layer_specs",
           "load_pretrained", "logits_fn", "loss_fn", "model_dims", "param_shapes", "preset_names",
           "save_pretrained", "validate_config"]
