"""TrainGraph: the whole model as layers over a few traced layer kinds.

Each kind (embed, decoder, head) is traced once with abstract shapes and differentiated
once; layers of a kind share its forward/backward graphs and differ only in which HF
parameters they bind. This is the compiler's input: passes read layers, parameter
types, residuals and costs from here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import jax
import numpy as np

from ratrain.ir.autodiff import differentiate
from ratrain.ir.graph import LayerGraph, Var
from ratrain.ir.trace import trace_layer


@dataclass(frozen=True, eq=False)  # identity: one object per traced kind
class LayerKind:
    kind: str                           # "embed", "decoder", "head"
    fwd: LayerGraph                     # params + inputs -> outputs
    bwd: LayerGraph                     # params + residuals + output cts -> cts + grads
    residuals: tuple[Var, ...]          # forward values the backward reads


@dataclass(frozen=True)
class Layer:
    index: int                          # position in the model: 0 = embed .. L+1 = head
    kind: str                           # key into TrainGraph.kinds
    param_names: tuple[str, ...]        # HF names, aligned with the kind's graph params


@dataclass(frozen=True, eq=False)  # identity: one object per trace, cheap to hash
class TrainGraph:
    name: str                           # preset or config name
    config: dict                        # HF config.json dictionary
    micro_batch_size: int               # sequences per micro-batch
    seq_len: int                        # tokens per sequence fed to the model
    dtype: str                          # compute dtype of activations and views
    kinds: dict[str, LayerKind]         # traced graphs per layer kind
    layers: tuple[Layer, ...]           # the model, in order

    def param_types(self) -> dict[str, Var]:
        """HF name -> typed Var of every parameter, in model order."""
        return {name: var for layer in self.layers
                for name, var in zip(layer.param_names, self.kinds[layer.kind].fwd.params)}

    @cached_property
    def kind_costs(self) -> dict:
        """LayerCost of each kind on one micro-batch (ratrain.ir.costs)."""
        from ratrain.ir.costs import layer_cost
        return {name: layer_cost(kind) for name, kind in self.kinds.items()}

    @cached_property
    def tied(self) -> dict[str, tuple[int, ...]]:
        """HF name -> the layers binding it, for each parameter more than one layer reads
        (tied input and output embeddings: the embed and head layers)."""
        binding: dict[str, list[int]] = {}
        for layer in self.layers:
            for name in layer.param_names:
                binding.setdefault(name, []).append(layer.index)
        return {name: tuple(ls) for name, ls in binding.items() if len(ls) > 1}

    def num_params(self) -> int:
        return sum(v.size for v in self.param_types().values())


# The inputs each layer kind takes besides its weights.
def _kind_inputs(kind: str, batch: int, seq: int, hidden: int, dtype: str):
    ids = jax.ShapeDtypeStruct((batch, seq), np.int32)
    h = jax.ShapeDtypeStruct((batch, seq, hidden), np.dtype(dtype))
    return {"embed": (("ids",), (ids,)), "decoder": (("h",), (h,)),
            "head": (("h", "targets"), (h, ids))}[kind]


def trace_model(config: dict, *, micro_batch_size: int = 1, seq_len: int | None = None,
                dtype: str = "float32", name: str | None = None) -> TrainGraph:
    """Trace every layer kind of `config` on abstract shapes and differentiate it."""
    from ratrain import models
    seq_len = seq_len or min(int(config.get("max_position_embeddings", 2048)), 2048)
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
