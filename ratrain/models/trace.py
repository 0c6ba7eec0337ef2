"""A model into the compiler's input: every layer kind of a config traced once on abstract
shapes (ir/trace.py) and differentiated (ir/autodiff.py) into a TrainGraph
(ir/train_graph.py).
"""
from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np

from ratrain import models
from ratrain.ir.autodiff import differentiate
from ratrain.ir.graph import LayerGraph
from ratrain.ir.trace import trace_layer
from ratrain.ir.train_graph import Layer, LayerKind, TrainGraph
from ratrain.models.config import default_seq_len


# The inputs each layer kind takes besides its weights.
def _kind_inputs(kind: str, batch: int, seq: int, hidden: int, dtype: str):
    ids = jax.ShapeDtypeStruct((batch, seq), np.int32)
    h = jax.ShapeDtypeStruct((batch, seq, hidden), np.dtype(dtype))
    return {"embed": (("ids",), (ids,)), "decoder": (("h",), (h,)),
            "head": (("h", "targets"), (h, ids))}[kind]


def trace_model(config: dict, *, micro_batch_size: int = 1, seq_len: int | None = None,
                dtype: str = "float32", name: str | None = None) -> TrainGraph:
    """Trace every layer kind of `config` on abstract shapes and differentiate it."""
    seq_len = seq_len or default_seq_len(config)
    specs = models.layer_specs(config)
    shapes = models.param_shapes(config)
    kinds: dict[str, LayerKind] = {}
    for spec in specs:
        if spec.kind in kinds:
            continue
        avals = [jax.ShapeDtypeStruct(shapes[n], np.dtype(dtype)) for n in spec.param_names]
        roles, inputs = _kind_inputs(spec.kind, micro_batch_size, seq_len,
                                     int(config["hidden_size"]), dtype)
        fwd = trace_layer(models.layer_fn(config, spec.kind), f"{spec.kind} fwd",
                          spec.local_names, avals, roles, inputs)
        fwd = _name_outputs(fwd, "loss" if spec.kind == "head" else "h")
        bwd, residuals = differentiate(fwd)
        kinds[spec.kind] = LayerKind(spec.kind, fwd, bwd, residuals)
    layers = tuple(Layer(s.index, s.kind, tuple(s.param_names)) for s in specs)
    return TrainGraph(name or config.get("_name_or_path", config.get("model_type", "model")),
                      config, micro_batch_size, seq_len, dtype, kinds, layers)


def _name_outputs(graph: LayerGraph, role: str) -> LayerGraph:
    return replace(graph, output_names=(role,))
